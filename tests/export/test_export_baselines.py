"""ONNX step export of the RWKV-4 and RetNet components (zoo/cells/rwkv.py, retention.py): the bare cells
and small models of both shipped recipes export, and onnxruntime agrees with PyTorch per output and per
state at batch sizes other than the traced one, over 300-step rollouts from the zero and a random state."""

import math

import pytest
import torch

from xlstm_zoo.config import BuildContext, build
from xlstm_zoo.export import export_step
from xlstm_zoo.recipe_loader import build as build_recipe, load_recipe
from xlstm_zoo.registry import registry

pytest.importorskip("onnxruntime")

ROLLOUT = 300
FIELDS = {"rwkv": ["shift", "num", "den", "m"], "rwkv_channel_mix": ["shift"], "retention": ["S"]}


def _check(result):
    report = result.report
    assert result.ok, "export failed validation:\n" + "\n".join(report.failures())
    step_rows = [r for r in report.rows if r.check.startswith("step from")]
    assert {r.batch for r in step_rows} - {result.example_batch}, "validated only at the traced batch"
    for start in ("zero", "random"):
        rows = [r for r in report.rows if r.check == f"rollout {ROLLOUT} from {start}"]
        assert len(rows) == 1 + len(result.signature.states) and all(r.ok for r in rows), rows
        assert all(math.isfinite(r.max_abs) for r in rows)


@pytest.mark.parametrize("cell", list(FIELDS))
def test_bare_cell_exports_and_matches_pytorch(tmp_path, cell):
    torch.manual_seed(0)
    config = registry.get("cell", cell).config.model_validate({"type": cell})
    module = build(config, BuildContext(dim=16, path="cell"), "cell")
    result = export_step(module, tmp_path, batch=(1, 2, 4), rollout_steps=ROLLOUT, threads=1)
    assert result.signature.state_names == [f"{cell}.{f}" for f in FIELDS[cell]]
    _check(result)


@pytest.mark.parametrize("recipe, pattern, names", [
    ("rwkv", "tc", ["block0.rwkv.shift", "block0.rwkv.num", "block0.rwkv.den", "block0.rwkv.m",
                    "block1.rwkv_channel_mix.shift"]),
    ("retnet", "r", ["block0.retention.S"]),
])
def test_recipe_model_exports_and_matches_pytorch(tmp_path, recipe, pattern, names):
    torch.manual_seed(0)
    model = build_recipe(load_recipe(recipe, ["dim=32", "vocab_size=64", f"stack.pattern={pattern}"]))
    result = export_step(model, tmp_path, batch=(1, 3, 5), rollout_steps=ROLLOUT, threads=1)
    assert result.signature.state_names == names
    _check(result)
