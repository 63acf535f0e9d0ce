"""Plugins: discovery, fault isolation, strict mode, `xlstm-zoo plugins`, and the example plugins for real.

Part 1 and 2 install ``plugins/examples/xlstm-zoo-mingru`` with pip into a fresh venv beside the
project (one venv for the module: creating it is the slow part) and the deliberately broken
distributions of ``plugins/examples/broken/`` into a second directory that the broken-plugin runs
put on ``PYTHONPATH`` (installed alongside, but only where a test asks for them). Part 3 tests the
loader in-process with fake distributions (a ``.dist-info`` folder with an ``entry_points.txt``
on ``sys.path``) and fresh registries, and ``xlstm_zoo.testing`` against cells with known bugs.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import NamedTuple

import pluggy
import pytest
import torch

import xlstm_zoo
from venv_helpers import ROOT, clean_env, make_venv, run, show, under
from xlstm_zoo import cli, testing
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.export import ExportWarning, missing_toolchain
from xlstm_zoo.plugins import PROJECT, PluginError, PluginWarning, call_hook, hookimpl, hookspec
from xlstm_zoo.plugins import contract
from xlstm_zoo.plugins import status as plugin_status
from xlstm_zoo.registry import Registry, registry

EXAMPLES = ROOT / "plugins" / "examples"
MINGRU = EXAMPLES / "xlstm-zoo-mingru"
BROKEN = sorted(p for p in (EXAMPLES / "broken").iterdir() if (p / "pyproject.toml").is_file())
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# The built-in cells (the LSTM family and the paper's baselines).
CORE_CELLS = {"lstm", "slstm", "mlstm", "attention", "mamba", "rwkv", "rwkv_channel_mix", "retention"}


def table_rows(text: str) -> list[list[str]]:
    """Body rows of the rich tables in ``text``; continuation lines of wrapped cells are joined."""
    rows = []
    for line in ANSI.sub("", text).splitlines():
        line = line.strip()
        if line.startswith("│") and line.endswith("│"):
            cells = [c.strip() for c in line[1:-1].split("│")]
            if any(cells[:2]) or not rows or len(rows[-1]) != len(cells):
                rows.append(cells)
            else:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return rows


def plugin_rows(text: str) -> dict[str, dict[str, str]]:
    """`xlstm-zoo plugins` rows by distribution (or plugin name for a module without one)."""
    names = ("distribution", "version", "API", "plugin", "from", "status", "registered")
    out = {}
    for row in table_rows(text):
        if len(row) >= len(names):
            row = dict(zip(names, row))
            out[row["distribution"] if row["distribution"] != "(none)" else row["plugin"]] = row
    return out


# == 1 and 2: the example distributions, installed with pip into a fresh venv ==========================

RECIPE = """\
name: minGRU plugin demo
description: the plugin's minGRU cell inside the shipped pre_up block, normalised by the plugin's DyT
model:
  type: causal_lm
  vocab_size: 32
  dim: 32
  stack:
    type: xlstm
    pattern: mm
    blocks:
      m:
        type: pre_up
        norm: dyt
        cell: {type: mingru, chunk_size: 8}
"""

BROKEN_RECIPE = RECIPE.replace("type: mingru, chunk_size: 8", "type: CELL").replace("norm: dyt", "norm: layernorm")

# Runs several `xlstm-zoo` commands in one process (same environment, one torch import), each
# command's stdout and stderr headed by a marker; prints the exit codes last.
DRIVER = textwrap.dedent("""
    import json, sys
    from xlstm_zoo import cli
    codes = []
    for i, argv in enumerate(json.loads(sys.argv[1])):
        for stream in (sys.stdout, sys.stderr):
            print(f"=== {i} ===", file=stream, flush=True)
        codes.append(cli.main(argv))
        sys.stdout.flush(); sys.stderr.flush()
    print("CODES=" + json.dumps(codes))
""")


# A few training steps of the plugin recipe (plain AdamW on a fixed random batch; the trainer
# comes with its own issue), as a tiny two-point grid over the block's norm: plugin DyT vs core.
TRAIN = textwrap.dedent("""
    import json, sys
    import torch
    import xlstm_zoo, xlstm_zoo_mingru
    from xlstm_zoo.recipe_loader import build, load_recipe
    torch.set_num_threads(1)  # a tiny model on a shared machine: threads only add contention
    runs = []
    for label, overrides in (("dyt", []), ("layernorm", ["stack.blocks.m.norm=layernorm"])):
        torch.manual_seed(0)
        recipe = load_recipe(sys.argv[1], overrides)
        model = build(recipe)
        tokens = torch.randint(0, recipe.model.vocab_size, (4, 25))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(20):
            logits, _ = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():  # the trained model still steps exactly like its parallel forward
            logits, _ = model(tokens[:, :9])
            state, diffs = model.init_state(4), []
            for t in range(9):
                step_logits, state = model.step(tokens[:, t], state)
                diffs.append((step_logits - logits[:, t]).abs().max().item())
        runs.append(dict(label=label, losses=losses, step_diff=max(diffs),
                         cells=[f"{type(b.cell).__module__}.{type(b.cell).__name__}" for b in model.stack.blocks],
                         norms=[f"{type(b.norm).__module__}.{type(b.norm).__name__}" for b in model.stack.blocks]))
    print("RESULT=" + json.dumps(dict(runs=runs, zoo=xlstm_zoo.__file__, plugin=xlstm_zoo_mingru.__file__)))
