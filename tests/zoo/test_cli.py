"""The ``xlstm-zoo`` command line: listing, showing, building, schema, recipes, demo, and errors.

Configuration mistakes must print exactly one line on stderr naming the file, the field path and the
bad value or the allowed values, exit with status 2 and never show a traceback (``--debug`` does).
Most tests call ``xlstm_zoo.cli.main(argv)`` in-process (fast); a few run the real process
(``python -m xlstm_zoo.cli``) where the exit status or a traceback on stderr is the point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import xlstm_zoo
from xlstm_zoo import cli
from xlstm_zoo.recipe_loader import shipped_recipes

ROOT = Path(__file__).resolve().parents[2]  # tests/zoo/test_cli.py -> the repository
BUILTIN_KINDS = ("cell", "gate", "norm", "block", "stack", "model", "backend")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def repo_recipes() -> list[str]:
    base = ROOT / "recipes"
    return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))


# -- running the CLI -------------------------------------------------------------------------------

@pytest.fixture
def run(run_cli):
    """``run(*argv) -> (exit code, stdout, stderr)``, in-process (the shared fixture in conftest.py)."""
    return run_cli


def run_process(*argv, columns: int = 200, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    """The real process: ``python -m xlstm_zoo.cli ARGV`` (a non-terminal, ``columns`` wide)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env.update(COLUMNS=str(columns), NO_COLOR="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "xlstm_zoo.cli", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)
    proc.stdout, proc.stderr = ANSI.sub("", proc.stdout), ANSI.sub("", proc.stderr)
    return proc


def table_rows(text: str) -> list[list[str]]:
    """The body rows of rich tables in ``text``; continuation lines of wrapped cells are joined."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("│") and line.endswith("│"):
            cells = [c.strip() for c in line[1:-1].split("│")]
            if any(cells[:2]) or not rows or len(rows[-1]) != len(cells):
                rows.append(cells)
            else:  # a wrapped cell continues on this line
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return rows


def _show(code, out, err) -> str:
    return f"exit {code}\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}"


def assert_one_line_error(code: int, err: str, *, needles=(), out: str = ""):
    """Exit 2, exactly one line on stderr, no traceback, and the line contains every needle."""
    assert code == 2, "expected exit status 2\n" + _show(code, out, err)
    assert "Traceback" not in err, "traceback shown for a configuration mistake:\n" + err
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    missing = [n for n in needles if n not in line]
    assert not missing, f"the error line does not mention {missing}:\n{line}"
    return line


# -- list --------------------------------------------------------------------------------------

def test_list_all_kinds(run):
    code, out, err = run("list")
    assert code == 0, _show(code, out, err)
    rows = table_rows(out)
    kinds = {r[0] for r in rows if r[0]}
    assert set(BUILTIN_KINDS) <= kinds, f"kinds missing from `xlstm-zoo list`: {set(BUILTIN_KINDS) - kinds}"
    listed = {(r[0], r[1]) for r in rows if r[0]}
    registered = {(c.kind, c.name) for c in xlstm_zoo.registry.find()}
    assert listed == registered, f"`list` differs from the registry: {listed ^ registered}"
    assert ("cell", "mlstm") in listed and ("backend", "reference") in listed


def test_list_cells(run):
    code, out, err = run("list", "cell")
    assert code == 0, _show(code, out, err)
    rows = table_rows(out)
    assert {r[0] for r in rows} == {"cell"}, rows
    assert {r[1] for r in rows} >= {"lstm", "slstm", "mlstm"}, rows
    assert all(r[2] for r in rows), f"a cell without a description: {rows}"


def test_list_wildcard(run):
    code, out, err = run("list", "block", "p*")
    assert code == 0, _show(code, out, err)
    names = {r[1] for r in table_rows(out)}
    assert {"pre_up", "post_up", "plain"} <= names, names
    assert "residual" not in names and "mlstm_7b" not in names, names
    assert all(n.startswith("p") for n in names), names


def test_list_nothing_matches(run):
    code, out, err = run("list", "cell", "zz*")
    assert code != 0, "a pattern matching nothing should exit non-zero\n" + _show(code, out, err)
    assert not [r for r in table_rows(out) if r[1]], out
    assert "zz*" in out + err and re.search(r"no .*match", out + err), "no message saying nothing matched:\n" + out + err


def test_list_unknown_kind_process():
    proc = run_process("list", "nokind")
    line = assert_one_line_error(proc.returncode, proc.stderr, out=proc.stdout, needles=("nokind", *BUILTIN_KINDS))
    assert "kind" in line, line


def test_list_kind_typo_suggests(run):
    code, out, err = run("list", "cel")
    line = assert_one_line_error(code, err, out=out, needles=("'cel'", "'cell'"))
    assert "did you mean" in line, line


# -- show --------------------------------------------------------------------------------------

def test_show_mlstm_fields_and_defaults(run):
    code, out, err = run("show", "cell", "mlstm")
    assert code == 0, _show(code, out, err)
    assert "mlstm" in out.splitlines()[0], out
    rows = {r[0]: r for r in table_rows(out) if r[0]}
    for field in ("num_heads", "form", "chunk_size", "input_gate", "forget_gate", "norm", "qk_dim_factor"):
        assert field in rows, f"`show cell mlstm` does not list {field}: {sorted(rows)}"
    assert "type" not in rows
    config = xlstm_zoo.registry.get("cell", "mlstm").config
    assert set(rows) == set(config.model_fields) - {"type"}, set(rows) ^ (set(config.model_fields) - {"type"})
    for name, field in config.model_fields.items():
        if name != "type" and isinstance(field.default, (int, float, str, bool, type(None))):
            assert rows[name][2] == repr(field.default), f"{name}: shown default {rows[name][2]!r}, " \
                                                         f"config default {field.default!r}"
    assert rows["num_heads"][2] == "4" and rows["form"][2] == "'chunkwise'" and rows["chunk_size"][2] == "64"
    assert "exponential" in rows["input_gate"][2] and "sigmoid" in rows["forget_gate"][2], rows
    assert "gate" in rows["input_gate"][1] and "recurrent" in rows["form"][1], rows


def test_show_unknown_cell_process():
    proc = run_process("show", "cell", "nope")
    assert_one_line_error(proc.returncode, proc.stderr, out=proc.stdout,
                          needles=("cell", "'nope'", "attention, lstm, mamba, mlstm"))


def test_show_close_matches(run):
    code, out, err = run("show", "cell", "mlstmm")
    line = assert_one_line_error(code, err, out=out, needles=("'mlstmm'", "did you mean", "'mlstm'", "attention, lstm, mamba, mlstm"))
    assert line.index("'mlstm'") < line.index("(known cells"), line


# -- build -------------------------------------------------------------------------------------

def _block_rows(out: str) -> list[list[str]]:
    return [r for r in table_rows(out) if r[0].isdigit()]


def _total(out: str) -> int:
    rows = [r for r in table_rows(out) if len(r) > 1 and r[1] == "total"]
    assert len(rows) == 1, f"no single total row in:\n{out}"
    return int(rows[0][-1].replace(",", ""))


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_build_summary_matches_model(run):
    code, out, err = run("build", "xlstm_7_1")
    assert code == 0, _show(code, out, err)
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_7_1"))
    rows = _block_rows(out)
    assert [int(r[0]) for r in rows] == list(range(len(model.stack.blocks))) == list(range(8)), rows
    assert [r[1] for r in rows] == ["pre_up", "post_up"] + ["pre_up"] * 6, "xLSTM[7:1]: sLSTM at position 1"
    assert [r[2] for r in rows] == ["MLSTMCell", "SLSTMCell"] + ["MLSTMCell"] * 6, rows
    for row, block in zip(rows, model.stack.blocks):
        assert int(row[-1].replace(",", "")) == _params(block), f"block {row[0]}: {row[-1]} != {_params(block):,}"
    assert _total(out) == _params(model), f"table total {_total(out):,} != model parameters {_params(model):,}"
    assert "xLSTM[7:1]" in out


@pytest.mark.parametrize("override", ["stack.num_blocks=6", "model.stack.num_blocks=6"])
def test_build_set_changes_rows(run, override):
    code, out, err = run("build", "xlstm_1_1", "--set", override)
    assert code == 0, _show(code, out, err)
    rows = _block_rows(out)
    assert len(rows) == 6, f"--set {override} should give 6 block rows, got {len(rows)}"
    assert [r[1] for r in rows] == ["pre_up", "post_up"] * 3, rows
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_1_1", [override]))
    assert _total(out) == _params(model)


def test_build_repeated_set(run):
    code, out, err = run("build", "xlstm_1_1", "--set", "stack.num_blocks=2", "--set", "stack.blocks.m.cell.num_heads=8")
    assert code == 0, _show(code, out, err)
    rows = _block_rows(out)
    assert [(r[1], r[3]) for r in rows] == [("pre_up", "8"), ("post_up", "4")], rows


@pytest.mark.parametrize("name, overrides", [
    ("xlstm_1_1", ["--set", "stack.num_blocks=2"]),
    ("lstm_up_projection", []),  # a description longer than a terminal line
    ("xlstm_7b_small", []),
])
def test_build_dump_reloads(tmp_path, name, overrides):
    # the real process, 80 columns wide: what `xlstm-zoo build R --dump > file` in a terminal-less shell sees
    proc = run_process("build", name, *overrides, "--dump", columns=80)
    assert proc.returncode == 0, _show(proc.returncode, proc.stdout, proc.stderr)
    # stdout is the YAML alone (so `--dump > file` works); the summary table goes to stderr
    assert "┏" not in proc.stdout and "┏" in proc.stderr, _show(proc.returncode, proc.stdout, proc.stderr)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(proc.stdout)
    sets = overrides[1::2]
    expected = xlstm_zoo.load_recipe(name, sets)
    try:
        reloaded = xlstm_zoo.load_recipe(dumped)
    except xlstm_zoo.ConfigError as err:
        pytest.fail(f"`build {name} --dump` does not print loadable YAML (lines wrapped by the console?): "
                    f"{err}\n--- dumped ---\n{dumped.read_text()[:1500]}")
    assert reloaded == expected, "the dumped recipe reloads to a different recipe"
    assert reloaded.model_dump() == expected.model_dump()


# -- configuration mistakes ---------------------------------------------------------------------

BLOCKS = """\
extends: xlstm_1_1
model:
  stack:
    blocks:
      m:
        type: pre_up
        cell: {cell}
"""

BAD_RECIPES = {
    # id: (files, extra argv, needles in the error line besides the file name)
    "unknown_key": ({"r.yaml": BLOCKS.format(cell="{type: mlstm, num_head: 4}")}, [],
                    ["model.stack.blocks.m.cell.num_head", "'num_head'", "did you mean 'num_heads'"]),
    "wrong_type": ({"r.yaml": BLOCKS.format(cell="{type: mlstm, num_heads: four}")}, [],
                   ["model.stack.blocks.m.cell.num_heads", "'four'", "integer"]),
    "unknown_component": ({"r.yaml": BLOCKS.format(cell="{type: mlstmm}")}, [],
                          ["model.stack.blocks.m.cell.type", "'mlstmm'", "'mlstm'", "attention, lstm, mamba, mlstm"]),
    "impossible_dims": ({"r.yaml": BLOCKS.format(cell="{type: mlstm, num_heads: 3}")}, [],
                        ["model.stack.blocks.m.cell.num_heads", "num_heads=3", "must divide"]),
    "yaml_syntax": ({"r.yaml": "name: broken\nmodel:\n  type: causal_lm: x\n  dim: 64\n"}, [],
                    ["r.yaml:3", "YAML"]),
    "extends_cycle": ({"r.yaml": "extends: other.yaml\nname: r\n", "other.yaml": "extends: r.yaml\nname: o\n"}, [],
                      ["extends", "cycle", "other.yaml"]),
    "extends_missing": ({"r.yaml": "extends: does_not_exist.yaml\nname: r\n"}, [],
                        ["extends", "'does_not_exist.yaml'", "models/xlstm_1_1"]),
    "set_unknown_field": ({"r.yaml": "extends: xlstm_1_1\n"}, ["--set", "stack.num_block=4"],
                          ["model.stack.num_block", "did you mean 'num_blocks'"]),
    "set_through_scalar": ({"r.yaml": "extends: xlstm_1_1\n"}, ["--set", "stack.num_blocks.x=4"],
                           ["model.stack.num_blocks.x", "stack.num_blocks.x=4"]),
    "set_bad_list_index": ({"r.yaml": "name: seq\nmodel:\n  type: causal_lm\n  stack:\n    type: sequential\n    blocks:\n"
                                      "      - {type: plain, cell: {type: lstm}}\n"},
                           ["--set", "stack.blocks.3.cell.num_heads=2"], ["model.stack.blocks.3", "'3'"]),
    # not a path at all: the --set text is the place to point at, the recipe file need not be named
    "set_not_path_value": ({"r.yaml": "extends: xlstm_1_1\n"}, ["--set", "stack.num_blocks"],
                           ["--set stack.num_blocks", "dotted.path=value"]),
    # rich markup in a user's value must be shown verbatim, not interpreted (or crash the printer)
    "markup_in_value": ({"r.yaml": BLOCKS.format(cell='{type: "[/x]"}')}, [],
                        ["model.stack.blocks.m.cell.type", "'[/x]'"]),
    "markup_tag_in_value": ({"r.yaml": BLOCKS.format(cell='{type: "[bold]x"}')}, [],
                            ["model.stack.blocks.m.cell.type", "'[bold]x'"]),
}


NEED_NOT_NAME_FILE = {"set_not_path_value"}


def _write(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / "r.yaml"


@pytest.mark.parametrize("case", list(BAD_RECIPES))
def test_bad_recipe_one_line_error(run, tmp_path, case):
    files, extra, needles = BAD_RECIPES[case]
    recipe = _write(tmp_path, files)
    try:
        code, out, err = run("build", recipe, *extra)
    except Exception as exc:  # what a user would see as a traceback
        pytest.fail(f"`xlstm-zoo build` raised {type(exc).__name__} instead of a one-line error: {exc}")
    names_file = case not in NEED_NOT_NAME_FILE
    assert_one_line_error(code, err, out=out, needles=[recipe.name, *needles] if names_file else needles)
    assert err.startswith("error:"), err


def test_bad_recipe_process_no_traceback(tmp_path):
    """The real process: exit 2, one line, no traceback; the same mistake with --debug shows one."""
    files, extra, needles = BAD_RECIPES["unknown_component"]
    recipe = _write(tmp_path, files)
    proc = run_process("build", recipe)
    assert_one_line_error(proc.returncode, proc.stderr, out=proc.stdout, needles=[str(recipe), *needles])
    proc = run_process("--debug", "build", recipe)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and re.search(r"xlstm_zoo\.errors\.\w+Error", proc.stderr), proc.stderr[-2000:]
    assert "mlstmm" in proc.stderr


def test_debug_raises_in_process(tmp_path):
    recipe = _write(tmp_path, BAD_RECIPES["wrong_type"][0])
    with pytest.raises(xlstm_zoo.ConfigError, match=r"model\.stack\.blocks\.m\.cell\.num_heads"):
        cli.main(["--debug", "build", str(recipe)])


def test_build_missing_recipe(run, tmp_path):
    missing = tmp_path / "nope.yaml"
    code, out, err = run("build", missing)
    assert_one_line_error(code, err, out=out, needles=[str(missing), "models/xlstm_7_1"])


# -- schema, recipes, demo ---------------------------------------------------------------------

def test_schema_is_json_schema(run):
    code, out, err = run("schema")
    assert code == 0, _show(code, out, err)
    schema = json.loads(out)
    assert isinstance(schema, dict) and schema.get("type") == "object", list(schema)[:10]
    assert {"name", "description", "model"} <= set(schema.get("properties", {})), schema.get("properties", {}).keys()
    text = json.dumps(schema)
    for cell in ("lstm", "slstm", "mlstm"):
        assert re.search(rf'"const": "{cell}"|"enum": \["{cell}"\]', text), f"cell {cell!r} not in the schema"
    for field in ("num_heads", "chunk_size", "qk_dim_factor"):
        assert f'"{field}"' in text, field


def test_schema_validates_shipped_recipes(run):
    import jsonschema  # declared test dependency: a missing one fails, never skips
    code, out, err = run("schema")
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for name in shipped_recipes():
        resolved = xlstm_zoo.load_recipe(name).model_dump(mode="json")
        errors = [e.message[:200] for e in validator.iter_errors(resolved)]
        assert not errors, f"{name} (resolved) does not validate against `xlstm-zoo schema`: {errors[:3]}"
    bad = {"model": {"type": "causal_lm", "stack": {"type": "xlstm", "blocks": {"m": {"type": "pre_up",
                                                                                     "cell": {"type": "mlstmm"}}}}}}
    assert list(validator.iter_errors(bad)), "the schema accepts an unknown cell type"


def test_recipes_lists_every_shipped_recipe(run):
    code, out, err = run("recipes")
    assert code == 0, _show(code, out, err)
    names = [r[0] for r in table_rows(out) if r[0]]
    assert names == repo_recipes() == shipped_recipes(), names
    for name in names:
        assert xlstm_zoo.load_recipe(name).description[:20] in out, name


def test_no_command_prints_help(run):
    code, out, err = run()
    assert code == 2 and "usage" in (out + err).lower()


def test_demo_runs_every_model_recipe():
    start = time.perf_counter()
    # 80 columns: the width of a terminal-less run (CI logs, `| tee`)
    proc = run_process("demo", "--tokens", "2", "--seq-len", "8", columns=80, timeout=300)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, _show(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "FAIL" not in proc.stdout, proc.stdout + proc.stderr
    models = [n for n in repo_recipes() if n.startswith("models/")]
    assert len(models) >= 8, models
    rows = [r for r in table_rows(proc.stdout) if r[0]]
    assert len(rows) == len(models), f"{len(rows)} demo rows for {len(models)} model recipes:\n{proc.stdout}"
    missing = [n for n in models if n not in proc.stdout]
    assert not missing, f"demo output (80 columns) does not name {missing}; the recipe column is truncated:\n" \
                        f"{proc.stdout}"
    assert elapsed < 120, f"demo --tokens 2 --seq-len 8 took {elapsed:.0f} s"
