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


def test_the_tuned_profile_is_the_claim_experiments_best_rows():
    # docs/results.md reports the tuned grid's LSTM and xLSTM[0:1] cycle_nav / mod_arith_no_brackets cells from
    # these experiments' runs: that holds only while both expand to the same cells (same meaning digest)
    tuned = {(c.labels["variant"], c.labels["task.type"], c.labels["seed"]): c.digest
             for c in expand(load_recipe("state_tracking", profile="tuned"))}
    for recipe, row in (("tasks_lstm_lr.yaml", "LSTM"), ("tasks_slstm_forget_dim128.yaml", "xLSTM[0:1]")):
        cells = expand(load_recipe(CLAIM / recipe))
        assert len(cells) == 6
        for cell in cells:
            assert cell.digest == tuned[(row, cell.labels["task.type"], cell.labels["seed"])], (recipe, cell.labels)


def test_the_tuned_profile_stops_early_only_where_the_paper_has_every_learner_solve_the_task():
    cells = expand(load_recipe("state_tracking", profile="tuned"))
    assert len(cells) == 8 * 4 * 3
    stops = {c.labels["task.type"]: c.recipe.train.early_stop for c in cells}
    assert stops["cycle_nav"] is None and stops["mod_arith_no_brackets"] is None
    assert stops["parity"].at_most == stops["even_pairs"].at_most == 0.001
