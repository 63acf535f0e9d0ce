"""The cpp backend's one-call chunkwise form (``mlstm_chunk.cpp``: Sequence) computes the reference op's
function and gradient.

Checked against the reference op in float64 at float32 tolerances (within 4x the error of the per-chunk
kernels' path on the same float32 inputs): q, k, v as strided views of [B, T, H*D] projections, tail and
single short chunks, an initial state, every gate scheme, strong forgetting; gradients of the output and
of the final state with respect to q, k, v, both gates' pre-activations and the initial state, and without
the initial state's (state=None, or a state that wants none) or the final state's. Also: when
it runs (float32 CPU, at least one (batch, head) row per thread) and when it does not, the caller's state
left as it was, and the same bits on any thread count.
"""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp import mlstm as cpp_mlstm
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence as reference_sequence
from xlstm_zoo.backends.states import MLSTMState

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")
GATES = GateSchemes(input="exponential", forget="sigmoid")


def projections(B, H, T, dk, dv, seed, forget_mean=3.0):
    """q, k, v as the cells pass them ([B, T, H*D] outputs viewed as [B, H, T, D]: strided), and the gates."""
    g = torch.Generator().manual_seed(seed)

    def heads(d):
        return torch.randn(B, T, H * d, generator=g).unflatten(-1, (H, d)).movedim(-2, 1)

    q, k, v = heads(dk), heads(dk), heads(dv)
    i_pre = torch.randn(B, T, H, generator=g).movedim(-1, 1)
    f_pre = (torch.randn(B, T, H, generator=g) + forget_mean).movedim(-1, 1)
    return q, k, v, i_pre, f_pre


def random_state(B, H, dk, dv, seed):
    g = torch.Generator().manual_seed(seed)
    return MLSTMState(torch.randn(B, H, dk, dv, generator=g), torch.randn(B, H, dk, generator=g),
                      torch.randn(B, H, generator=g))


def unscaled(state):
    """The stabilised state's values, C exp(m) and n exp(m) (the stabiliser itself is a choice)."""
    C, n, m = (t.double() for t in state)
    return C * m.exp()[..., None, None], n * m.exp()[..., None]


def relative_error(a, b):
    return (a.double() - b).abs().max().item() / (b.abs().max().item() + 1e-30)


def assert_matches_float64(inputs, state, gates, chunk):
    with torch.no_grad():
        h, final = cpp_mlstm.mlstm_sequence(*inputs, state, gates=gates, chunk_size=chunk)
        h_chunks, final_chunks = reference_sequence(*inputs, state, gates=gates, chunk_size=chunk,
                                                    kernels=cpp_mlstm.KERNELS)
        h_64, final_64 = reference_sequence(*(t.double() for t in inputs),
                                            None if state is None else MLSTMState(*(t.double() for t in state)),
                                            gates=gates, chunk_size=chunk)
    assert h.dtype == torch.float32 and h.shape == h_64.shape and h.is_contiguous()
    pairs = [("h", h, h_chunks, h_64), *zip(("C", "n"), unscaled(final), unscaled(final_chunks), unscaled(final_64))]
    for name, a, a_chunks, b in pairs:
        assert torch.isfinite(a).all(), name
        err, err_chunks = relative_error(a, b), relative_error(a_chunks, b)
        assert err <= max(4 * err_chunks, 2e-5), f"{name}: max error {err:.2e} (per-chunk kernels: {err_chunks:.2e})"
    torch.testing.assert_close(final.m.double(), final_64.m, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B,H,T,dk,dv,chunk", [(2, 4, 256, 32, 64, 64),   # the 7B layout's head sizes, whole chunks
                                               (2, 3, 300, 16, 24, 64),   # a tail chunk of 44
                                               (1, 2, 5, 8, 8, 64),       # one chunk shorter than the chunk size
                                               (3, 2, 100, 5, 7, 16),     # sizes no multiple of a vector
                                               (1, 4, 130, 64, 128, 32)])