""")


def _copy_project(src: Path, dest: Path) -> Path:
    """Build from a copy: an in-tree build would leave build/ and *.egg-info in the repository."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    return dest


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The venv with xlstm-zoo-mingru installed; the broken distributions in ``broken_site``."""
    tmp = tmp_path_factory.mktemp("plugins")
    venv = make_venv(tmp, as_site_dirs=True)
    python = venv["python"]
    src = tmp / "src"
    mingru = _copy_project(MINGRU, src / MINGRU.name)
    proc = run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", mingru],
               cwd=tmp, timeout=300)
    assert proc.returncode == 0, "pip install of the example plugin failed:\n" + show(proc)
    assert len(BROKEN) >= 4, BROKEN
    broken_site = tmp / "broken_site"
    proc = run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                "--target", broken_site, *(_copy_project(p, src / p.name) for p in BROKEN)], cwd=tmp, timeout=300)
    assert proc.returncode == 0, "pip install of the broken plugins failed:\n" + show(proc)
    recipes = tmp / "recipes"
    recipes.mkdir()
    (recipes / "mingru.yaml").write_text(RECIPE)
    for cell in ("crashcell", "leakycell"):
        (recipes / f"{cell}.yaml").write_text(BROKEN_RECIPE.replace("CELL", cell))
    return dict(venv, broken_site=broken_site, recipes=recipes)


def zoo(env, *commands, broken=False, timeout=180, **extra_env):
    """Run ``xlstm-zoo`` commands in the venv, in one process; ``broken`` adds the broken plugins.

    Returns (exit codes, [(stdout, stderr) per command], the process)."""
    if broken:
        extra_env["PYTHONPATH"] = str(env["broken_site"])
    proc = run([env["python"], "-c", DRIVER, json.dumps([list(map(str, c)) for c in commands])], cwd=env["tmp"],
               env=clean_env(**extra_env), timeout=timeout)
    assert "CODES=" in proc.stdout, show(proc)
    codes = json.loads(proc.stdout.rsplit("CODES=", 1)[1])

    def sections(text):
        return re.split(r"^=== \d+ ===$", ANSI.sub("", text), flags=re.M)[1:]

    out, err = sections(proc.stdout.rsplit("CODES=", 1)[0]), sections(proc.stderr)
    assert len(out) == len(err) == len(commands), show(proc)
    return codes, list(zip(out, err)), proc


def test_example_plugin_is_installed_beside_the_project(env):
    proc = run([env["python"], "-c", "import xlstm_zoo, xlstm_zoo_mingru, importlib.metadata as m; "
                "print(xlstm_zoo.__file__); print(xlstm_zoo_mingru.__file__); print(m.version('xlstm-zoo-mingru'))"],
               cwd=env["tmp"])
    assert proc.returncode == 0, "xlstm_zoo or the plugin does not import in the venv:\n" + show(proc)
    zoo_file, plugin_file, version = proc.stdout.split()
    assert Path(zoo_file).resolve() == Path(xlstm_zoo.__file__).resolve(), \
        f"the venv should import the project's xlstm_zoo ({xlstm_zoo.__file__}), got {zoo_file}"
    assert under(plugin_file, env["site"]), f"the plugin should be installed in the venv, got {plugin_file}"
    assert version == "0.1.0"


def test_list_plugins_and_build_show_the_plugin(env):
    codes, out, proc = zoo(env, ["list", "cell"], ["list", "norm", "dy*"], ["plugins"],
                           ["build", env["recipes"] / "mingru.yaml"])
    assert codes == [0, 0, 0, 0], show(proc)
    assert "warning:" not in proc.stderr and "PluginWarning" not in proc.stderr, show(proc)
    assert "Traceback" not in proc.stderr, show(proc)

    cells = {r[1]: r for r in table_rows(out[0][0])}
    assert {"lstm", "slstm", "mlstm", "mingru"} <= set(cells), cells
    assert cells["mingru"][3] == "xlstm-zoo-mingru" and "minGRU" in cells["mingru"][2], cells["mingru"]
    assert cells["lstm"][3] == "xlstm-zoo", cells["lstm"]
    norms = table_rows(out[1][0])
    assert [(r[1], r[3]) for r in norms] == [("dyt", "xlstm-zoo-mingru")], norms

    rows = plugin_rows(out[2][0])
    assert set(rows) == {"xlstm-zoo", "xlstm-zoo-mingru"}, rows
    plugin = rows["xlstm-zoo-mingru"]
    assert (plugin["version"], plugin["plugin"], plugin["from"], plugin["status"]) == \
        ("0.1.0", "mingru", "entry point", "loaded"), plugin
    assert plugin["registered"] == "cell:mingru, norm:dyt", plugin
    core = rows["xlstm-zoo"]
    assert core["status"] == "loaded" and core["from"] == "core" and "cell:mlstm" in core["registered"], core

    summary = out[3][0]
    assert summary.count("MinGRUCell") == 2 and "total" in summary, summary


def test_recipe_with_plugin_cell_trains_in_a_tiny_grid(env):
    # strict: a clean plugin passes strict mode, including the conformance check on first build
    proc = run([env["python"], "-c", TRAIN, env["recipes"] / "mingru.yaml"], cwd=env["tmp"],
               env=clean_env(XLSTM_ZOO_STRICT_PLUGINS="1"), timeout=300)
    assert proc.returncode == 0 and "RESULT=" in proc.stdout, show(proc)
    assert "warning:" not in proc.stderr and "PluginWarning" not in proc.stderr, show(proc)
    result = json.loads(proc.stdout.rsplit("RESULT=", 1)[1])
    assert under(result["plugin"], env["site"]), result["plugin"]
    assert [r["label"] for r in result["runs"]] == ["dyt", "layernorm"]
    for r in result["runs"]:
        assert r["cells"] == ["xlstm_zoo_mingru.cell.MinGRUCell"] * 2, r["cells"]
        losses = r["losses"]
        assert len(losses) == 20 and all(l == l for l in losses), losses  # noqa: E741 (no NaN)
        assert losses[-1] < 0.7 * losses[0], f"{r['label']}: loss did not decrease over 20 steps: {losses}"
        assert r["step_diff"] < 1e-3, f"{r['label']}: step-by-step logits differ from forward by {r['step_diff']}"
    norms = {r["label"]: r["norms"] for r in result["runs"]}
    assert norms == {"dyt": ["xlstm_zoo_mingru.norm.DyTNorm"] * 2,
                     "layernorm": ["xlstm_zoo.norms.LayerNorm"] * 2}, norms


GRID_RECIPE = """\
name: mingru grid
model:
  type: causal_lm
  vocab_size: null
  dim: 16
  stack: {type: xlstm, pattern: m, blocks: {m: {type: pre_up, norm: dyt, cell: {type: mingru, chunk_size: 8}}}}
