"""The shipped language-modelling comparison grid (recipes/paper/lm_comparison.yaml): its rows are the
paper's, at matched non-embedding parameters, and its demo cells build and train."""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.models.counts import parameter_counts

ROWS = {"xLSTM[1:0]", "xLSTM[7:1]", "xLSTM[1:1]", "Llama", "Mamba", "RWKV-4", "RetNet"}


def sizes(profile: str, vocab: int) -> dict[str, dict[str, int]]:
    """size label -> row -> non-embedding parameters, for the profile's cells of seed 0 (built on the meta
    device: counted without allocating weights)."""
    out = {}
    for cell in expand(load_recipe("lm_comparison", profile=profile)):
        if cell.labels["seed"] == 0:
            recipe = load_recipe(cell.recipe, [f"model.vocab_size={vocab}"])
            with torch.device("meta"):
                count = parameter_counts(build(recipe))["non_embedding_parameters"]
            out.setdefault(cell.labels["size"], {})[cell.labels["variant"]] = count
    return out


@pytest.mark.parametrize("profile, vocab", [("demo", 257), ("quick", 2048)])
def test_rows_are_the_papers_at_matched_non_embedding_parameters(profile, vocab):
    by_size = sizes(profile, vocab)
    assert set(by_size) == ({"s", "m"} if profile == "quick" else {"s"})  # quick: two sizes, the others one
    for size, counts in by_size.items():
        assert set(counts) == ROWS
        assert max(counts.values()) / min(counts.values()) <= 1.05, (size, counts)
    assert 250_000 < min(by_size["s"].values()) and max(by_size["s"].values()) < 350_000, by_size["s"]
    if "m" in by_size:
        assert 1_000_000 < min(by_size["m"].values()) and max(by_size["m"].values()) < 2_000_000, by_size["m"]


def test_demo_profile_is_the_bytes_tokenizer_on_the_default_corpus():
    recipe = load_recipe("lm_comparison", profile="demo")
    assert recipe.task.type == "text_lm" and recipe.task.path is None and recipe.task.tokenizer.type == "bytes"
    assert recipe.report.metric == "bits_per_byte"


def test_report_shows_sizes_and_speed_of_language_model_rows(tmp_path):
    from xlstm_zoo.grid.report import build_report
    from xlstm_zoo.grid.runner import read_result, run_grid
    corpus = tmp_path / "c"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"{i}.txt").write_text(f"document {i}: " + "some words of text " * 6)
    recipe = load_recipe({
        "name": "tiny_lm", "model": {"type": "causal_lm", "vocab_size": None, "dim": 16,
                                     "stack": {"type": "xlstm", "ratio": "1:0", "num_blocks": 1}},
        "task": {"type": "text_lm", "path": str(corpus), "context_length": 16, "eval_windows": 4,
                 "valid_fraction": 0.3, "cache_dir": str(tmp_path / "cache")},
        "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "eval_splits": ["valid"]},
        "grid": {"variants": {"one": {}, "two": {"model.stack.num_blocks": 2}}},
        "report": {"metric": "bits_per_byte", "split": "valid"}})
    run_grid(recipe, tmp_path / "run")
    report = build_report(tmp_path / "run").markdown()
    assert "| row | non-embedding parameters | FLOPs/token | training tokens | tokens/s |" in report
    cells = sorted((tmp_path / "run" / "cells").iterdir())
    results = {read_result(c)["labels"]["variant"]: read_result(c) for c in cells}
    for name, result in results.items():
        assert f"| {name} | {result['non_embedding_parameters']:,} |" in report
        assert f"| {result['train_tokens']:,} |" in report and result["train_tokens"] == 2 * 4 * 16
    assert results["two"]["non_embedding_parameters"] > results["one"]["non_embedding_parameters"]
