"""The README's examples run as written (docs that match the code)."""

import re
from pathlib import Path

import pytest

from xlstm_zoo import build, load_recipe
from xlstm_zoo.registry import registry

README = (Path(__file__).parent.parent / "README.md").read_text()


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("code", blocks("python"))
def test_python_examples_run(code):
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        if "scalenorm" in registry.names("norm"):
            registry.unregister("norm", "scalenorm")


def test_yaml_example_builds(tmp_path):
    text = blocks("yaml")[0]
    path = tmp_path / "my_model.yaml"
    path.write_text(text)
    recipe = load_recipe(path, ["model.stack.blocks.m.cell.num_heads=4"])
    model = build(recipe)
    assert len(model.stack.blocks) == 16 and recipe.model.dim == 256


def test_error_examples_are_what_the_code_says(tmp_path):
    for line in re.findall(r"^error: my\.yaml: (.*)$", README, flags=re.M):
        path, message = line.split(": ", 1)
        if "unknown cell" in message:
            recipe = {"model": {"type": "causal_lm", "stack": {"type": "xlstm", "blocks": {
                "m": {"type": "pre_up", "cell": {"type": "mlstmm"}}}}}}
            with pytest.raises(Exception) as info:
                load_recipe(recipe)
        else:
            with pytest.raises(Exception) as info:
                build(load_recipe("xlstm_0_1", ["stack.blocks.s.cell.num_heads=5"]))
        assert f"{path}: {message}" in str(info.value)


def test_init_example_builds():
    import yaml

    fragment = yaml.safe_load(next(b for b in blocks("yaml") if "init:" in b and b.startswith("model:")))
    model = build(load_recipe({"model": {"type": "causal_lm", "tie_weights": False, **fragment["model"]}}))
    assert model.config.init.scheme == "xlstm"
    assert abs(model.embedding.weight.std().item() - 1.0) < 0.05


def test_grid_example_expands():
    import yaml

    from xlstm_zoo.grid.expand import expand

    fragment = yaml.safe_load(next(b for b in blocks("yaml") if b.startswith("grid:")))  # grid: and report:
    recipe = load_recipe(load_recipe("formal_languages").model_dump() | fragment)
    cells = expand(recipe)
    assert len(cells) == 2 * 2 * 2 * 3 and not [c for c in cells if c.error]
    assert {(c.labels["train.lr"], c.labels["train.batch_size"]) for c in cells} == {(0.001, 32), (0.003, 64)}