task: {type: parity, train_lengths: [3, 8], test_lengths: [9, 12], eval_sequences: 64}
train: {steps: 5, batch_size: 8, warmup_steps: 0, eval_splits: [valid]}
grid:
  variants: {dyt: {}, layernorm: {model.stack.blocks.m.norm: layernorm}}
report: {rows: variant, metric: accuracy, split: valid}
"""


def test_plugin_cell_runs_in_an_xlstm_zoo_grid(env):
    recipe = env["recipes"] / "mingru_grid.yaml"
    recipe.write_text(GRID_RECIPE)
    out = env["tmp"] / "grid_run"
    codes, outputs, proc = zoo(env, ["grid", recipe, "--out", out], XLSTM_ZOO_STRICT_PLUGINS="1")
    assert codes == [0], show(proc)
    stdout, stderr = outputs[0]
    assert "2 cells ran, 0 already done, 0 failed" in stderr, show(proc)
    assert "| dyt | " in stdout and "| layernorm | " in stdout, stdout
    results = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*/result.json"))]
    assert [r["status"] for r in results] == ["finished", "finished"], results
    assert any("mingru" in p.read_text() for p in (out / "cells").glob("*/recipe.yaml"))


def test_disable_env_hides_installed_plugins(env):
    codes, out, proc = zoo(env, ["list", "cell"], ["plugins"], XLSTM_ZOO_DISABLE_PLUGINS="1")
    assert codes == [0, 0], show(proc)
    assert {r[1] for r in table_rows(out[0][0])} == CORE_CELLS, out[0][0]
    rows = plugin_rows(out[1][0])
    assert rows["xlstm-zoo-mingru"]["status"] == "disabled: XLSTM_ZOO_DISABLE_PLUGINS=1", rows
    assert rows["xlstm-zoo-mingru"]["registered"] == "-" and rows["xlstm-zoo"]["status"] == "loaded", rows


LOAD_FAILURES = {  # distribution -> what its one warning says
    "xlstm-zoo-broken-import": ["failed to import xlstm_zoo_broken_import", "RuntimeError",
                                "fails at import, on purpose", "xlstm_zoo_broken_import.py:"],
    "xlstm-zoo-broken-hook": ["register_components raised ValueError", "raises, on purpose",
                              "none of its components are registered"],
    "xlstm-zoo-broken-registration": ["norm 'plainnorm'", "pydantic BaseModel"],
}


def test_broken_plugins_warn_once_each_and_the_good_one_works(env):
    crash, leaky = env["recipes"] / "crashcell.yaml", env["recipes"] / "leakycell.yaml"
    codes, out, proc = zoo(env, ["plugins"], ["list", "cell"], ["build", env["recipes"] / "mingru.yaml"],
                           ["build", crash], ["build", leaky], ["build", leaky], broken=True)
    assert codes == [0, 0, 0, 2, 0, 0], show(proc)
    assert "Traceback" not in proc.stderr, show(proc)

    # loading: one warning per failure, naming distribution, version and error
    load_warnings = [line for line in out[0][1].splitlines() if line.startswith("warning:")]
    assert len(load_warnings) == 4, "\n".join(load_warnings)
    for dist, needles in LOAD_FAILURES.items():
        mine = [w for w in load_warnings if f"plugin {dist} 0.1.0:" in w]
        assert len(mine) == (2 if dist.endswith("registration") else 1), (dist, load_warnings)
        for needle in needles:
            assert any(needle in w for w in mine), f"{dist}: {needle!r} not in its warning: {mine}"
    conflict = next(w for w in load_warnings if "cell 'lstm'" in w)
    assert "already registered by xlstm-zoo 0.1.0" in conflict and "xlstm-zoo-broken-registration 0.1.0" in conflict \
        and "override=True" in conflict, conflict

    rows = plugin_rows(out[0][0])
    assert rows["xlstm-zoo-mingru"]["status"] == "loaded", rows["xlstm-zoo-mingru"]
    assert rows["xlstm-zoo-mingru"]["registered"] == "cell:mingru, norm:dyt"
    for dist, needles in LOAD_FAILURES.items():
        assert rows[dist]["version"] == "0.1.0" and rows[dist]["status"].startswith("failed: "), rows[dist]
        assert needles[0] in rows[dist]["status"], rows[dist]
        assert rows[dist]["registered"] == "-", rows[dist]  # nothing half-registered
    assert rows["xlstm-zoo-broken-cells"]["status"] == "loaded"  # its problems show when its cells are built
    cells = {r[1]: r[3] for r in table_rows(out[1][0])}
    assert cells == {**dict.fromkeys(CORE_CELLS, "xlstm-zoo"), "mingru": "xlstm-zoo-mingru",
                     "crashcell": "xlstm-zoo-broken-cells", "leakycell": "xlstm-zoo-broken-cells"}, cells

    # the good plugin's recipe builds despite its broken neighbours
    assert out[2][0].count("MinGRUCell") == 2 and not out[2][1].strip(), out[2]
    # a crashing builder: one line naming the plugin, not a traceback from inside it
    err_lines = [line for line in out[3][1].splitlines() if line.strip()]
    assert len(err_lines) == 1 and err_lines[0].startswith("error: plugin xlstm-zoo-broken-cells 0.1.0:"), err_lines
    for needle in ("cell 'crashcell'", "(at model.stack.blocks.m.cell)", "ZeroDivisionError", "on purpose"):
        assert needle in err_lines[0], err_lines[0]
    # a cell failing conformance: built, with one warning on its first build only
    leaky_warnings = [line for line in out[4][1].splitlines() if line.strip()]
    assert len(leaky_warnings) == 1 and leaky_warnings[0].startswith("warning:"), leaky_warnings
    for needle in ("plugin xlstm-zoo-broken-cells 0.1.0", "cell 'leakycell'", "check_cell", "two halves != whole"):
        assert needle in leaky_warnings[0], leaky_warnings[0]
    assert "LeakyCell" in out[4][0] and "LeakyCell" in out[5][0]
    assert not out[5][1].strip(), f"second build warned again: {out[5][1]}"


@pytest.mark.parametrize("how", ["env", "flag"])
def test_strict_mode_turns_plugin_warnings_into_errors(env, how):
    args = ["--strict-plugins", "list", "cell"] if how == "flag" else ["list", "cell"]
    extra = {"XLSTM_ZOO_STRICT_PLUGINS": "1"} if how == "env" else {}
    proc = run([env["python"], "-m", "xlstm_zoo.cli", *args], cwd=env["tmp"],
               env=clean_env(PYTHONPATH=str(env["broken_site"]), **extra))
    assert proc.returncode == 2, show(proc)
    lines = [line for line in ANSI.sub("", proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, show(proc)
    # distributions load in name order: broken-hook is the first to fail
    assert lines[0].startswith("error: plugin xlstm-zoo-broken-hook 0.1.0: register_components raised ValueError"), \
        lines[0]
    assert "strict" in lines[0] and "mingru" not in proc.stdout, show(proc)


# == 3. the loader in-process: fake distributions, fresh registries ====================================

NORM_PLUGIN = """
from typing import Literal
import torch
import xlstm_zoo
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl

