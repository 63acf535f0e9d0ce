"""The mLSTM and causal-conv kernels that declare document boundaries (``Kernel.doc_starts``) keep packed
documents apart (the recurrent kernels' cases: test_packed_kernels.py): a packed batch equals each document run alone through the same backend (the kernel's own unpacked
form), outputs, final states and the gradients of all inputs, initial state included; 1e-10 of each
tensor's scale in float64, 1e-5 in float32 (measured: at most 1e-6 here). Rows: documents of length 1,
documents crossing chunk boundaries, several starts in one chunk, a start at 0 and at T-1, a row without
any. Then the dispatcher: packed calls skip a kernel that does not declare boundaries, a forced one runs
each document on its own, and ``explain`` says why.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.catalog import builtin_backends
from xlstm_zoo.backends.dispatch import ENV_FORCE, explain, select_packed
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.kernel import Backend, Kernel
from xlstm_zoo.backends.reference import reference_backend
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.registry import registry

T = 23
STARTS = [[1, 2, 8, 11], [0, 9, 10, T - 1], [], [3, 4, 5, 6, 7, 12, 20]]
B = len(STARTS)


def mask() -> torch.Tensor:
    starts = torch.zeros(B, T, dtype=torch.bool)
    for row, cuts in enumerate(STARTS):
        starts[row, cuts] = True
    return starts


def documents(row: int):
    edges = sorted({0, *STARTS[row]})
    return [(a, b, a in STARTS[row]) for a, b in zip(edges, edges[1:] + [T])]


def flat(state) -> list:
    return [] if state is None else [state] if isinstance(state, torch.Tensor) else list(state)


def close(got, want, what: str) -> None:
    tol = 1e-10 if want.dtype == torch.float64 else 1e-5
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= tol * scale + tol / 100, f"{what}: max abs err {err:.3g} > {tol} * {scale:.3g}"


def check_packed(run, series, axes, state, params) -> None:
    """``run(series, state, doc_starts) -> (out, state)``; ``series`` have the batch first and time at ``axes``."""
    leaves = [*series, *flat(state), *params]
    out, final = run(series, state, mask())
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (out, *flat(final))]
    grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip((out, *flat(final)), weights)), leaves,
                                allow_unused=True)
    alone, loss = torch.zeros_like(out), 0.0
    for row in range(B):
        row_state = None if state is None else type(state)(*(t[row:row + 1] for t in state))
        for a, b, fresh in documents(row):
            pieces = [t[row:row + 1].narrow(axis, a, b - a) for t, axis in zip(series, axes)]
            y, row_state = run(pieces, None if fresh else row_state, None)
            alone[row:row + 1].narrow(axes[0], a, b - a).copy_(y.detach())
            loss = loss + (y * weights[0][row:row + 1].narrow(axes[0], a, b - a)).sum()
        for i, (t, w) in enumerate(zip(flat(row_state), weights[1:])):
            close(flat(final)[i][row:row + 1].detach(), t.detach(), f"row {row} final state {i}")
            loss = loss + (t * w[row:row + 1]).sum()
    close(out.detach(), alone, "output")
    for i, (got, want) in enumerate(zip(grads, torch.autograd.grad(loss, leaves, allow_unused=True))):
        if want is not None or got is not None:
            close(got, want if want is not None else torch.zeros_like(got), f"gradient of input {i}")


def boundary_kernels(op: str):
    return [pytest.param(backend, kernel, id=f"{kernel.name}") for backend in builtin_backends()
            for kernel in backend.kernels if kernel.op == op and kernel.doc_starts]


def dtype_for(kernel: Kernel) -> torch.dtype:
    return torch.float64 if not kernel.dtypes or torch.float64 in kernel.dtypes else torch.float32


def require(backend: Backend) -> None:
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"backend {backend.name} unavailable here: {reason}")


@pytest.mark.parametrize("backend, kernel", boundary_kernels("mlstm"))
def test_mlstm_kernels_keep_documents_apart(backend, kernel):
    require(backend)
    dtype, H, Dk, Dv = dtype_for(kernel), 2, 5, 7
    g = torch.Generator().manual_seed(0)

    def draw(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale + shift).requires_grad_()

    q, k, v = draw(B, H, T, Dk), draw(B, H, T, Dk), draw(B, H, T, Dv)
    i_pre, f_pre = draw(B, H, T, scale=3.0), draw(B, H, T, scale=3.0, shift=2.0)
    state = ops.MLSTMState(draw(B, H, Dk, Dv), draw(B, H, Dk), draw(B, H))
    for chunk_size in ((4,) if kernel.form == "chunkwise" else (64,)):
        def run(series, state, doc_starts):
            return ops.mlstm_sequence(*series, state, gates=GateSchemes("exponential", "sigmoid"), form=kernel.form,
                                      chunk_size=chunk_size, backend=backend.name, doc_starts=doc_starts)
        check_packed(run, [q, k, v, i_pre, f_pre], [2, 2, 2, 2, 2], state, [])


class Window(NamedTuple):
    """The conv op's state as a state tuple: the K - 1 inputs before x."""

    x: torch.Tensor