def test_equals_float64_reference(B, H, T, dk, dv, chunk):
    inputs = projections(B, H, T, dk, dv, seed=T + dk)
    assert not inputs[0].is_contiguous()
    assert_matches_float64(inputs, None, GATES, chunk)
    assert_matches_float64(inputs, random_state(B, H, dk, dv, seed=T), GATES, chunk)


@pytest.mark.parametrize("gates", [GateSchemes("sigmoid", "sigmoid"), GateSchemes("sigmoid", "exponential"),
                                   GateSchemes("exponential", "exponential")])
def test_every_gate_scheme(gates):
    inputs = projections(2, 2, 150, 8, 12, seed=3, forget_mean=0.0)
    assert_matches_float64(inputs, random_state(2, 2, 8, 12, seed=4), gates, 32)


def test_strong_forgetting():
    # Forget pre-activations N(-4, 1): decays far below float32's smallest normal inside each chunk.
    inputs = projections(2, 2, 256, 16, 16, seed=5, forget_mean=-4.0)
    assert_matches_float64(inputs, None, GATES, 64)


@pytest.mark.parametrize("where", ["input gate", "forget gate"])
def test_a_nan_gate_spoils_its_row_from_its_token_on(where):
    # The row stabiliser is torch.maximum's max (NaN wins), here over vectorised rows of the decay matrix.
    # The kernel walks the chunks in order, so a NaN reaches the tokens from its own on and that row's final
    # state, nothing earlier and no other row. (The reference's chunk-parallel form spreads it to the whole
    # row: its matrix products mix the NaN into the earlier chunks too.)
    q, k, v, i_pre, f_pre = projections(2, 2, 150, 8, 8, seed=9)
    gate = (i_pre if where == "input gate" else f_pre).clone()
    gate[1, 0, 70] = float("nan")  # row (1, 0), in the second chunk of 64
    inputs = (q, k, v, gate, f_pre) if where == "input gate" else (q, k, v, i_pre, gate)
    with torch.no_grad():
        h, final = cpp_mlstm.mlstm_sequence(*inputs, gates=GATES)
    nan = h.isnan().any(-1)
    assert nan[1, 0, 70:].all() and nan.sum() == 150 - 70
    assert final.m.isnan().tolist() == [[False, False], [True, False]]


def test_contiguous_inputs_and_heads_first_layout():
    q, k, v, i_pre, f_pre = (t.contiguous() for t in projections(2, 2, 96, 8, 8, seed=8))
    assert_matches_float64((q, k, v, i_pre, f_pre), None, GATES, 32)


