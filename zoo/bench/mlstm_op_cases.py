"""The mLSTM op against ``mlstm_kernels``: chunkwise forward and backward, and the sequence-length sweep."""

from __future__ import annotations

from typing import Callable

import torch

from xlstm_zoo.backends import GateSchemes, mlstm_sequence
from xlstm_zoo.bench.case import BaselineUnavailable, Case, Prepared, Scale
from xlstm_zoo.bench.official import official_mlstm_kernel

# mlstm_kernels 2.0.6 `parallel--native_autograd` forward keeps 8 fp32 [B, H, T, T] intermediates alive
# at once (log-forget matrix, its masked copy, log D, stabilised log D, D, S, C~, C) plus a bool mask.
PARALLEL_TT_MATRICES = 8


def _qkvif(batch: int, heads: int, seq_len: int, head_dim: int, seed: int, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=g) for _ in range(3))
    i_pre = torch.randn(batch, heads, seq_len, generator=g)
    f_pre = torch.randn(batch, heads, seq_len, generator=g) + 3.0
    return [t.requires_grad_(requires_grad) for t in (q, k, v, i_pre, f_pre)]


def _our_mlstm(chunk_size: int):
    gates = GateSchemes(input="exponential", forget="sigmoid")
    return lambda q, k, v, i, f: mlstm_sequence(q, k, v, i, f, gates=gates, chunk_size=chunk_size)[0]


def _op_callable(op, tensors, backward: bool) -> Callable[[], None]:
    if not backward:
        def fn():
            with torch.no_grad():
                op(*tensors)
        return fn

    def fn():
        for t in tensors:
            t.grad = None
        op(*tensors).sum().backward()
    return fn


def op_cases(scale: Scale) -> list[Case]:
    B, H, T, D, L = scale.batch, scale.heads, scale.seq_len, scale.op_head_dim, scale.chunk_size
    shapes = f"B={B} H={H} T={T} Dqk=Dv={D} chunk={L} fp32"
    cases = []
    for label, group, backward in (("fwd", "mLSTM op", False), ("fwdbwd", "mLSTM op", True)):
        def ours(backward=backward):
            return Prepared(_op_callable(_our_mlstm(L), _qkvif(B, H, T, D, scale.seed, backward), backward),
                            note="mlstm_sequence chunkwise (default dispatch)")

        def baseline(backward=backward):
            kernel = official_mlstm_kernel("chunkwise--native_autograd")
            op = lambda q, k, v, i, f: kernel(q, k, v, i, f, chunk_size=L)  # noqa: E731
            return Prepared(_op_callable(op, _qkvif(B, H, T, D, scale.seed, backward), backward),
                            note="chunkwise--native_autograd")

        cases.append(Case(f"op/mlstm_chunkwise/{label}", group + (" fwd+bwd" if backward else " fwd"), shapes,
                          ours, baseline, baseline_name="mlstm_kernels"))
    return cases + [_short_case(scale)]


def _short_case(scale: Scale) -> Case:
    """Forward+backward on one chunk shorter than the chunk size, from the zero state: a formal-language
    training step's shape, where the initial state's terms and the final state's carry were most of the work."""
    B, T, D, L = scale.short_batch, scale.short_seq_len, scale.short_head_dim, scale.chunk_size

    def ours():
        return Prepared(_op_callable(_our_mlstm(L), _qkvif(B, 1, T, D, scale.seed, True), True),
                        note="mlstm_sequence chunkwise (default dispatch), state=None")

    def baseline():  # its chunkwise kernels need T to be a multiple of the chunk size; one chunk is the parallel form
        kernel = official_mlstm_kernel("parallel--native_autograd")
        return Prepared(_op_callable(kernel, _qkvif(B, 1, T, D, scale.seed, True), True),
                        note="parallel--native_autograd")

    return Case("op/mlstm_chunkwise/short_fwdbwd", "mLSTM op fwd+bwd, one short chunk",
                f"B={B} H=1 T={T} Dqk=Dv={D} chunk={L} fp32", ours, baseline, baseline_name="mlstm_kernels")


def parallel_bytes(batch: int, heads: int, seq_len: int) -> int:
    """Estimated peak of the official quadratic parallel form (its T x T intermediates)."""
    return PARALLEL_TT_MATRICES * batch * heads * seq_len * seq_len * 4 + seq_len * seq_len


def sweep_cases(scale: Scale) -> list[Case]:
    B, H, D = scale.sweep_batch, scale.heads, scale.op_head_dim
    cases = []
    ref_name = f"sweep/mlstm/T={scale.sweep_ref}" if scale.sweep_ref in scale.sweep_lengths else None
    for T in scale.sweep_lengths:
        def ours(T=T):
            return Prepared(_op_callable(_our_mlstm(scale.chunk_size), _qkvif(B, H, T, D, scale.seed), False),
                            note="chunkwise (linear in T)")

        def baseline(T=T):
            need = parallel_bytes(B, H, T)
            if need > scale.quadratic_limit_bytes:
                raise BaselineUnavailable(f"skipped: quadratic memory {need / 2**30:.1f} GiB")
            kernel = official_mlstm_kernel("parallel--native_autograd")
            return Prepared(_op_callable(kernel, _qkvif(B, H, T, D, scale.seed), False),
                            note="parallel--native_autograd (quadratic)")

        cases.append(Case(f"sweep/mlstm/T={T}", "T sweep (fwd)", f"B={B} H={H} T={T} D={D} fp32", ours, baseline,
                          baseline_name="mlstm_kernels", memory=True, ref=ref_name, info=dict(seq_len=T)))
    # Linear growth, measured interleaved (machine drift between the sweep cases above cancels here):
    # our op on T tokens against our op on the same T tokens cut into T / ref separate sequences of
    # length ref. Both sides read the same amount of data, so the ratio isolates how the cost grows
    # with length from cache effects (one short input called again and again stays in cache).
    # Ratio >= 1: no worse than linear; the target Time(16384) / Time(1024) <= 18 is
    # ratio >= 16 / 18 = 0.89.
    ref = scale.sweep_ref
    op = _our_mlstm(scale.chunk_size)

    for T in (t for t in scale.sweep_lengths if t > ref and t % ref == 0):
        def long(T=T):
            return Prepared(_op_callable(op, _qkvif(B, H, T, D, scale.seed), False), note="our op on T tokens")

        def pieces(T=T):
            tensors = _qkvif(B, H, T, D, scale.seed)
            calls = [_op_callable(op, [x.narrow(2, start, ref).contiguous() for x in tensors], False)
                     for start in range(0, T, ref)]

            def fn():
                for call in calls:
                    call()
            return Prepared(fn, note=f"our op on the same tokens as T / {ref} sequences of {ref}")

        cases.append(Case(f"sweep/linear/T={T}", "T sweep: growth vs linear", f"B={B} H={H} T={T} vs {T // ref} x T={ref}",
                          long, pieces, baseline_name=f"ours on T/{ref} sequences of {ref}", info=dict(seq_len=T)))
    return cases
