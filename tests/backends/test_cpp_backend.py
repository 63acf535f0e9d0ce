"""The ``cpp`` backend (the sLSTM forward loop compiled from C++): low precision, its contract with the fused
loop, and its build: cache, warn-once fallback when the compiler fails, dispatch. Float64 parity with the
reference is in tests/backends/test_kernel_parity.py."""

import warnings

import pytest
import torch
from gate_inputs import make_inputs, random_slstm_state

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.slstm import forward_loop
from xlstm_zoo.backends.cpp.slstm import slstm_sequence as cpp_slstm
from xlstm_zoo.backends.dispatch import select
from xlstm_zoo.backends.fused.slstm import forward_loop as fused_forward_loop
from xlstm_zoo.backends.fused.time_major import to_time_major
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.slstm import slstm_sequence as reference_slstm
from xlstm_zoo.backends.states import SLSTMState
from xlstm_zoo.tolerances import assert_close

needs_compiler = pytest.mark.skipif(build.environment_reason() is not None,
                                    reason=f"C++ loop not buildable here: {build.environment_reason()}")


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A build state that has not tried yet, caching into a temporary folder; the dispatcher's memo of
    its choices is swapped for an empty one too (and both restored afterwards)."""
    from xlstm_zoo.backends import dispatch

    monkeypatch.setattr(dispatch, "_cache", {})
    monkeypatch.setenv("XLSTM_ZOO_CACHE_DIR", str(tmp_path))
    state = build.Build()
    monkeypatch.setattr(build, "_build", state)
    return state


# Parity with the reference in float64 (outputs, final states, every gradient) is the kernel parity
# harness's: tests/backends/test_kernel_parity.py (slstm.sequence--cpp).


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_low_precision_matches_reference(dtype):
    wx, R = make_inputs(2, 4, 40, 8, dtype=dtype)
    h, s = cpp_slstm(wx, R, None, gates=GateSchemes())
    h_ref, s_ref = reference_slstm(wx.double(), R.double(), None, gates=GateSchemes())
    assert h.dtype == dtype
    for name, a, b in zip(["h", "c", "n", "m", "h_T"], [h, *s], [h_ref, *s_ref]):
        if dtype == torch.bfloat16:
            assert_close(a.double(), b, kind="kernel", dtype=dtype, what=f"{name} vs float64")
        else:  # an fp32 loop against a float64 reference over 40 steps, elementwise: twice the fp32 kernel bound
            torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-4)


@needs_compiler
def test_fills_the_same_buffers_as_the_fused_loop():
    """Same contract as the fused forward loop, so the fused backward can use what it saved."""
    wx, R = make_inputs(2, 3, 11, 4, dtype=torch.float64)
    state = random_slstm_state(2, 3, 4)
    W = to_time_major(wx, wx.dtype)
    for ours, theirs in zip(forward_loop(W, R, *state, True, False), fused_forward_loop(W, R, *state, True, False)):
        assert ours.shape == theirs.shape
        assert_close(ours, theirs, kind="kernel", what="buffer vs the fused loop's", check_dtype=True)


@needs_compiler
def test_thread_count_does_not_change_the_result():
    wx, R = make_inputs(3, 4, 20, 6)
    W = to_time_major(wx, wx.dtype)
    zero = torch.zeros(3, 4, 6)
    m0 = torch.full_like(zero, float("-inf"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = forward_loop(W, R, zero, zero, m0, zero, True, False)
        torch.set_num_threads(3)
        three = forward_loop(W, R, zero, zero, m0, zero, True, False)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


@needs_compiler
def test_rejects_what_it_cannot_run():
    W = torch.zeros(2, 1, 1, 4, dtype=torch.float16)
    zero = torch.zeros(1, 1, 1)
    with pytest.raises(ValueError, match="float32/float64 CPU"):
        forward_loop(W, torch.zeros(1, 1, 4), zero, zero, zero, zero, True, True)


@needs_compiler
def test_builds_once_and_reuses_the_cache(fresh_build, capfd):
    assert fresh_build.get()[1] is None
    assert "compiling the C++ sLSTM loop" in capfd.readouterr().err
    path = build.cache_path()
    assert path.is_file() and str(path).startswith(str(build.Path(build.os.environ["XLSTM_ZOO_CACHE_DIR"])))
    second = build.Build()  # another process: finds the cached library, prints nothing
    assert second.get()[1] is None
    assert "compiling" not in capfd.readouterr().err


def test_failed_build_warns_once_and_dispatch_falls_back(fresh_build, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    wx, R = make_inputs(1, 2, 5, 3)
    with pytest.warns(build.CppBuildWarning, match="falls back to the fused PyTorch loop"):
        assert select("slstm_sequence", torch.device("cpu"), torch.float32).name == "fused"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call must not warn again
        h, _ = ops.slstm_sequence(wx, R, None, gates=GateSchemes())
    assert h.shape == (1, 2, 5, 3)
    assert fresh_build.error.startswith("compile failed:")
    with pytest.raises(Exception, match="compile failed"):
        ops.slstm_sequence(wx, R, None, gates=GateSchemes(), backend="cpp")


def test_compiler_errors_are_reported_in_a_few_lines(fresh_build, monkeypatch, tmp_path):
    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(build, "SOURCE", bad)
    if build.environment_reason() is not None:
        pytest.skip(build.environment_reason())
    with pytest.warns(build.CppBuildWarning) as record:
        _, error = fresh_build.get()
    assert error.startswith("compile failed:") and "error" in error.lower() and error.count(" | ") <= 2, error
    assert len(record) == 1
    assert not list(build.cache_path().parent.glob("*.so")), "a failed build must leave no library behind"


@needs_compiler
def test_dispatch_prefers_cpp_on_cpu_only():
    assert select("slstm_sequence", torch.device("cpu"), torch.float32).name == "cpp"
    assert select("slstm_sequence", torch.device("cpu"), torch.bfloat16).name == "cpp"
    assert select("lstm_sequence", torch.device("cpu"), torch.float32).name == "fused"
    assert not select("slstm_step", torch.device("cpu"), torch.float32).name == "cpp"


@needs_compiler
def test_state_roundtrip_continues_the_sequence():
    """Running T tokens at once equals running them in two pieces with the state carried over."""
    wx, R = make_inputs(2, 2, 10, 4, dtype=torch.float64)
    gates = GateSchemes()
    h_all, s_all = ops.slstm_sequence(wx, R, None, gates=gates, backend="cpp")
    h1, s1 = ops.slstm_sequence(wx[:, :, :6], R, None, gates=gates, backend="cpp")
    h2, s2 = ops.slstm_sequence(wx[:, :, 6:], R, s1, gates=gates, backend="cpp")
    # one loop, the same sums in the same order: tighter than the policy's float64 form bound
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h_all, rtol=1e-12, atol=1e-12)
    for a, b in zip(s2, s_all):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert isinstance(s2, SLSTMState)