def test_runs_where_the_rows_keep_the_threads_busy(monkeypatch):
    calls = []
    original = cpp_mlstm.reference_sequence
    monkeypatch.setattr(cpp_mlstm, "reference_sequence", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q, k, v, i_pre, f_pre = projections(2, 2, 64, 8, 8, seed=1)
    one_row = [t[:1, :1] for t in (q, k, v, i_pre, f_pre)]
    wide = projections(1, 1, 64, 160, 160, seed=2)  # a row's state over ONE_CALL_MAX_STATE
    assert 160 * 160 > cpp_mlstm.ONE_CALL_MAX_STATE >= 8 * 8
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.no_grad():
            cpp_mlstm.mlstm_sequence(q, k, v, i_pre, f_pre, gates=GATES)  # 4 rows: the sequence kernel
            cpp_mlstm.mlstm_sequence(*one_row, gates=GATES)  # 1 row, one chunk: nothing for the per-chunk kernels
            cpp_mlstm.mlstm_sequence(*one_row, gates=GATES, chunk_size=16)  # 1 row, half the threads, small state
            cpp_mlstm.mlstm_sequence(*wide, gates=GATES, chunk_size=64)  # one chunk, however wide
            assert calls == []
            cpp_mlstm.mlstm_sequence(*wide, gates=GATES, chunk_size=16)  # 4 chunks of a wide row: per-chunk kernels
            assert len(calls) == 1
            torch.set_num_threads(4)
            cpp_mlstm.mlstm_sequence(*one_row, gates=GATES, chunk_size=16)  # 1 row for 4 threads: per-chunk
            assert len(calls) == 2
            torch.set_num_threads(2)
            cpp_mlstm.mlstm_sequence(q, k, v, i_pre, f_pre, gates=GATES, form="parallel")
            assert len(calls) == 3
            cpp_mlstm.mlstm_sequence(*(t.double() for t in (q, k, v, i_pre, f_pre)), gates=GATES)
            assert len(calls) == 4
            short = [t[..., :40, :] if t.dim() == 4 else t[..., :40] for t in (q, k, v, i_pre, f_pre)]
            cpp_mlstm.mlstm_sequence(*short, gates=GATES)  # 4 rows for 2 threads, T < chunk: one call too
            assert len(calls) == 4
        leaf = q.detach().requires_grad_(True)
        h, _ = cpp_mlstm.mlstm_sequence(leaf, k, v, i_pre, f_pre, gates=GATES)  # a gradient wanted: compiled too
        assert len(calls) == 4 and h.grad_fn.name() == "_CppSequenceBackward"
    finally:
        torch.set_num_threads(threads)


def test_bad_inputs_get_the_reference_errors():
    q, k, v, i_pre, f_pre = projections(2, 2, 16, 8, 8, seed=2)
    with torch.no_grad():
        with pytest.raises(ValueError, match="bad shapes"):
            cpp_mlstm.mlstm_sequence(q, k[..., :4], v, i_pre, f_pre, gates=GATES)
        with pytest.raises(ValueError, match="chunk_size"):
            cpp_mlstm.mlstm_sequence(q, k, v, i_pre, f_pre, gates=GATES, chunk_size=0)
        with pytest.raises(ValueError, match="initial state C"):
            cpp_mlstm.mlstm_sequence(q, k, v, i_pre, f_pre, random_state(2, 2, 8, 4, seed=0), gates=GATES)


def test_state_left_alone_and_same_bits_on_any_thread_count():
    inputs = projections(3, 2, 200, 16, 8, seed=11)
    state = random_state(3, 2, 16, 8, seed=12)
    before = [t.clone() for t in state]
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            with torch.no_grad():
                results.append(cpp_mlstm.mlstm_sequence(*inputs, state, gates=GATES, chunk_size=32))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(state, before))
    (h, final), *others = results
    for h_other, final_other in others:
        assert torch.equal(h, h_other) and all(torch.equal(a, b) for a, b in zip(final, final_other))


def losses_and_grads(fn, inputs, state, dtype, gates, chunk, seed=17, *, state_grad=True, final_grad=True):
    """h, the final state, and the gradients of one fixed weighted sum of h and the final state (C, n, m)
    with respect to q, k, v, i_pre, f_pre and the initial state. Without ``state_grad`` the initial state
    (or None) wants no gradient; without ``final_grad`` the sum and the outputs returned are of h alone."""
    leaves = [t.to(dtype).detach().requires_grad_(True) for t in inputs]
    given = None if state is None else [t.to(dtype).detach().requires_grad_(state_grad) for t in state]
    if state_grad:
        leaves += given
    h, final = fn(*leaves[:5], None if given is None else MLSTMState(*given), gates=gates, chunk_size=chunk)
    outs = (h, *final) if final_grad else (h,)
    g = torch.Generator().manual_seed(seed)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(dtype)).sum() for t in outs)
    return outs, torch.autograd.grad(loss, leaves)


def assert_within_float32_error(names, ours, per_chunk, exact):
    """Each of ours within 4x the per-chunk kernels' error against the float64 values (or 2e-5)."""
    assert len(names) == len(ours) == len(per_chunk) == len(exact)
    for name, a, a_chunks, b in zip(names, ours, per_chunk, exact):
        assert a.dtype == torch.float32 and torch.isfinite(a).all(), name
        err, err_chunks = relative_error(a, b), relative_error(a_chunks, b)
        assert err <= max(4 * err_chunks, 2e-5), f"{name}: max error {err:.2e} (per-chunk kernels: {err_chunks:.2e})"


def reference_with_chunk_kernels(*args, **kwargs):
    return reference_sequence(*args, kernels=cpp_mlstm.KERNELS, **kwargs)