class Config(ZooConfig):
    type: Literal["{name}"] = "{name}"

@xlstm_zoo.component("norm", "{name}", config=Config, description="scales by {scale}")
class Norm(torch.nn.Module):
    def __init__(self, config, ctx):
        super().__init__()

    def forward(self, x):
        return x * {scale}

@hookimpl
def register_components(register):
    register(Norm{extra})
"""


@pytest.fixture(autouse=True)
def _no_plugin_settings(monkeypatch):
    for name in ("XLSTM_ZOO_PLUGINS", "XLSTM_ZOO_DISABLE_PLUGINS", "XLSTM_ZOO_STRICT_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(plugin_status, "options", plugin_status.Options())


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """``fake(source, dist=None, version=None) -> module``: a plugin module on ``sys.path``; with
    ``dist``, also an installed distribution exposing it through the ``xlstm_zoo`` entry point."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def make(source, dist=None, version="1.0", module=None):
        module = module or f"fake_plugin_{len(made)}_{abs(hash(str(tmp_path))) % 10**8}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        if dist:
            info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
            (info / "entry_points.txt").write_text(f"[{PROJECT}]\n{dist.replace('-', '_')} = {module}\n")
        importlib.invalidate_caches()
        made.append(module)
        return module

    yield make
    for module in made:
        sys.modules.pop(module, None)


def load(**kwargs) -> tuple[Registry, list[warnings.WarningMessage]]:
    """A fresh registry, loaded (core + the fakes); and the warnings loading gave."""
    reg = Registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg.names("norm")
    return reg, [w for w in caught if issubclass(w.category, PluginWarning)]


def info_of(reg, name):
    return next(p for p in reg.plugins if name in (p.distribution, p.name))


def test_local_module_from_env_var_and_plugin_option(fake, monkeypatch):
    env_mod = fake(NORM_PLUGIN.format(name="envnorm", scale=2.0, extra=""))
    opt_mod = fake(NORM_PLUGIN.format(name="optnorm", scale=3.0, extra=""))
    monkeypatch.setenv("XLSTM_ZOO_PLUGINS", env_mod)
    plugin_status.options.modules = [opt_mod]  # what `xlstm-zoo --plugin MODULE` sets
    reg, caught = load()
    assert not caught, [str(w.message) for w in caught]
    assert {"envnorm", "optnorm"} <= set(reg.names("norm"))
    entry = reg.get("norm", "envnorm")
    assert entry.source == env_mod and entry.version is None  # a local module: no distribution
    assert [(p.name, p.origin, p.status, p.registered) for p in reg.plugins[1:]] == [
        (env_mod, "XLSTM_ZOO_PLUGINS", "loaded", ["norm:envnorm"]), (opt_mod, "--plugin", "loaded", ["norm:optnorm"])]
    assert reg.plugins[0].name == "xlstm-zoo" and reg.plugins[0].origin == "core"
    norm = entry.builder(entry.default_config(), BuildContext(dim=4))  # guarded, and checked on first build
    assert torch.equal(norm(torch.ones(2, 4)), torch.full((2, 4), 2.0))
    assert info_of(reg, env_mod).checks == {"norm:envnorm": "passed"}


