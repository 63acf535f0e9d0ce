"""The shipped language-modelling comparison grid (recipes/paper/lm_comparison.yaml): its rows are the
paper's, at matched non-embedding parameters, and its demo cells build and train."""

from __future__ import annotations

import pytest

from xlstm_zoo import build, load_recipe
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.training.counts import parameter_counts

ROWS = {"xLSTM[1:0]", "xLSTM[7:1]", "xLSTM[1:1]", "Llama", "Mamba", "RWKV-4", "RetNet"}


def sizes(profile: str, vocab: int) -> dict[str, int]:
    out = {}
    for cell in expand(load_recipe("lm_comparison", profile=profile)):
        recipe = load_recipe(cell.recipe, [f"model.vocab_size={vocab}"])
        out[cell.labels["variant"]] = parameter_counts(build(recipe))["non_embedding_parameters"]
    return out


@pytest.mark.parametrize("profile, vocab", [("demo", 257), ("quick", 2048)])
def test_rows_are_the_papers_at_matched_non_embedding_parameters(profile, vocab):
    counts = sizes(profile, vocab)
    assert set(counts) == ROWS
    assert max(counts.values()) / min(counts.values()) <= 1.05, counts
    assert 250_000 < min(counts.values()), counts


def test_demo_profile_is_the_bytes_tokenizer_on_the_default_corpus():
    recipe = load_recipe("lm_comparison", profile="demo")
    assert recipe.task.type == "text_lm" and recipe.task.path is None and recipe.task.tokenizer.type == "bytes"
    assert recipe.report.metric == "bits_per_byte"