@pytest.mark.parametrize("B,H,T,dk,dv,chunk,gates,forget_mean", [
    (2, 2, 256, 16, 32, 64, GATES, 3.0),
    (1, 3, 150, 8, 12, 32, GateSchemes("sigmoid", "exponential"), 0.0),   # a tail chunk of 22
    (2, 2, 200, 5, 7, 16, GATES, -3.0),                                    # strong forgetting, odd sizes
    (2, 1, 9, 4, 4, 64, GateSchemes("exponential", "exponential"), 0.0)])  # one short chunk
def test_gradients_equal_float64_reference(B, H, T, dk, dv, chunk, gates, forget_mean):
    inputs = projections(B, H, T, dk, dv, seed=T, forget_mean=forget_mean)
    state = random_state(B, H, dk, dv, seed=T + 1)
    outs, grads = losses_and_grads(cpp_mlstm.mlstm_sequence, inputs, state, torch.float32, gates, chunk)
    outs_chunks, grads_chunks = losses_and_grads(reference_with_chunk_kernels, inputs, state, torch.float32, gates,
                                                 chunk)
    outs_64, grads_64 = losses_and_grads(reference_sequence, inputs, state, torch.float64, gates, chunk)
    names = ("h", "C", "n", "m", "dq", "dk", "dv", "di", "df", "dC0", "dn0", "dm0")
    assert_within_float32_error(names, (*outs, *grads), (*outs_chunks, *grads_chunks), (*outs_64, *grads_64))


@pytest.mark.parametrize("T,chunk", [(21, 64), (100, 32)])  # one short chunk (the formal tasks' shape); four
@pytest.mark.parametrize("given", [False, True])  # state=None, or a state that wants no gradient
@pytest.mark.parametrize("final_grad", [False, True])
def test_gradients_without_an_initial_state_gradient(T, chunk, given, final_grad):
    # state=None runs from the zero state with its terms skipped, no wanted initial-state gradient skips the
    # first chunk's, no final-state gradient the last chunk's carry step: none of it may change a result.
    inputs = projections(3, 2, T, 16, 8, seed=T + 5)
    state = random_state(3, 2, 16, 8, seed=T + 6) if given else None
    runs = [losses_and_grads(fn, inputs, state, dtype, GATES, chunk, seed=23, state_grad=False, final_grad=final_grad)
            for fn, dtype in ((cpp_mlstm.mlstm_sequence, torch.float32), (reference_with_chunk_kernels, torch.float32),
                              (reference_sequence, torch.float64))]
    ours = runs[0][0]
    assert ours[0].grad_fn.name() == "_CppSequenceBackward"
    names = ("h", "C", "n", "m")[:len(ours)] + ("dq", "dk", "dv", "di", "df")
    assert_within_float32_error(names, *((*outs, *grads) for outs, grads in runs))


def test_gradient_of_h_alone():
    # No gradient reaches the final state: the backward gets null pointers for it.

    inputs = projections(2, 2, 100, 8, 8, seed=21)
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    h, _ = cpp_mlstm.mlstm_sequence(*leaves, gates=GATES, chunk_size=32)
    assert h.grad_fn.name() == "_CppSequenceBackward"
    grads = torch.autograd.grad(h.square().sum(), leaves)
    leaves_ref = [t.detach().requires_grad_(True) for t in inputs]
    h_ref, _ = ops.mlstm_sequence(*leaves_ref, gates=GATES, chunk_size=32, backend="reference")
    for a, b in zip(grads, torch.autograd.grad(h_ref.square().sum(), leaves_ref)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_second_derivative_refused():
    # The backward is compiled: a second derivative through it is an error, not a silent zero.
    leaves = [t.detach().requires_grad_(True) for t in projections(2, 2, 40, 4, 4, seed=30)]
    h, _ = cpp_mlstm.mlstm_sequence(*leaves, gates=GATES, chunk_size=16)
    (dq,) = torch.autograd.grad(h.square().sum(), leaves[:1], create_graph=True)
    # Marked, dq carries an error node; unmarked it would carry no graph, and a loss mixing it with other terms
    # would take the mLSTM's second-order term as zero.
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.sum().backward()
