"""The README's and docs/ pages' examples run as written (docs that match the code).

Python blocks are executed; the YAML examples are loaded and built; every ``xlstm-zoo`` line of a
bash block parses with the real command line; the error examples are what the code says; the
backend table is the one the kernel declarations give. No page points outside the repository.
"""

import re
import shlex
from pathlib import Path

import pytest

from xlstm_zoo import build, cli, load_recipe
from xlstm_zoo.backends.catalog import markdown_table
from xlstm_zoo.registry import registry

ROOT = Path(__file__).parent.parent
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


def blocks(lang, page=None):
    pages = [PAGES[page]] if page else PAGES.values()
    return [b for text in pages for b in re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)]


def test_every_page_is_linked_from_the_readme():
    readme = PAGES["README.md"]
    missing = [p for p in PAGES if p.startswith("docs/") and p != "docs/results.md" and f"({p})" not in readme]
    assert not missing, missing
    assert "(docs/results.md)" in readme or "(results.md)" in PAGES["docs/main-job.md"]


def test_no_page_points_outside_the_repository():
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)#]+)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (ROOT / Path(page).parent / target).resolve().is_relative_to(ROOT), (page, target)
            assert (ROOT / Path(page).parent / target).exists(), (page, target)
        assert "DESIGN.md" not in text and "../shared" not in text, page


@pytest.mark.parametrize("code", blocks("python"))
def test_python_examples_run(code):
    try:
        exec(compile(code, "docs", "exec"), {})
    finally:
        if "scalenorm" in registry.names("norm"):
            registry.unregister("norm", "scalenorm")


@pytest.mark.parametrize("line", [line for block in blocks("bash") for line in block.splitlines()
                                  if line.strip().startswith("xlstm-zoo ")])
def test_command_lines_parse(line):
    argv = [a.strip("[]") for a in shlex.split(line, comments=True)[1:]]  # `[--quick]`: an optional flag
    args = cli._parser().parse_args(argv)
    assert callable(args.run), line


def test_yaml_example_builds(tmp_path):
    text = blocks("yaml", "docs/recipes.md")[0]
    path = tmp_path / "my_model.yaml"
    path.write_text(text)
    recipe = load_recipe(path, ["model.stack.blocks.m.cell.num_heads=4"])
    model = build(recipe)
    assert len(model.stack.blocks) == 16 and recipe.model.dim == 256


def test_error_examples_are_what_the_code_says(tmp_path):
    lines = re.findall(r"^error: my\.yaml: (.*)$", PAGES["docs/recipes.md"], flags=re.M)
    assert len(lines) == 2, lines
    for line in lines:
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

    fragment = yaml.safe_load(next(b for b in blocks("yaml", "docs/recipes.md") if b.startswith("model:\n  init:")))
    model = build(load_recipe({"model": {"type": "causal_lm", "tie_weights": False, **fragment["model"]}}))
    assert model.config.init.scheme == "xlstm"
    assert abs(model.embedding.weight.std().item() - 1.0) < 0.05


def test_grid_example_expands():
    import yaml

    from xlstm_zoo.grid.expand import expand

    fragment = yaml.safe_load(blocks("yaml", "docs/main-job.md")[0])  # whole grid: and report: sections
    recipe = load_recipe(load_recipe("formal_languages").model_dump() | fragment)
    cells = expand(recipe)
    assert len(cells) == 2 * 2 * 2 * 3 and not [c for c in cells if c.error]
    assert {(c.labels["train.lr"], c.labels["train.batch_size"]) for c in cells} == {(0.001, 32), (0.003, 64)}


def test_backend_table_is_the_declared_kernels():
    text = PAGES["docs/backends.md"]
    table = re.search(r"<!-- kernels:begin -->\n(.*?)<!-- kernels:end -->", text, flags=re.S).group(1)
    assert table == markdown_table(), "docs/backends.md: paste `python -m xlstm_zoo.backends.catalog` between the markers"
