"""Parity of the reference mLSTM ops with the official ``mlstm_kernels`` native PyTorch kernels.

Conventions found in mlstm_kernels 2.0.6 (and matched here through our arguments):
- gates: exponential input gate (``log i = i_pre``), ``logsigmoid`` forget gate -> our default
  ``GateSchemes("exponential", "sigmoid")``; their ``siging`` kernels use a sigmoid input gate.
- scale ``Dk ** -0.5``, fixed (not an argument of these wrappers): the step kernel and the
  chunkwise kernel multiply q, the parallel kernel multiplies the q.k product. Same numbers as our
  ``qk_scale=None``, which multiplies q.
- readout ``h = C^T q / (max(|n.q|, exp(-m)) + eps)``: eps added to the stabilised denominator,
  exactly as ours, default 1e-6.
- zero state m = 0 (step, sequence and chunkwise kernels), like ours. Their parallel kernel takes
  no state and stabilises each row with the largest decay term only, i.e. it behaves as if the
  empty initial memory had m = -inf. The readout is independent of m except through eps (eps is
  eps * exp(m) in true units), so with eps = 0 it matches ours exactly, and with eps = 1e-6 to
  within ~eps * exp(m).
- their m states are ``[B, NH, 1]``; ours are ``[B, H]``.
- their ``*_custbw`` kernels have a hand-written backward that holds the normaliser
  ``max(|n.q|, exp(-m))`` and the stabiliser m constant (stop-gradient). Their gradients are not
  the gradients of their own forward (they differ from their ``*_autograd`` twins by O(10) on
  q, k, i, f here), so only their forward outputs are compared; gradients are compared with the
  ``*_autograd`` kernels, which differentiate the same forward exactly.
"""

from __future__ import annotations

import pytest
import torch
from mlstm_kernels.torch import get_mlstm_kernel, get_mlstm_sequence_kernel, get_mlstm_step_kernel

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.states import MLSTMState

THEIR_GATES = GateSchemes("exponential", "sigmoid")
# docs/testing.md: kernels vs reference in fp32 ~1e-4, taken elementwise here against the official
# package (the policy's kernel bound is relative to each tensor's scale, which would be looser).
RTOL, ATOL = 1e-4, 1e-4
OUR_FORMS = [("recurrent", 64), ("parallel", 64), ("chunkwise", 16), ("chunkwise", 5)]


def make_inputs(B, H, T, Dk, Dv, *, seed, with_state):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for d in (Dk, Dk, Dv))
    i_pre = torch.randn(B, H, T, generator=g)
    f_pre = torch.randn(B, H, T, generator=g) + 2.0  # f ~ 0.88, a long memory
    state = MLSTMState(torch.randn(B, H, Dk, Dv, generator=g), torch.randn(B, H, Dk, generator=g),
                       torch.randn(B, H, generator=g)) if with_state else None
    return q, k, v, i_pre, f_pre, state


def leaves_of(q, k, v, i_pre, f_pre, state):
    return [q, k, v, i_pre, f_pre] + (list(state) if state is not None else [])


def fresh(tensors):
    return [x.detach().clone().requires_grad_(True) for x in tensors]