def test_conflict_between_two_plugins_names_both_distributions(fake):
    fake(NORM_PLUGIN.format(name="twin", scale=2.0, extra=""), dist="fake-a", version="1.0")
    fake(NORM_PLUGIN.format(name="twin", scale=3.0, extra=""), dist="fake-b", version="2.0")
    reg, caught = load()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    for needle in ("plugin fake-b 2.0", "norm 'twin' is already registered by fake-a 1.0", "fake-b 2.0 registers it",
                   "override=True"):
        assert needle in message, message
    assert reg.get("norm", "twin").source == "fake-a" and reg.get("norm", "twin").version == "1.0"
    assert info_of(reg, "fake-a").status == "loaded"
    b = info_of(reg, "fake-b")
    assert b.status == "failed" and "fake-a 1.0" in b.reason and b.registered == []


def test_override_is_deliberate_and_order_independent(fake):
    fake(NORM_PLUGIN.format(name="twin", scale=2.0, extra=""), dist="fake-a")
    fake(NORM_PLUGIN.format(name="twin", scale=3.0, extra=", override=True"), dist="fake-b", version="2.0")
    fake(NORM_PLUGIN.format(name="layernorm", scale=4.0, extra=", override=True"), dist="fake-c")
    reg, caught = load()
    assert not caught, [str(w.message) for w in caught]
    assert reg.get("norm", "twin").source == "fake-b" and info_of(reg, "fake-b").overrides == ["norm:twin"]
    assert reg.get("norm", "layernorm").source == "fake-c", "a plugin may override core, deliberately"


def test_override_wins_even_when_it_loads_first(fake):
    fake(NORM_PLUGIN.format(name="twin", scale=3.0, extra=", override=True"), dist="fake-a")
    fake(NORM_PLUGIN.format(name="twin", scale=2.0, extra=""), dist="fake-b", version="2.0")
    reg, caught = load()
    assert not caught, [str(w.message) for w in caught]
    assert reg.get("norm", "twin").source == "fake-a"
    assert info_of(reg, "fake-b").registered == ["norm:twin (overridden by fake-a 1.0)"]


def test_strict_mode_raises_and_leaves_no_half_loaded_registry(fake, monkeypatch):
    fake(NORM_PLUGIN.format(name="twin", scale=2.0, extra=""), dist="fake-a")
    fake(NORM_PLUGIN.format(name="twin", scale=3.0, extra=""), dist="fake-b", version="2.0")
    monkeypatch.setenv("XLSTM_ZOO_STRICT_PLUGINS", "1")
    reg = Registry()
    for _ in range(2):  # not loaded after the failure: the next lookup fails the same way
        with pytest.raises(PluginError, match=r"plugin fake-b 2\.0: norm 'twin' is already registered by fake-a 1\.0"):
            reg.names("norm")
        assert not reg.loaded and reg.plugins == []
    monkeypatch.delenv("XLSTM_ZOO_STRICT_PLUGINS")
    plugin_status.options.strict = True  # the --strict-plugins flag
    with pytest.raises(PluginError, match="strict plugin mode"):
        reg.names("norm")
    plugin_status.options.strict = None
    with pytest.warns(PluginWarning, match="fake-b 2.0"):
        assert "twin" in reg.names("norm")


def test_disable_all_or_by_name(fake, monkeypatch):
    a = fake(NORM_PLUGIN.format(name="anorm", scale=2.0, extra=""), dist="fake-a")
    b = fake(NORM_PLUGIN.format(name="bnorm", scale=2.0, extra=""), dist="fake-b")
    monkeypatch.setenv("XLSTM_ZOO_DISABLE_PLUGINS", "1")
    reg, caught = load()
    assert not caught and a not in sys.modules and b not in sys.modules, "disabled plugins are not even imported"
    assert {"anorm", "bnorm"}.isdisjoint(reg.names("norm")) and "layernorm" in reg.names("norm")
    assert [p.status for p in reg.plugins] == ["loaded", "disabled", "disabled"]
    monkeypatch.setenv("XLSTM_ZOO_DISABLE_PLUGINS", "fake_b")  # by name, normalised
    reg, caught = load()
    assert "anorm" in reg.names("norm") and "bnorm" not in reg.names("norm")
    assert info_of(reg, "fake-b").status == "disabled" and info_of(reg, "fake-a").status == "loaded"


def test_hook_with_fewer_arguments_than_a_newer_spec_still_works(fake, monkeypatch):
    class NewerSpecs:  # a future xlstm-zoo whose hook hands plugins one more argument
        @hookspec
        def register_components(self, register, zoo_version):
            """..."""

    old = importlib.import_module(fake(NORM_PLUGIN.format(name="oldnorm", scale=2.0, extra="")))

    class NoArgs:
        @staticmethod
        @hookimpl
        def register_components():
            calls.append("no args")

    calls = []
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(NewerSpecs)
    pm.register(old)  # pluggy accepts an implementation naming a subset of the spec's arguments
    pm.register(NoArgs)
    impls = pm.hook.register_components.get_hookimpls()
    for impl in impls:  # the loader's per-plugin call
        call_hook(impl, register=calls.append, zoo_version="9.9")
    assert calls == [old.Norm, "no args"], calls
    pm.hook.register_components(register=calls.append, zoo_version="9.9")  # and pluggy's own call
    assert calls[2:] == ["no args", old.Norm], calls
    # the other way round, a plugin naming an argument this version lacks, fails with a clear warning
    newer = fake("""
        from xlstm_zoo.plugins import hookimpl

        @hookimpl
        def register_components(register, zoo_version):
            pass
    """, dist="fake-newer")
    reg, caught = load()
    assert len(caught) == 1 and "plugin fake-newer 1.0: invalid hook implementation" in str(caught[0].message)
    assert "zoo_version" in str(caught[0].message), str(caught[0].message)
    assert newer


