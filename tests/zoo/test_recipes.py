"""Recipes: shipped files, extends, overrides, schema, and one-line errors for every mistake."""

import json

import pytest
import yaml

from xlstm_zoo import build, load_recipe, shipped_recipes
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader import Recipe, merge

SHIPPED = shipped_recipes()
REQUIRED = {"models/lstm", "models/lstm_residual", "models/xlstm_1_0", "models/xlstm_0_1", "models/xlstm_1_1",
            "models/xlstm_7_1", "models/xlstm_7b_small", "models/xlstm_neurips"}


def test_required_recipes_ship():
    assert REQUIRED <= set(SHIPPED), f"missing: {REQUIRED - set(SHIPPED)}"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_builds(name):
    recipe = load_recipe(name)
    model = build(recipe)
    assert recipe.name and recipe.description
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("name, layout", [
    ("xlstm_1_0", "mmmm"), ("xlstm_0_1", "ssss"), ("xlstm_1_1", "msms"), ("xlstm_7_1", "msmmmmmm"),
])
def test_xlstm_ratios_give_the_paper_layouts(name, layout):
    model = build(load_recipe(name))
    assert model.stack.layout == layout
    expected = ["pre_up" if ch == "m" else "post_up" for ch in layout]
    assert model.stack.block_types == expected


def test_layout_options():
    base = {"model": {"type": "causal_lm", "dim": 16, "vocab_size": 5, "stack": {"type": "xlstm"}}}

    def layout(**stack):
        data = json.loads(json.dumps(base))
        data["model"]["stack"].update(stack)
        return build(load_recipe(data)).stack.layout

    assert layout(num_blocks=4, slstm_at=[1]) == "msmm"
    assert layout(pattern="ssm") == "ssm"
    assert layout(num_blocks=3) == "mmm"
    with pytest.raises(ConfigError, match="give one layout, not ratio and pattern"):
        layout(ratio="1:1", pattern="ms")
    with pytest.raises(ConfigError, match=r"slstm_at positions \[7\] are outside 0..3"):
        layout(num_blocks=4, slstm_at=[7])
    with pytest.raises(ConfigError, match='ratio must look like "7:1"'):
        layout(num_blocks=4, ratio="seven")
    with pytest.raises(ConfigError, match=r"letters \['x'\] that have no template"):
        layout(pattern="mx")


def test_extends_merges_and_type_change_replaces(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "name": "base", "model": {"type": "causal_lm", "dim": 16, "vocab_size": 7,
                                  "stack": {"type": "xlstm", "pattern": "m",
                                            "blocks": {"m": {"type": "pre_up", "cell": {"type": "mlstm", "num_heads": 2, "form": "parallel"}}}}}}))
    (tmp_path / "child.yaml").write_text(yaml.safe_dump({
        "extends": "base.yaml", "name": "child",
        "model": {"stack": {"blocks": {"m": {"cell": {"num_heads": 4}}}}}}))
    child = load_recipe(tmp_path / "child.yaml")
    cell = child.model.stack.blocks["m"].cell
    assert (child.name, child.model.vocab_size, cell.num_heads, cell.form) == ("child", 7, 4, "parallel")
    # a different `type` replaces the parent's mapping (mlstm's fields don't leak into slstm)
    assert merge({"c": {"type": "mlstm", "form": "parallel"}}, {"c": {"type": "slstm"}}) == {"c": {"type": "slstm"}}


def test_extends_shipped_recipe_by_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("extends: xlstm_7_1\nname: mine\nmodel:\n  dim: 64\n")
    recipe = load_recipe(tmp_path / "mine.yaml")
    assert (recipe.name, recipe.model.dim, recipe.model.stack.ratio) == ("mine", 64, "7:1")


def test_overrides():
    recipe = load_recipe("xlstm_1_0", ["stack.num_blocks=2", "model.dim=32", "stack.blocks.m.cell.num_heads=8",
                                       "stack.blocks.m.cell.forget_gate.bias_init.start=1.5"])
    stack = recipe.model.stack
    assert (stack.num_blocks, recipe.model.dim, stack.blocks["m"].cell.num_heads) == (2, 32, 8)
    assert stack.blocks["m"].cell.forget_gate.bias_init.start == 1.5
    swapped = load_recipe("xlstm_1_0", ["stack.blocks.m.cell.type=slstm"])
    assert swapped.model.stack.blocks["m"].cell.type == "slstm"
    build(swapped)  # the sLSTM cell with its own defaults fits the pre_up block


@pytest.mark.parametrize("override, match", [
    ("stack.num_blocks", "must look like dotted.path=value"),
    ("stack.num_blocks=-1", "model.stack.num_blocks: Input should be greater than or equal to 1"),
    ("stack.blocks.m.cell.num_heads=3", None),  # valid config; dims checked at build time
])
def test_override_errors(override, match):
    if match is None:
        with pytest.raises(ConfigError, match=r"model.stack.blocks.m.cell.num_heads: num_heads=3 must divide the block.s inner size proj_factor\*dim=2\*128=256"):
            build(load_recipe("xlstm_1_0", [override]))
    else:
        with pytest.raises(ConfigError, match=match):
            load_recipe("xlstm_1_0", [override])


