"""A plugin's faults end in one line before training, never a traceback from inside torch: a config validator
that raises something other than ValueError, and a cell whose output width is wrong (its conformance check
already failed at first build: training stops on that, naming the plugin)."""

import json
import re
import sys
import textwrap

import pytest

from xlstm_zoo import cli
from xlstm_zoo.plugins import status as plugin_status
from xlstm_zoo.registry import registry

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

PLUGIN = """
from typing import Literal, NamedTuple
import torch, xlstm_zoo
from pydantic import field_validator
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl

class State(NamedTuple):
    h: torch.Tensor

class PickyConfig(ZooConfig):
    type: Literal["picky"] = "picky"
    decay: float = 0.1

    @field_validator("decay")
    @classmethod
    def _check(cls, value):
        if value > 0.5:
            raise RuntimeError("decay too large for this plugin")
        return value

class NarrowConfig(ZooConfig):
    type: Literal["narrow"] = "narrow"

class Linear(Cell):
    cut = 0
    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        self.proj = torch.nn.Linear(ctx.dim, ctx.dim - self.cut)
    def init_state(self, batch, device=None):
        return State(torch.zeros(batch, self.out_dim, device=device or self._device()))
    def step(self, x_t, state, *, value_input=None):
        return self.proj(x_t), State(state.h + 0)
    def forward(self, x, state=None, *, value_input=None):
        state = self.init_state(x.shape[0], x.device) if state is None else state
        return self.proj(x), State(state.h + 0)

@xlstm_zoo.component("cell", "picky", config=PickyConfig, description="a validator that raises RuntimeError")
class Picky(Linear):
    pass

@xlstm_zoo.component("cell", "narrow", config=NarrowConfig, description="3 features short of out_dim")
class Narrow(Linear):
    cut = 3

@hookimpl
def register_components(register):
    register(Picky)
    register(Narrow)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A local plugin module on sys.path; the process-wide registry restored afterwards."""
    for name in ("XLSTM_ZOO_PLUGINS", "XLSTM_ZOO_DISABLE_PLUGINS", "XLSTM_ZOO_STRICT_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(plugin_status, "options", plugin_status.Options())
    module = f"faulty_cells_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.names("cell")
    saved = ({kind: dict(names) for kind, names in registry._components.items()}, list(registry.plugins))
    yield module
    registry._components, registry.plugins = saved
    registry._instances.clear()
    registry.version += 1
    sys.modules.pop(module, None)


def _train(tmp_path, capsys, module, cell):
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({
        "name": "plugin cell",
        "model": {"type": "causal_lm", "vocab_size": None, "dim": 16,
                  "stack": {"type": "xlstm", "pattern": "c", "blocks": {"c": {"type": "pre_up", "cell": cell}}}},
        "task": {"type": "parity", "train_lengths": [2, 4], "test_lengths": [5, 6], "eval_sequences": 8},
        "train": {"steps": 2, "batch_size": 4, "warmup_steps": 0}}))
    capsys.readouterr()
    code = cli.main(["--plugin", module, "train", str(recipe), "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    return code, ANSI.sub("", captured.err)


def test_a_plugin_validator_that_raises_is_one_line(tmp_path, capsys, plugin):
    code, err = _train(tmp_path, capsys, plugin, {"type": "picky", "decay": 0.9})
    errors = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(errors) == 1, err
    assert "model.stack.blocks.c.cell: cell 'picky' (from " + plugin in errors[0], err
    assert "its config check failed with RuntimeError: decay too large for this plugin" in errors[0]
    assert "with ValueError" in errors[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_plugin_cell_of_the_wrong_width_stops_before_training(tmp_path, capsys, plugin):
    code, err = _train(tmp_path, capsys, plugin, {"type": "narrow"})
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "the model fails before training starts" in errors[0], err
    assert f"plugin module {plugin} (no distribution): cell narrow failed conformance" in errors[0], err
    assert "expected [B, T, out_dim]=[2, 3, 16]" in errors[0], err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
