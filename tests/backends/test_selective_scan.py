"""Mamba's selective scan in C++ (``backends/cpp/selective_scan.cpp``): output, final state and the gradients of
u, dt, A, B, C and h0 against the recurrence in float64, at odd shapes (T = 1, N = 1, E = 1, T across the
backward's chunks, channels past one work unit with a tail); state carry; the same bits on any thread
count; the dispatch from the cell; bad input. The kernel parity harness holds it to the reference forms too.

Measured (float32 kernel vs the float64 recurrence, the shapes below): at most 6e-7 of each tensor's largest
value, as the float32 reference forms (at most 5e-7); the kernel tolerance allows 1e-4."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.selective_scan import CHUNK
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.backends.reference.selective_scan import sequential_scan
from xlstm_zoo.cells.mamba import MambaCellConfig
from xlstm_zoo.config import BuildContext, build as build_config
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")

NAMES = ("y", "h_T", "du", "ddt", "dA", "dB", "dC", "dh0")


def scan_inputs(B, T, E, N, seed=0) -> list[torch.Tensor]:
    """float64: u, dt (after a softplus), A (negative), B, C, a non-zero h0."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    return [rand(B, T, E), F.softplus(rand(B, T, E) - 1), -torch.exp(rand(E, N)), rand(B, T, N), rand(B, T, N),
            rand(B, E, N)]


def run(fn, xs, weights=(1.0, 1.0)):
    """y, h_T and the gradients of every input of ``w_y <y, r_y> + w_h <h_T, r_h>`` (a zero weight: that output
    does not reach the loss at all; an input that then does not reach it either, C, has a zero gradient)."""
    xs = [x.detach().clone().requires_grad_() for x in xs]
    y, h = fn(*xs)
    g = torch.Generator().manual_seed(9)
    r_y, r_h = (torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in (y, h))
    loss = sum(w * (t * r).sum() for w, t, r in zip(weights, (y, h), (r_y, r_h)) if w)
    grads = torch.autograd.grad(loss, xs, allow_unused=True)
    return [y, h, *(torch.zeros_like(x) if d is None else d for x, d in zip(xs, grads))]


def compiled(*xs):
    return ops.selective_scan(*xs)


@pytest.mark.parametrize("B, T, E, N", [(2, 37, 5, 4), (1, 1, 1, 1), (3, 70, 67, 16), (2, 2 * CHUNK, 16, 3),
                                        (1, CHUNK + 1, 1, 16)])
def test_values_and_every_gradient_equal_the_float64_recurrence(B, T, E, N, monkeypatch):
    xs = scan_inputs(B, T, E, N)
    calls = kernel_calls(monkeypatch, "selective_scan")
    got = run(compiled, [x.float() for x in xs])
    assert len(calls) == 1  # the C++ kernel ran
    want = run(sequential_scan, xs)
    for name, a, e in zip(NAMES, got, want):
        assert_close(a, e, kind="kernel", what=f"{name} (B={B} T={T} E={E} N={N})", dtype=torch.float32)
    with torch.no_grad():  # the forward without autograd (no states kept) gives the same values
        y, h = compiled(*[x.float() for x in xs])
    assert torch.equal(y, got[0]) and torch.equal(h, got[1])


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0)], ids=["outputs only", "final state only"])
def test_gradients_when_only_one_output_reaches_the_loss(weights):
    xs = scan_inputs(2, 45, 20, 8, seed=1)
    got, want = run(compiled, [x.float() for x in xs], weights), run(sequential_scan, xs, weights)
    for name, a, e in zip(NAMES[2:], got[2:], want[2:]):
        assert_close(a, e, kind="kernel", what=f"{name} with weights {weights}", dtype=torch.float32)


def test_two_halves_carry_the_state_like_the_whole():
    u, dt, A, B, C, h0 = (x.float() for x in scan_inputs(2, 50, 70, 16, seed=2))
    whole = run(compiled, [u, dt, A, B, C, h0])

    def halves(u, dt, A, B, C, h0):
        y1, h1 = ops.selective_scan(u[:, :23], dt[:, :23], A, B[:, :23], C[:, :23], h0)
        y2, h2 = ops.selective_scan(u[:, 23:], dt[:, 23:], A, B[:, 23:], C[:, 23:], h1)
        return torch.cat([y1, y2], dim=1), h2
    split = run(halves, [u, dt, A, B, C, h0])
    assert torch.equal(split[0], whole[0]) and torch.equal(split[1], whole[1])  # the same steps, in the same order
    for name, a, e in zip(NAMES[2:], split[2:], whole[2:]):
        assert_close(a, e, kind="kernel", what=f"{name} through the carried state", dtype=torch.float32)


def test_the_same_bits_on_any_thread_count():
    xs = [x.float() for x in scan_inputs(3, 100, 130, 16, seed=3)]  # above the one-thread threshold
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(run(compiled, xs))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_a_second_derivative_is_refused_not_wrong():
    xs = [x.float().requires_grad_() for x in scan_inputs(1, 5, 3, 2)]
    y, _ = ops.selective_scan(*xs)
    (du,) = torch.autograd.grad(y.square().sum(), xs[0], create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        du.sum().backward()


@pytest.mark.parametrize("form", ["chunked", "sequential"])
def test_the_mamba_cell_calls_it_and_matches_its_reference_form(form, monkeypatch):
    torch.manual_seed(0)
    cell = build_config(MambaCellConfig(form=form, chunk_size=5), BuildContext(dim=16, path="cell"), "cell")
    x = torch.randn(2, 29, 16, generator=torch.Generator().manual_seed(1))
    calls = kernel_calls(monkeypatch, "selective_scan")
    y, state = cell(x)
    assert calls == [(torch.float32, (2, 29, 32))]
    monkeypatch.setenv(ENV_FORCE, "reference")
    y_ref, state_ref = cell(x)
    assert len(calls) == 1  # forced: the reference form ran
    assert_close(y, y_ref, kind="kernel", what="cell output", dtype=torch.float32)
    assert_close(state.ssm, state_ref.ssm, kind="kernel", what="ssm state", dtype=torch.float32)


def test_other_dtypes_run_the_reference(monkeypatch):
    xs = scan_inputs(1, 4, 3, 2)
    calls = kernel_calls(monkeypatch, "selective_scan")
    ops.selective_scan(*xs)  # float64
    u, dt, A, B, C, h0 = xs
    ops.selective_scan(u.bfloat16(), dt.bfloat16(), A.float(), B.bfloat16(), C.bfloat16(), h0.float())  # as a bf16 cell
    assert calls == []


def test_bad_input_is_a_one_line_error_naming_what_is_allowed():
    u, dt, A, B, C, h0 = (x.float() for x in scan_inputs(2, 4, 3, 5))
    with pytest.raises(ValueError, match=r"^selective_scan: form 'parallel'; expected one of chunked, sequential$"):
        ops.selective_scan(u, dt, A, B, C, h0, form="parallel")
    with pytest.raises(ValueError, match=r"^selective_scan: .*A \(5, 3\).*; expected u, dt \[B, T, E\], A \[E, N\]"):
        ops.selective_scan(u, dt, A.T, B, C, h0)
    y, h = ops.selective_scan(u, dt, A, B, C)  # no initial state: zeros
    assert torch.equal(h, ops.selective_scan(u, dt, A, B, C, torch.zeros_like(h0))[1])