def test_failing_plugins_are_isolated(fake):
    fake("raise ImportError('no such thing')\n", dist="fake-import", version="0.3")
    fake(NORM_PLUGIN.format(name="early", scale=2.0, extra="")
         + "    raise RuntimeError('hook fails')\n", dist="fake-hook", version="0.4")
    fake("""
        def register_components(register):  # forgot @hookimpl
            pass
    """, dist="fake-nohook")
    fake("""
        from typing import Literal
        import torch
        from xlstm_zoo.config import ZooConfig
        from xlstm_zoo.plugins import hookimpl

        class Good(ZooConfig):
            type: Literal["goodnorm"] = "goodnorm"

        class NoType(ZooConfig):
            eps: float = 1e-5

        @hookimpl
        def register_components(register):
            register(kind="norm", name="notype", config=NoType, builder=torch.nn.Identity, description="x")
            register(kind="norm", name="goodnorm", config=Good, builder=lambda c, ctx: torch.nn.Identity(),
                     description="identity")
    """, dist="fake-partial")
    fake(NORM_PLUGIN.format(name="fine", scale=2.0, extra=""), dist="fake-zfine")
    reg, caught = load()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 4, messages
    expected = {"fake-import 0.3": "failed to import", "fake-hook 0.4": "register_components raised RuntimeError: hook fails",
                "fake-nohook 1.0": "forget the @hookimpl", "fake-partial 1.0": "needs a field `type"}
    for label, needle in expected.items():
        mine = [m for m in messages if f"plugin {label}:" in m]
        assert len(mine) == 1 and needle in mine[0], (label, messages)
    assert "(at " in next(m for m in messages if "fake-hook" in m), "the error's location helps the plugin author"
    names = reg.names("norm")
    assert "early" not in names, "a hook that raises registers nothing"
    assert "goodnorm" in names and "notype" not in names, "one bad registration does not sink the plugin's others"
    assert "fine" in names and info_of(reg, "fake-zfine").status == "loaded"
    assert info_of(reg, "fake-partial").registered == ["norm:goodnorm"]
    assert [info_of(reg, d).status for d in ("fake-import", "fake-hook", "fake-nohook", "fake-partial")] == ["failed"] * 4


CELLS_PLUGIN = """
from typing import Literal, NamedTuple
import torch
import xlstm_zoo
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.backends.dispatch import Backend
from xlstm_zoo.plugins import hookimpl

class State(NamedTuple):
    h: torch.Tensor

class CrashConfig(ZooConfig):
    type: Literal["crashy"] = "crashy"

class LeakyConfig(ZooConfig):
    type: Literal["leaky"] = "leaky"

class KernelConfig(ZooConfig):
    type: Literal["kernels"] = "kernels"

@xlstm_zoo.component("cell", "crashy", config=CrashConfig, description="builder raises")
class Crashy(Cell):
    def __init__(self, config, ctx):
        raise ZeroDivisionError("boom")

@xlstm_zoo.component("cell", "leaky", config=LeakyConfig, description="ignores its state in forward")
class Leaky(Cell):
    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        self.proj = torch.nn.Linear(ctx.dim, ctx.dim)

    def init_state(self, batch, device=None):
        return State(torch.zeros(batch, self.out_dim))

    def forward(self, x, state=None, *, value_input=None):
        h, ys = torch.zeros(x.shape[0], self.out_dim), []
        for t in range(x.shape[1]):
            h = 0.5 * h + self.proj(x[:, t])
            ys.append(h)
        return torch.stack(ys, 1), State(h)

    def step(self, x_t, state, *, value_input=None):
        h = 0.5 * state.h + self.proj(x_t)
        return h, State(h)

def kernels(config):
    raise OSError("libfancy.so: cannot open shared object file")

@hookimpl
def register_components(register):
    register(Crashy)
    register(Leaky)
    register(kind="backend", name="kernels", config=KernelConfig, builder=kernels, description="fancy kernels")
"""


def test_plugin_components_that_fail_at_build_time(fake):
    fake(CELLS_PLUGIN, dist="fake-cells", version="0.2")
    reg, caught = load()
    assert not caught and info_of(reg, "fake-cells").status == "loaded"
    ctx = BuildContext(dim=8, path="model.stack.blocks.0.cell")

    crashy = reg.get("cell", "crashy")
    with pytest.raises(PluginError) as info:
        crashy.builder(crashy.default_config(), ctx)
    message = str(info.value)
    for needle in ("plugin fake-cells 0.2: cell 'crashy' (at model.stack.blocks.0.cell) failed to build",
                   "ZeroDivisionError: boom"):
        assert needle in message, message
    assert isinstance(info.value.__cause__, ZeroDivisionError)

    leaky = reg.get("cell", "leaky")
    with pytest.warns(PluginWarning) as record:
        torch.manual_seed(0)
        first = leaky.builder(leaky.default_config(), ctx)  # first build: conformance check, one warning
        after_first = torch.rand(3)
    record = [w for w in record if issubclass(w.category, PluginWarning)]
    assert len(record) == 1, [str(w.message) for w in record]
    assert "plugin fake-cells 0.2: cell 'leaky' failed conformance (xlstm_zoo.testing.check_cell)" in \
        str(record[0].message) and "two halves != whole" in str(record[0].message), str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)  # no second warning
        torch.manual_seed(0)
        second = leaky.builder(leaky.default_config(), ctx)
        after_second = torch.rand(3)
    assert torch.equal(after_first, after_second), "the check must not change the user's random stream"
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert info_of(reg, "fake-cells").status == "failed"

    kernels = reg.get("backend", "kernels")
    with pytest.warns(PluginWarning, match=r"plugin fake-cells 0\.2: backend 'kernels' failed to build: OSError"):
        backend = kernels.builder(kernels.default_config())
    assert backend.name == "kernels" and "libfancy.so" in backend.unavailable_reason()
    assert not backend.supports("mlstm_step", torch.device("cpu"), torch.float32), "the dispatcher skips it"


