"""Step latency on CPU: the exported ONNX step in onnxruntime vs the PyTorch eager step, same run.

For the xLSTM[7:1] and xLSTM[1:0] recipes (shipped sizes, random weights) at batch 1 and 16: one
benchmark per (recipe, batch, runtime), each a streaming loop that feeds its state back, then a
table of PyTorch / onnxruntime ratios (> 1: onnxruntime is faster). Both runtimes use one
intra-op thread, so the comparison is per core and not skewed by other processes on a shared box.

    python -m pytest tests/bench/test_export_bench.py --benchmark-enable -p no:cacheprovider -o addopts="" -s

Not part of the default run (pytest's addopts ignore tests/bench).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xlstm_zoo.export import export_step
from xlstm_zoo.export.step_model import StepModule, prepare_model
from xlstm_zoo.export.validate import OrtStep
from xlstm_zoo.recipe_loader import build, load_recipe

RECIPES = ["xlstm_7_1", "xlstm_1_0"]
BATCHES = [1, 16]
THREADS = 1
ROUNDS = {1: 300, 16: 150}
_medians: dict[tuple[str, int, str], float] = {}  # (recipe, batch, runtime) -> seconds per step


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(recipe):
        if recipe not in cache:
            torch.manual_seed(0)
            model = build(load_recipe(recipe))
            result = export_step(model, tmp_path_factory.mktemp(recipe), batch=(1, 8, 64), rollout_steps=100,
                                 threads=THREADS, source=recipe)
            assert result.ok, result.report.failures()
            module = StepModule(prepare_model(model, torch.float32), result.signature).eval()
            cache[recipe] = (result, module)
        return cache[recipe]
    return get


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("runtime", ["pytorch", "onnxruntime"])
def test_step_latency(benchmark, exported, recipe, batch, runtime):
    result, module = exported(recipe)
    sig = result.signature
    gen = torch.Generator().manual_seed(0)
    x = sig.example_input(batch, gen)
    benchmark.group = f"{recipe} batch {batch}"
    benchmark.extra_info.update(recipe=recipe, batch=batch, runtime=runtime, threads=THREADS)
    if runtime == "pytorch":
        state = [sig.random_state(batch, gen)]
        before = torch.get_num_threads()
        torch.set_num_threads(THREADS)

        def step():
            with torch.no_grad():
                y, *state[0] = module(x, *state[0])
            return y
        try:
            benchmark.pedantic(step, rounds=ROUNDS[batch], warmup_rounds=10, iterations=1)
        finally:
            torch.set_num_threads(before)
    else:
        ort_step = OrtStep(result.onnx_path, sig, threads=THREADS)
        xs = x.numpy()
        state = [[s.numpy() for s in sig.random_state(batch, gen)]]

        def step():
            y, state[0] = ort_step(xs, state[0])
            return y
        benchmark.pedantic(step, rounds=ROUNDS[batch], warmup_rounds=10, iterations=1)
    if benchmark.stats is not None:
        _medians[(recipe, batch, runtime)] = benchmark.stats.stats.median


def test_report_ratios(capsys):
    """Print the PyTorch / onnxruntime step-latency ratios measured above (same run)."""
    if not _medians:
        pytest.skip("benchmarks disabled (run with --benchmark-enable)")
    lines = ["| recipe | batch | PyTorch eager step (ms, median) | onnxruntime step (ms, median) | ratio PyTorch / ORT |",
             "| --- | --- | --- | --- | --- |"]
    for recipe in RECIPES:
        for batch in BATCHES:
            pt, ort = _medians.get((recipe, batch, "pytorch")), _medians.get((recipe, batch, "onnxruntime"))
            if pt is None or ort is None:
                continue
            lines.append(f"| {recipe} | {batch} | {pt * 1e3:.2f} | {ort * 1e3:.2f} | {pt / ort:.1f}x |")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == 2 + len(RECIPES) * len(BATCHES)
    assert all(np.isfinite(v) and v > 0 for v in _medians.values())
