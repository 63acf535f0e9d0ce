"""The cpp backend's generation-step kernels: a step's linear maps (``linear.step--cpp``) and the mLSTM
step (``mlstm.step--cpp``), and the layer that routes a step's projections to the first.

Their values against the reference are in ``test_kernel_parity.py``; here: what the harness does not
cover. Thread-count independence, strided operands, the state passed in left untouched, the fallbacks
(autograd, other dtypes, torch.compile, a forced backend) and clear errors.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp import linear as cpp_linear
from xlstm_zoo.backends.cpp.linear import linear_step
from xlstm_zoo.backends.cpp.mlstm import mlstm_step
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm import mlstm_step as reference_step
from xlstm_zoo.layers import Linear
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_linear_step_is_the_same_on_one_thread_and_two(rows):
    # Large enough to be split over threads (each 64-column panel is one thread's): the same dot products.
    x, W, b = randn(rows, 300, seed=1), randn(700, 300, seed=2), randn(700, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = linear_step(x, W, b)
        torch.set_num_threads(2)
        two = linear_step(x, W, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert_close(one, F.linear(x, W, b), kind="kernel", what="y", dtype=torch.float32)


def test_linear_step_takes_strided_operands_and_leading_dims():
    x = randn(3, 2, 40, seed=4)[:, :, ::2]          # [3, 2, 20], strided
    W = randn(20, 33, seed=5).t()                   # [33, 20], transposed view
    b = randn(66, seed=6)[::2]                      # [33], strided
    y = linear_step(x, W, b)
    assert y.shape == (3, 2, 33)
    assert_close(y, F.linear(x, W, b), kind="kernel", what="y", dtype=torch.float32)
    assert_close(linear_step(x, W), F.linear(x, W), kind="kernel", what="y without bias", dtype=torch.float32)


def test_linear_step_names_bad_shapes():
    with pytest.raises(ValueError, match=r"linear_step: x \(2, 5\), weight \(3, 4\).*expected x \[\.\.\., K\]"):
        linear_step(randn(2, 5), randn(3, 4))
    with pytest.raises(ValueError, match=r"bias \(4,\)"):
        linear_step(randn(2, 4), randn(3, 4), randn(4))


def step_inputs(B=3, H=2, Dk=37, Dv=45, seed=0):
    q, k = randn(B, H, Dk, seed=seed), randn(B, H, Dk, seed=seed + 1)
    v = randn(B, H, Dv, seed=seed + 2)
    i_pre, f_pre = randn(B, H, seed=seed + 3) * 3, randn(B, H, seed=seed + 4) + 3
    state = ops.MLSTMState(randn(B, H, Dk, Dv, seed=seed + 5), randn(B, H, Dk, seed=seed + 6),
                           randn(B, H, seed=seed + 7))
    return (q, k, v, i_pre, f_pre), state


def test_mlstm_step_leaves_the_state_passed_in_as_it_was():
    inputs, state = step_inputs()
    before = [s.clone() for s in state]
    with torch.no_grad():
        h, new = mlstm_step(*inputs, state)
    assert all(torch.equal(a, b) for a, b in zip(state, before))
    assert all(n.data_ptr() != s.data_ptr() for n, s in zip(new, state))
    want_h, want = reference_step(*inputs, state)
    assert_close(h, want_h, kind="kernel", what="h", dtype=torch.float32)
    for name, a, e in zip("Cnm", new, want):
        assert_close(a, e, kind="kernel", what=name, dtype=torch.float32)


def test_mlstm_step_is_the_same_on_one_thread_and_two():
    inputs, state = step_inputs(B=8, H=4, Dk=64, Dv=64)  # above the size that stays on one thread
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mlstm_step(*inputs, state)
        torch.set_num_threads(2)
        two = mlstm_step(*inputs, state)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and all(torch.equal(a, b) for a, b in zip(one[1], two[1]))


def test_mlstm_step_with_autograd_is_the_reference_step():
    inputs, state = step_inputs(seed=3)
    leaves = [t.clone().requires_grad_() for t in inputs]
    h, _ = mlstm_step(*leaves, state, gates=GateSchemes("sigmoid", "sigmoid"))
    assert h.grad_fn is not None, "with autograd on, the step must be differentiable"
    got = torch.autograd.grad(h.sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in inputs]
    want = torch.autograd.grad(reference_step(*ref_leaves, state, gates=GateSchemes("sigmoid", "sigmoid"))[0].sum(),
                               ref_leaves)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_mlstm_step_names_bad_shapes():
    (q, k, v, i_pre, f_pre), state = step_inputs()
    with pytest.raises(ValueError, match=r"mlstm_step: bad shapes .* expected q, k \[B,H,Dk\]"):
        mlstm_step(q, k[:, :, :-1], v, i_pre, f_pre, state)
    with pytest.raises(ValueError, match=r"initial state C has shape"):
        mlstm_step(q, k, v, i_pre, f_pre, ops.MLSTMState(state.C[:, :, :-1], state.n, state.m))


def test_mlstm_step_under_torch_compile_runs_the_reference():
    inputs, state = step_inputs(B=1, H=1, Dk=8, Dv=8)
    compiled = torch.compile(lambda *a: mlstm_step(*a, state)[0], backend="eager", fullgraph=True)
    # fullgraph: a data pointer handed to C++ under the compiler would be an error, not a graph break.
    assert_close(compiled(*inputs), reference_step(*inputs, state)[0], kind="kernel", what="h", dtype=torch.float32)


LARGE = cpp_linear.LINEAR_STEP_MIN_WEIGHTS  # the loop's smallest weight: 1024 x 1024 floats


def routed(layer, x, monkeypatch) -> bool:
    """Whether ``layer(x)`` ran the cpp ``linear_step`` kernel (watched for the call)."""
    calls = kernel_calls(monkeypatch, "linear_step")
    layer(x)
    return bool(calls)


def test_linear_routes_only_a_steps_inference_calls_with_a_large_weight(monkeypatch):
    assert 1024 * 1024 == LARGE
    torch.manual_seed(0)
    layer = Linear(1024, 1024)
    plain = torch.nn.Linear(1024, 1024)
    assert list(layer.state_dict()) == list(plain.state_dict()), "the same parameters as nn.Linear"
    step, sequence = randn(3, 1024), randn(3, 5, 1024)
    with torch.no_grad():
        assert routed(layer, step, monkeypatch)
        assert not routed(layer, sequence, monkeypatch)
        assert not routed(layer, randn(1, 1024), monkeypatch), "one row: torch's matrix-vector product"
        assert not routed(layer, randn(9, 1024), monkeypatch), "more rows than the kernel's limit"
        assert_close(layer(step), F.linear(step, layer.weight, layer.bias), kind="kernel", what="y",
                     dtype=torch.float32)
    assert not routed(layer, step, monkeypatch), "training calls keep autograd"
    layer(step).sum().backward()
    assert layer.weight.grad is not None
    monkeypatch.setenv(ENV_FORCE, "fused")  # a forced backend without the op: the reference runs it
    with torch.no_grad():
        assert not routed(layer, step, monkeypatch)
        assert torch.equal(layer(step), F.linear(step, layer.weight, layer.bias))


def test_linear_leaves_weights_below_the_kernels_limit_to_torch(monkeypatch):
    layer, step = Linear(1023, 1024), randn(3, 1023)  # one column short of the limit
    assert layer.weight.numel() < LARGE
    with torch.no_grad():
        assert not routed(layer, step, monkeypatch)
        assert torch.equal(layer(step), F.linear(step, layer.weight, layer.bias))


@pytest.mark.parametrize("in_features, routed_to_kernel", [(1024, True), (24, False)])
def test_linear_under_torch_compile_calls_the_kernel_as_an_opaque_op(in_features, routed_to_kernel):
    torch.manual_seed(0)
    layer, x = Linear(in_features, 1024), randn(3, in_features)
    with torch.no_grad():  # fullgraph: a graph break (e.g. in the dispatcher) would be an error
        graphs = []
        compiled = torch.compile(layer, fullgraph=True, backend=lambda gm, _: graphs.append(gm) or gm.forward)
        y = compiled(x)
    called = any("xlstm_zoo.linear_step" in str(node.target) for gm in graphs for node in gm.graph.nodes)
    assert called == routed_to_kernel
    assert_close(y, F.linear(x, layer.weight, layer.bias), kind="kernel", what="y", dtype=torch.float32)


def test_linear_step_leaves_other_dtypes_to_f_linear():
    x, W = randn(2, 8), randn(5, 8)
    assert torch.equal(linear_step(x.double(), W.double()), F.linear(x.double(), W.double()))
    with pytest.raises(RuntimeError):  # F.linear's own dtype error, not float32 reads of bfloat16 memory
        linear_step(x, W.bfloat16())