@pytest.fixture
def global_registry():
    """The process-wide registry, restored afterwards (for in-process CLI runs)."""
    registry.names("cell")
    saved = ({kind: dict(names) for kind, names in registry._components.items()}, list(registry.plugins))
    yield registry
    registry._components, registry.plugins = saved
    registry._instances.clear()
    registry.version += 1


def test_cli_plugin_option_and_strict_flag_in_process(fake, global_registry, capsys, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 250)
    good = fake(NORM_PLUGIN.format(name="clinorm", scale=2.0, extra=""))
    assert cli.main(["--plugin", good, "plugins"]) == 0
    out = capsys.readouterr().out
    row = plugin_rows(out)[good]
    assert (row["from"], row["status"], row["registered"]) == ("--plugin", "loaded", "norm:clinorm"), row
    assert global_registry.get("norm", "clinorm").source == good

    bad = fake("raise RuntimeError('broken local plugin')\n")
    assert cli.main(["--strict-plugins", "--plugin", bad, "list", "norm"]) == 2
    err = ANSI.sub("", capsys.readouterr().err).strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: plugin module {bad} (no distribution): failed to import"), err
    assert "broken local plugin" in err[0] and "strict" in err[0], err

    assert cli.main(["--plugin", bad, "list", "norm", "clinorm"]) == 0  # not strict: a warning, the rest works
    captured = capsys.readouterr()
    warned = [line for line in ANSI.sub("", captured.err).splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and f"plugin module {bad} (no distribution): failed to import" in warned[0], warned
    assert "clinorm" in captured.out


def test_plugins_check_runs_conformance_on_plugin_components(fake, global_registry, capsys, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 250)
    good = fake(NORM_PLUGIN.format(name="checknorm", scale=2.0, extra=""))
    cells = fake(CELLS_PLUGIN)
    code = cli.main(["--plugin", good, "--plugin", cells, "plugins", "--check"])
    assert code == 1, "a failed check exits 1"
    captured = capsys.readouterr()
    out, err = ANSI.sub("", captured.out), ANSI.sub("", captured.err)
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "backend 'kernels' failed to build: OSError" in warned[0], err
    checks = {row[3] if row[0] == "(none)" else row[0]: row[-1] for row in table_rows(out) if len(row) == 8}
    assert checks[good] == "norm:checknorm: passed", checks
    assert "cell:crashy: failed conformance (xlstm_zoo.testing.check_cell): ZeroDivisionError: boom" in checks[cells]
    assert "cell:leaky: failed conformance (xlstm_zoo.testing.check_cell): cell 'leaky': two halves != whole" \
        in checks[cells], checks[cells]
    assert "backend:kernels: passed" in checks[cells], "an unavailable backend is a valid backend"
    assert checks["xlstm-zoo"] == "-", "core is checked by its own test suite, not here"
    status = plugin_rows(out)[cells]["status"]
    assert status.startswith("failed: ") and "cell 'leaky' failed conformance" in status, status


# == xlstm_zoo.testing: the checks catch what they claim to ============================================

class EMAState(NamedTuple):
    h: torch.Tensor

    @classmethod
    def export_sample(cls, like, generator):  # what export validates from (check_cell exports where onnx is installed)
        return cls(torch.randn(like.h.shape, generator=generator, dtype=like.h.dtype))


class _Config(ZooConfig):
    type: str = "ema"


class EMACell(torch.nn.Module):
    """h_t = 0.5 h_{t-1} + W v_t: correct unless a bug is switched on."""

    def __init__(self, bug=None, dim=16):
        super().__init__()
        self.bug, self.in_dim, self.out_dim = bug, dim, dim
        self.proj = torch.nn.Linear(dim, dim)
        self.unused = torch.nn.Linear(dim, dim) if bug == "unused_parameter" else None

    def init_state(self, batch, device=None):
        dtype = torch.float64 if self.bug == "fp64_state" else torch.float32
        return EMAState(torch.zeros(batch, self.out_dim, dtype=dtype))

    def _update(self, h, x_t, v_t):
        u = self.proj(x_t if v_t is None else v_t)
        if self.bug == "nan_for_large_inputs":
            u = u * torch.exp(x_t) / torch.exp(x_t)
        return 0.5 * h + u

    def forward(self, x, state=None, *, value_input=None):
        h = (state or self.init_state(x.shape[0])).h
        if self.bug == "forgets_state":
            h = torch.zeros_like(h)
        ys = []
        for t in range(x.shape[1]):
            h = self._update(h, x[:, t], None if value_input is None or self.bug == "ignores_value" else
                             value_input[:, t])
            ys.append(h)
        return torch.stack(ys, 1).to(x.dtype), EMAState(h)

    def step(self, x_t, state, *, value_input=None):
        h = self._update(state.h, x_t, value_input)
        if self.bug == "in_place":
            state.h.copy_(h)
            return h.to(x_t.dtype), state
        return h.to(x_t.dtype), EMAState(h)


@pytest.mark.parametrize("bug, needle", [
    ("forgets_state", "two halves != whole"),
    ("ignores_value", "with value_input: loop of step != forward"),
    ("fp64_state", "states must be fp32"),
    ("in_place", "modified in place"),
    ("unused_parameter", "parameters without gradient: ['unused.weight', 'unused.bias']"),
    ("nan_for_large_inputs", "inputs scaled by 1000: forward produced NaN"),
])
def test_check_cell_catches_each_bug(bug, needle):
    testing.check_cell(EMACell(), gradcheck=True)  # the bug-free cell passes everything
    with pytest.raises(testing.ConformanceError) as info:
        testing.check_cell(EMACell(bug))
    assert needle in str(info.value), str(info.value)
    assert isinstance(info.value, AssertionError)


def test_check_cell_of_unregistered_config_says_how_to_fix():
    with pytest.raises(testing.ConformanceError, match="unknown cell 'ema'.*pass builder=MyComponent"):
        testing.check_cell(_Config())
    cell = testing.check_cell(_Config(), builder=lambda config, ctx: EMACell(dim=ctx.dim), gradcheck=False)
    assert isinstance(cell, EMACell)


def test_example_mingru_passes_the_checks(monkeypatch):
    monkeypatch.syspath_prepend(str(MINGRU / "src"))
    from xlstm_zoo_mingru.cell import MinGRUCell, MinGRUConfig
    from xlstm_zoo_mingru.norm import DyTConfig, DyTNorm

    testing.check_cell(MinGRUConfig(), builder=MinGRUCell)
    testing.check_cell(MinGRUConfig(chunk_size=3), builder=MinGRUCell, gradcheck=False)  # T=11: several chunks
    testing.check_norm(DyTConfig(), builder=DyTNorm)
    cell = MinGRUCell(MinGRUConfig(), BuildContext(dim=8)).to(torch.bfloat16)
    y, state = cell(torch.randn(2, 5, 8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and state.h.dtype == torch.float32, "state stays fp32 under bf16 compute"


def test_example_mingru_own_tests_pass():
    """The plugin's own tests (the conformance checks; ONNX export and validation where onnx is installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(MINGRU / "src"), os.environ.get("PYTHONPATH"))
                                                        if p)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(MINGRU / "tests")],
                          cwd=MINGRU, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.skipif(bool(missing_toolchain()), reason="the export check needs the onnx extra")
def test_check_cell_export_validates_a_state_without_export_sample(monkeypatch):
    """export_sample is optional since plugin API 2: the export check passes from a reached state and says so."""
    monkeypatch.delattr(EMAState, "export_sample")
    with pytest.warns(ExportWarning, match=r"EMAState .*declares no export_sample.*reaches on 16 random inputs"):
        testing.check_cell(EMACell(), gradcheck=False)


# == the plugin API: last release's plugins keep passing ================================================

PREVIOUS_RELEASE_PLUGIN = """
from typing import Literal, NamedTuple
import torch
import xlstm_zoo
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl
{api}
class GRUState(NamedTuple):  # written against the previous plugins page: no export_sample
    h: torch.Tensor

class GRUConfig(ZooConfig):
    type: Literal["oldgru"] = "oldgru"

@xlstm_zoo.component("cell", "oldgru", config=GRUConfig, description="a minimal GRU-like cell")
class OldGRU(Cell):
    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        self.z, self.c = torch.nn.Linear(ctx.dim, ctx.dim), torch.nn.Linear(ctx.dim, ctx.dim)
    def init_state(self, batch, device=None):
        return GRUState(torch.zeros(batch, self.out_dim, device=device or self._device()))
    def step(self, x_t, state, *, value_input=None):
        v = x_t if value_input is None else value_input
        z = torch.sigmoid(self.z(x_t))
        h = (1 - z) * state.h + z * torch.tanh(self.c(v))
        return h.to(x_t.dtype), GRUState(h)
    def forward(self, x, state=None, *, value_input=None):
        state = self.init_state(x.shape[0], x.device) if state is None else state
        v, ys = (x if value_input is None else value_input), []
        for t in range(x.shape[1]):
            y, state = self.step(x[:, t], state, value_input=v[:, t])
            ys.append(y)
        return torch.stack(ys, 1), state

@hookimpl
def register_components(register):
    register(OldGRU)
"""


def test_a_previous_release_plugin_passes_the_check_with_a_warning(fake, global_registry, capsys, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 300)
    old = fake(PREVIOUS_RELEASE_PLUGIN.format(api=""))
    assert cli.main(["--plugin", old, "plugins", "--check"]) == 0, "missing optional parts do not fail the check"
    out = ANSI.sub("", capsys.readouterr().out)
    row = plugin_rows(out)[old]
    assert row["API"] == "1" and row["status"] == "loaded", row
    check = next(r[-1] for r in table_rows(out) if len(r) == 8 and r[3] == old)
    assert check.startswith("cell:oldgru: passed (warning: state class GRUState"), check
    assert "declares no export_sample (optional since plugin API 2" in check, check
    assert "OldGRU declares no document boundaries (optional since plugin API 3" in check, check
    assert f"plugin API {contract.PLUGIN_API_VERSION}" in out


@pytest.mark.parametrize("api, expected_api, message", [
    ("XLSTM_ZOO_PLUGIN_API = 2", 2, None),
    ("XLSTM_ZOO_PLUGIN_API = 99", 99, "written for plugin API 99, but this xlstm-zoo speaks 1 to 3: upgrade"),
    ("XLSTM_ZOO_PLUGIN_API = '2'", 1, "XLSTM_ZOO_PLUGIN_API = '2' is not a plugin API version"),
])
def test_a_plugin_declares_its_api_version(fake, monkeypatch, api, expected_api, message):
    module = fake(PREVIOUS_RELEASE_PLUGIN.format(api=api))
    monkeypatch.setenv("XLSTM_ZOO_PLUGINS", module)
    reg, caught = load()
    info = info_of(reg, module)
    assert info.status == "loaded" and info.registered == ["cell:oldgru"] and info.api == expected_api
    texts = [str(w.message) for w in caught]
    if message is None:
        assert not texts, texts
    else:
        assert len(texts) == 1 and message in texts[0], texts


def test_contract_versions_only_add_optional_parts():
    """Each part added after version 1 is optional with a default: a plugin of any earlier version loads."""
    assert contract.required(contract.PLUGIN_API_VERSION) == contract.required(1)
    later = [p for p in contract.PARTS if p.since > 1]
    assert later and all(not p.required and p.default for p in later)
