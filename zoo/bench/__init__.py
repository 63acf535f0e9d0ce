"""CPU benchmark suite: ours vs the official ``xlstm`` / ``mlstm_kernels`` packages, measured in the same run.

``cases`` defines what is compared (blocks, stacks, the mLSTM sequence op, a sequence-length sweep,
generation latency), ``runner`` times them (warm-up, interleaved repeats, medians, peak memory) and
renders the table, ``commands`` wires ``xlstm-zoo bench`` into the CLI. The same cases run under
pytest-benchmark in ``tests/bench/test_bench_cpu.py``.
"""
