"""CPU benchmarks of ours vs the official ``xlstm`` / ``mlstm_kernels`` packages, through pytest-benchmark.

The cases of ``xlstm_zoo.bench.cases`` (blocks and stacks forward and forward+backward at B=4,
T=1024, d=128, 4 heads; the xLSTM-7B layout against the official xLSTMLarge; our LSTM cell against
torch.nn.LSTM; the mLSTM chunkwise op; the T sweep against the quadratic parallel form;
generation-step latency at growing positions): one benchmark per (case, side), then a table of
baseline / ours ratios (> 1: ours is faster) printed at the end. Unlike ``xlstm-zoo bench`` the two
sides of a case are timed one after the other, not interleaved, so on a loaded machine prefer the CLI.

    python -m pytest tests/bench/test_bench_cpu.py --benchmark-enable -p no:cacheprovider -o addopts="" -s
    python -m pytest tests/bench/test_bench_cpu.py --benchmark-enable -p no:cacheprovider -o addopts="" -s -k "op/"

``XLSTM_ZOO_BENCH_SCALE`` picks the shapes: ``quick`` (default: sweep T = 256, 1024, 4096; the official
generation baseline only up to position 1,000), ``full`` (sweep to T = 16384, positions to 10,000) or
``smoke`` (tiny shapes, a harness check). ``XLSTM_ZOO_BENCH_ROUNDS`` sets the rounds per side (default 3),
``XLSTM_ZOO_BENCH_THREADS`` torch's intra-op threads (default: torch's choice).
Not part of the default run (pytest's addopts ignore tests/bench).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from xlstm_zoo.bench.cases import SCALES, BaselineUnavailable, make_cases

SCALE = SCALES[os.environ.get("XLSTM_ZOO_BENCH_SCALE", "quick")]
ROUNDS = int(os.environ.get("XLSTM_ZOO_BENCH_ROUNDS", "3"))
if os.environ.get("XLSTM_ZOO_BENCH_THREADS"):
    torch.set_num_threads(int(os.environ["XLSTM_ZOO_BENCH_THREADS"]))
CASES = {c.name: c for c in make_cases(SCALE)}
_results: dict[tuple[str, str], float] = {}    # (case, side) -> median seconds
_params: dict[tuple[str, str], int | None] = {}
_skipped: dict[str, str] = {}                  # case -> why the baseline did not run


@pytest.mark.parametrize("side", ["ours", "baseline"])
@pytest.mark.parametrize("name", list(CASES))
def test_case(benchmark, name, side):
    case = CASES[name]
    try:
        prepared = case.ours() if side == "ours" else case.baseline()
    except BaselineUnavailable as err:
        _skipped[name] = str(err)
        pytest.skip(str(err))
    benchmark.group = name
    benchmark.extra_info.update(case=name, side=side, group=case.group, shapes=case.shapes, params=prepared.params,
                                scale=SCALE.name, what=prepared.note)
    benchmark.pedantic(prepared.fn, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    if benchmark.stats is not None:
        _results[(name, side)] = benchmark.stats.stats.median
        _params[(name, side)] = prepared.params


def test_report_ratios(capsys):
    """Print baseline / ours for every case measured above (same run)."""
    if not _results:
        pytest.skip("benchmarks disabled (run with --benchmark-enable)")
    lines = [f"scale {SCALE.name}, {ROUNDS} rounds per side, {torch.get_num_threads()} torch threads; ratio = baseline / ours (> 1: ours faster)",
             "| case | ours (ms, median) | baseline (ms, median) | ratio | params ours / baseline |",
             "| --- | --- | --- | --- | --- |"]
    for name in CASES:
        ours, base = _results.get((name, "ours")), _results.get((name, "baseline"))
        if ours is None:
            continue
        params = " / ".join("-" if n is None else f"{n:,}" for n in (_params.get((name, "ours")), _params.get((name, "baseline"))))
        if base is None:
            lines.append(f"| {name} | {ours * 1e3:.2f} | {_skipped.get(name, 'n/a')} | - | {params} |")
        else:
            lines.append(f"| {name} | {ours * 1e3:.2f} | {base * 1e3:.2f} | {base / ours:.2f}x | {params} |")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) > 3
    assert all(math.isfinite(v) and v > 0 for v in _results.values())