@pytest.mark.parametrize("backend, kernel", boundary_kernels("causal_conv_silu"))
def test_causal_conv_kernels_keep_documents_apart(backend, kernel, monkeypatch):
    require(backend)
    monkeypatch.setenv(ENV_FORCE, backend.name)
    dtype, C, K = dtype_for(kernel), 6, 4
    g = torch.Generator().manual_seed(0)
    x, window = torch.randn(B, T, C, generator=g, dtype=dtype), torch.randn(B, K - 1, C, generator=g, dtype=dtype)
    weight, bias = torch.randn(C, K, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)
    for t in (x, window, weight, bias):
        t.requires_grad_()

    def run(series, state, doc_starts):  # the op returns no state; a document alone starts from zeros
        before = torch.zeros_like(window[:1]) if state is None else state.x
        return ops.causal_conv_silu(series[0], before, weight, bias, doc_starts), None

    check_packed(run, [x], [1], Window(window), [weight, bias])


class _NoBoundariesConfig(ZooConfig):
    type: Literal["no_boundaries"] = "no_boundaries"


@pytest.fixture
def no_boundaries():
    """The reference mLSTM kernels declared without boundaries, above every built-in backend."""
    kernels = tuple(Kernel(k.op, k.form, "no_boundaries", k.run) for k in reference_backend().kernels
                    if k.op == "mlstm")
    registry.register(kind="backend", name="no_boundaries", config=_NoBoundariesConfig, description="test",
                      builder=lambda c: Backend(name="no_boundaries", priority=1000, kernels=kernels))
    yield
    registry.unregister("backend", "no_boundaries")


def test_packed_calls_go_to_a_kernel_that_keeps_documents_apart(no_boundaries):
    cpu = torch.device("cpu")
    chosen, native = select_packed("mlstm_sequence", cpu, torch.float64, form="chunkwise", chunk_size=4)
    assert native and chosen.name != "no_boundaries"
    assert ops.select("mlstm_sequence", cpu, torch.float64, form="chunkwise", chunk_size=4).name == "no_boundaries"
    statuses = {name: status for name, _, status in explain("mlstm_sequence", cpu, torch.float64, form="chunkwise",
                                                            chunk_size=4, doc_starts=True)}
    assert statuses["no_boundaries"] == "its mlstm_sequence kernel does not take document boundaries (doc_starts)"
    forced, native = select_packed("mlstm_sequence", cpu, torch.float64, force="no_boundaries", form="chunkwise",
                                   chunk_size=4)
    assert forced.name == "no_boundaries" and not native


def test_a_forced_backend_without_boundaries_runs_each_document_alone(no_boundaries):
    g = torch.Generator().manual_seed(0)
    H, Dk, Dv = 2, 3, 4
    q, k = torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64), torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    i_pre, f_pre = torch.randn(B, H, T, generator=g, dtype=torch.float64), torch.randn(B, H, T, generator=g, dtype=torch.float64)
    state = ops.MLSTMState(*(torch.randn(*s, generator=g, dtype=torch.float64) for s in ((B, H, Dk, Dv), (B, H, Dk), (B, H))))
    got = ops.mlstm_sequence(q, k, v, i_pre, f_pre, state, chunk_size=4, backend="no_boundaries", doc_starts=mask())
    want = ops.mlstm_sequence(q, k, v, i_pre, f_pre, state, chunk_size=4, backend="reference", doc_starts=mask())
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        close(a, b, "per-document fallback")