@pytest.mark.parametrize("text, match", [
    ("model: {type: causal_lm, dimm: 3}", r"model.dimm: unknown field 'dimm'; did you mean 'dim'\? \(fields:"),
    ("model: {type: causal_lm, dim: wide}", r"model.dim: Input should be a valid integer.*\(got 'wide'\)"),
    ("model: {type: causal_lm, stack: {type: xlstm, blocks: {m: {type: pre_up, cell: {type: mlstmm}}}}}",
     r"model.stack.blocks.m.cell.type: unknown cell 'mlstmm'; did you mean 'mlstm'"),
    ("model: {type: causal_lm, stack: {type: xlstm, blocks: {m: {cell: {type: mlstm}}}}}",
     r"model.stack.blocks.m: missing `type`: name the block \(one of: mlstm_7b, plain"),
    ("model: [1, 2]", r"model: expected a model config"),
    ("model: {type: causal_lm\n  dim: 3", r":2:\d+: invalid YAML"),
    ("- a\n- b", "a recipe must be a mapping"),
    ("extends: nowhere.yaml", "extends: no recipe file or shipped recipe named 'nowhere.yaml'"),
])
def test_bad_recipes_give_one_line_errors_with_file_and_path(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_recipe(path)
    message = str(info.value)
    assert "\n" not in message, f"error should be one line: {message!r}"
    assert str(path) in message, f"error should name the file: {message!r}"


def test_impossible_dims_are_errors_with_path():
    with pytest.raises(ConfigError, match=r"model.stack.blocks.s.cell.num_heads: num_heads=5 must divide dim=128 "
                                          r"\(allowed: divisors of 128: 1, 2, 4, 8, 16, 32, 64, 128\)"):
        build(load_recipe("xlstm_0_1", ["stack.blocks.s.cell.num_heads=5"]))


def test_extends_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="`extends` forms a cycle"):
        load_recipe(tmp_path / "a.yaml")


def test_dump_round_trips_including_infinite_bias():
    recipe = load_recipe("xlstm_1_0", ["stack.blocks.m.cell.forget_gate.bias_init={kind: constant, value: .inf}",
                                       "stack.blocks.m.cell.forget_gate.learnable_bias=false"])
    again = load_recipe(yaml.safe_load(yaml.safe_dump(recipe.model_dump())))
    assert again == recipe
    assert again.model.stack.blocks["m"].cell.forget_gate.bias_init.value == float("inf")


def test_schema_lists_registered_components():
    schema = Recipe.model_json_schema()
    text = json.dumps(schema)
    for name in ("mlstm", "slstm", "lstm", "pre_up", "post_up", "causal_lm", "multihead_layernorm"):
        assert f'"{name}"' in text, f"{name} missing from the recipe schema"
    assert schema["type"] == "object" and "model" in schema["properties"]


GRID_RECIPES = [name for name in SHIPPED if load_recipe(name).grid is not None]
GRID_PROFILES = [(name, profile) for name in GRID_RECIPES for profile in [None, *(load_recipe(name).profiles or {})]]


@pytest.mark.parametrize(("name", "profile"), GRID_PROFILES)
def test_every_shipped_grid_expands_to_valid_cells(name, profile):
    from xlstm_zoo.grid.expand import expand

    recipe = load_recipe(name, profile=profile)
    cells = expand(recipe)
    bad = [(c.id, c.error) for c in cells if c.error]
    assert not bad, f"{name} --profile {profile}: invalid cells {bad[:3]}"
    assert recipe.task is not None, f"{name} declares a grid but no task"


def test_paper_recipes_ship():
    assert {"paper/formal_languages", "paper/state_tracking", "paper/ablation", "paper/gating",
            "paper/mqar"} <= set(SHIPPED)


def test_a_profile_can_start_from_another():
    data = {"model": {"type": "causal_lm"}, "train": {"steps": 10, "warmup_steps": 0},
            "profiles": {"quick": {"train.steps": 5, "train.lr": 0.01}, "demo": {"profile": "quick", "train.steps": 7}}}
    recipe = load_recipe(data, profile="demo")
    assert (recipe.train.steps, recipe.train.lr) == (7, 0.01)
    data["profiles"]["quick"]["profile"] = "demo"
    with pytest.raises(ConfigError, match="circle: demo -> quick -> demo"):
        load_recipe(data, profile="demo")
    data["profiles"]["quick"]["profile"] = "fast"
    with pytest.raises(ConfigError, match="unknown profile 'fast' \\(named by profile 'quick'\\)"):
        load_recipe(data, profile="demo")