def close(actual, expected, what, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def loss_of(*outputs, seed=321):
    g = torch.Generator().manual_seed(seed)
    return sum((x * torch.randn(x.shape, generator=g)).sum() for x in outputs)


NAMES = ("q", "k", "v", "i_pre", "f_pre", "C0", "n0", "m0")


def exact_backward(kernel: str) -> bool:
    """True for kernels whose backward is autograd through their forward (see module docstring)."""
    return kernel.endswith("autograd")


def compare_grads(ours, theirs, what, rtol=RTOL, atol=ATOL):
    assert len(ours) == len(theirs)
    for name, a, b in zip(NAMES, ours, theirs):
        assert b is not None, f"{what}: mlstm_kernels returned no gradient for {name}"
        close(a, b, f"{what}: d/d{name}", rtol, atol)


# parallel ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["native_autograd", "native_custbw"])
@pytest.mark.parametrize("eps", [0.0, 1e-6], ids=["eps=0", "eps=1e-6"])
def test_parallel_kernel(kernel, eps):
    # Their parallel kernel has no state: compare from the zero state, T odd, odd head dims.
    theirs_fn = get_mlstm_kernel(f"parallel--{kernel}")
    inputs = make_inputs(2, 3, 33, 5, 7, seed=0, with_state=False)
    x_theirs = fresh(leaves_of(*inputs))
    h_theirs = theirs_fn(*x_theirs, eps=eps)
    g_theirs = torch.autograd.grad(loss_of(h_theirs), x_theirs) if exact_backward(kernel) else None
    for form, cs in OUR_FORMS:
        x_ours = fresh(leaves_of(*inputs))
        h, _ = mlstm_sequence(*x_ours, None, gates=THEIR_GATES, eps=eps, form=form, chunk_size=cs)
        what = f"ours {form}(chunk={cs}) vs parallel--{kernel}, eps={eps}"
        close(h, h_theirs, f"{what}: h")
        if exact_backward(kernel):
            compare_grads(torch.autograd.grad(loss_of(h), x_ours), g_theirs, what)


@pytest.mark.parametrize("kernel", ["native_siging_autograd", "native_siging_custbw"])
def test_parallel_sigmoid_input_gate_kernel(kernel):
    # Their sigmoid-input-gate kernel is un-stabilised (floor 1, eps on the true denominator), so
    # with eps = 0 it is the same function as ours with GateSchemes("sigmoid", "sigmoid").
    theirs_fn = get_mlstm_kernel(f"parallel--{kernel}")
    inputs = make_inputs(2, 3, 33, 5, 7, seed=1, with_state=False)
    x_theirs = fresh(leaves_of(*inputs))
    h_theirs = theirs_fn(*x_theirs, eps=0.0)
    g_theirs = torch.autograd.grad(loss_of(h_theirs), x_theirs) if exact_backward(kernel) else None
    for form, cs in OUR_FORMS:
        x_ours = fresh(leaves_of(*inputs))
        h, _ = mlstm_sequence(*x_ours, None, gates=GateSchemes("sigmoid", "sigmoid"), eps=0.0, form=form, chunk_size=cs)
        what = f"ours {form}(chunk={cs}) vs parallel--{kernel}"
        close(h, h_theirs, f"{what}: h")
        if exact_backward(kernel):
            compare_grads(torch.autograd.grad(loss_of(h), x_ours), g_theirs, what)


# chunkwise (with initial and final state) ---------------------------------------------------------

@pytest.mark.parametrize("kernel", ["native_autograd", "native_custbw"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
@pytest.mark.parametrize("eps", [1e-6, 1e-2], ids=["eps=1e-6", "eps=1e-2"])
def test_chunkwise_kernel(kernel, with_state, eps):
    # Their chunkwise kernel needs T divisible by its chunk size; ours does not, so our chunkwise
    # runs with a chunk size that leaves a tail. A large eps exposes any difference in where eps
    # enters the denominator (it scales with exp(m)).
    theirs_fn = get_mlstm_kernel(f"chunkwise--{kernel}")
    inputs = make_inputs(2, 3, 64, 5, 7, seed=2, with_state=with_state)
    x_theirs = fresh(leaves_of(*inputs))
    init = {}
    if with_state:
        C0, n0, m0 = x_theirs[5:]
        init = dict(c_initial=C0, n_initial=n0, m_initial=m0[..., None])
    h_theirs, (C_t, n_t, m_t) = theirs_fn(*x_theirs[:5], **init, return_last_states=True, eps=eps, chunk_size=16)
    g_theirs = (torch.autograd.grad(loss_of(h_theirs, C_t, n_t, m_t.squeeze(-1)), x_theirs)
                if exact_backward(kernel) else None)
    for form, cs in OUR_FORMS:
        x_ours = fresh(leaves_of(*inputs))
        state = MLSTMState(*x_ours[5:]) if with_state else None
        h, (C, n, m) = mlstm_sequence(*x_ours[:5], state, gates=THEIR_GATES, eps=eps, form=form, chunk_size=cs)
        what = f"ours {form}(chunk={cs}) vs chunkwise--{kernel}, eps={eps}"
        close(h, h_theirs, f"{what}: h")
        # Both stabilise with the running max of log weights from m0 (0 for the zero state),
        # so the stabilised states compare directly.
        close(C, C_t, f"{what}: final C")
        close(n, n_t, f"{what}: final n")
        close(m, m_t.squeeze(-1), f"{what}: final m")
        if exact_backward(kernel):
            compare_grads(torch.autograd.grad(loss_of(h, C, n, m), x_ours), g_theirs, what)


# recurrent sequence and step ----------------------------------------------------------------------

@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
@pytest.mark.parametrize("eps", [1e-6, 1e-2], ids=["eps=1e-6", "eps=1e-2"])
def test_native_sequence_kernel(with_state, eps):
    theirs_fn = get_mlstm_sequence_kernel("native_sequence__native")
    q, k, v, i_pre, f_pre, state = make_inputs(2, 3, 33, 5, 7, seed=3, with_state=with_state)
    init = dict(c_initial=state.C, n_initial=state.n, m_initial=state.m[..., None]) if with_state else {}
    h_theirs, (C_t, n_t, m_t) = theirs_fn(q, k, v, i_pre, f_pre, **init, return_last_states=True, eps=eps)
    for form, cs in OUR_FORMS:
        h, (C, n, m) = mlstm_sequence(q, k, v, i_pre, f_pre, state, gates=THEIR_GATES, eps=eps, form=form, chunk_size=cs)
        what = f"ours {form}(chunk={cs}) vs native_sequence__native, eps={eps}"
        close(h, h_theirs, f"{what}: h")
        close(C, C_t, f"{what}: final C")
        close(n, n_t, f"{what}: final n")
        close(m, m_t.squeeze(-1), f"{what}: final m")


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
def test_native_step_kernel(with_state):
    theirs_fn = get_mlstm_step_kernel("native")
    B, H, Dk, Dv = 2, 3, 5, 7
    q, k, v, i_pre, f_pre, state = make_inputs(B, H, 1, Dk, Dv, seed=4, with_state=with_state)
    q, k, v, i_pre, f_pre = (x[:, :, 0] for x in (q, k, v, i_pre, f_pre))
    if state is None:  # their step has no default state; the zero state is C = n = 0, m = 0 for both
        state_t = MLSTMState.zeros(B, H, Dk, Dv)
    else:
        state_t = state
    h_theirs, (C_t, n_t, m_t) = theirs_fn(q, k, v, i_pre[..., None], f_pre[..., None],
                                          state_t.C, state_t.n, state_t.m[..., None], eps=1e-6)
    h, (C, n, m) = mlstm_step(q, k, v, i_pre, f_pre, state, gates=THEIR_GATES, eps=1e-6)
    close(h, h_theirs, "step h vs native step")
    close(C, C_t, "step C vs native step")
    close(n, n_t, "step n vs native step")
    close(m, m_t.squeeze(-1), "step m vs native step")
