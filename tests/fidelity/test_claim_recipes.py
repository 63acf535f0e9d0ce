"""The experiment recipes behind the state-tracking claims (tests/fidelity/claim/) stay runnable: each loads and
expands into grid cells without a configuration error, so a recorded command can be re-run as written."""

from pathlib import Path

import pytest

from xlstm_zoo.grid.expand import expand
from xlstm_zoo.recipe_loader.load import load_recipe

CLAIM = Path(__file__).parent / "claim"
RECIPES = sorted(p for p in CLAIM.glob("*.yaml") if load_recipe(p).grid is not None)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_claim_recipe_expands(path):
    cells = expand(load_recipe(path))
    assert cells, f"{path.name} expands to no cell"
    assert [c.id for c in cells if c.error] == []


def test_reused_cells_keep_their_names():
    # tasks_slstm_conv0.yaml reuses the screen's finished no-conv cycle_nav cell by name and digest
    screen = {c.id for c in expand(load_recipe(CLAIM / "tasks_slstm_screen.yaml"))}
    seeds = {c.id for c in expand(load_recipe(CLAIM / "tasks_slstm_conv0.yaml"))}
    assert len(screen & seeds) == 1
