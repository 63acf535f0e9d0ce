"""The ``cpp`` backend (the sLSTM and LSTM forward and backward loops compiled from C++): low precision, its contracts
with the fused loops, and its build: cache, vector-maths fallback, warn-once fallback when the compiler fails,
dispatch. Float64 parity with the reference (outputs, states, every gradient) is in
tests/backends/test_kernel_parity.py."""

import warnings

import pytest
import torch
from gate_inputs import ALL_GATES, make_inputs, random_slstm_state

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.slstm import backward_loop, forward_loop
from xlstm_zoo.backends.cpp.slstm import slstm_sequence as cpp_slstm
from xlstm_zoo.backends.dispatch import select
from xlstm_zoo.backends.fused.slstm import forward_loop as fused_forward_loop
from xlstm_zoo.backends.fused.slstm import slstm_backward as fused_backward
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


def _backward_inputs(gates, B=2, H=3, T=11, Dh=5, *, final_grads=True, seed=0):
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=seed)
    state = random_slstm_state(B, H, Dh)
    ie, fe = gates.input == "exponential", gates.forget == "exponential"
    G, CNs, Ms, Hs = fused_forward_loop(to_time_major(wx, wx.dtype), R, *state, ie, fe)
    g = torch.Generator().manual_seed(seed + 7)
    dh_all = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)
    finals = [torch.randn(B, H, Dh, generator=g, dtype=torch.float64) if final_grads else None for _ in range(4)]
    return (G, R, *CNs.unbind(1), Ms, Hs, ie, fe, dh_all, *finals)


@needs_compiler
@pytest.mark.parametrize("final_grads", [True, False], ids=["final-state-grads", "none"])
@pytest.mark.parametrize("gates", ALL_GATES, ids=lambda g: f"{g.input[:3]}-{g.forget[:3]}")
def test_backward_matches_the_fused_backward(gates, final_grads):
    """Same gradients as the fused PyTorch backward, for every gate scheme, with and without gradients on
    the final state (None means zeros)."""
    args = _backward_inputs(gates, final_grads=final_grads)
    names = ["dwx", "dR", "dc0", "dn0", "dm0", "dh0"]
    for name, ours, theirs in zip(names, backward_loop(*args), fused_backward(*args)):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


@needs_compiler
def test_backward_splits_ties_of_the_stabiliser_like_torch_maximum():
    """Where log f + m_prev equals log i exactly, torch.maximum's backward gives half the gradient to each
    side; the loop must too. The tie is at the last token, where the final state's dm reaches it (at an
    earlier tie m's gradient is zero, since the outputs do not depend on the stabiliser)."""
    gates = GateSchemes("exponential", "exponential")
    wx, R = make_inputs(1, 1, 1, 2, dtype=torch.float64)
    wx[..., 0:2] = 0.5                     # log i = 0.5
    wx[..., 2:4] = -0.25                   # log f
    zero = torch.zeros(1, 1, 2, dtype=torch.float64)
    m0 = torch.full_like(zero, 0.75)       # log f + m0 = 0.5 = log i, a tie
    G, CNs, Ms, Hs = forward_loop(to_time_major(wx, wx.dtype), torch.zeros_like(R), zero + 0.3, zero + 1, m0,
                                  zero, True, True)
    dh = torch.ones(1, 1, 1, 2, dtype=torch.float64)
    args = (G, R, *CNs.unbind(1), Ms, Hs, True, True, dh, None, None, torch.ones_like(zero), None)
    ours, theirs = backward_loop(*args), fused_backward(*args)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the half of m's own gradient that the tie sends to log f + m_prev reaches m0
    assert ours[4].abs().min() > 0.1


@needs_compiler
def test_backward_thread_count_does_not_change_the_result():
    args = _backward_inputs(GateSchemes(), B=3, H=4, T=9, Dh=6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backward_loop(*args)
        torch.set_num_threads(3)
        three = backward_loop(*args)
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
    with pytest.raises(ValueError, match="float32/float64 CPU"):
        backward_loop(W, torch.zeros(1, 1, 4), *(torch.zeros(3, 1, 1, 1, dtype=torch.float16),) * 4, True, True,
                      None, None, None, None, None)


@pytest.mark.slow  # compiles the C++ library afresh (20-65 s)
@needs_compiler
def test_builds_once_and_reuses_the_cache(fresh_build, capfd):
    assert fresh_build.get()[1] is None
    assert "compiling the C++ kernels" in capfd.readouterr().err
    path = build.cache_path()
    assert path.is_file() and str(path).startswith(str(build.Path(build.os.environ["XLSTM_ZOO_CACHE_DIR"])))
    target = build.cpu_target()
    suffix = "" if target == "native" else f", for {target} (XLSTM_ZOO_CPU_TARGET)"
    assert build.built_with() in [f"{maths}, {threads}{suffix}" for maths in ("vector maths (glibc libmvec)",
                                                                              "plain maths (no vector maths library)")
                                  for threads in ("OpenMP threads", "own threads (no OpenMP)")]
    second = build.Build()  # another process: finds the cached library, prints nothing
    assert second.get()[1] is None
    assert "compiling" not in capfd.readouterr().err


@pytest.mark.slow  # compiles the C++ library afresh (20-65 s)
@needs_compiler
def test_without_vector_maths_the_next_flag_set_builds(fresh_build, monkeypatch):
    """A toolchain without glibc's vector maths library (another libc, another platform) fails the flag
    sets that use it at link time; a plain build after them must still give a working library, with no warning."""
    missing = ["-lxlstm_zoo_no_such_library", "-Wl,-z,defs"]
    sets = tuple((flags, missing if build.VECTOR_MATH[0] in flags else libraries) for flags, libraries in build.flag_sets())
    monkeypatch.setattr(build, "flag_sets", lambda: sets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh_build.get()[1] is None
    assert build.built_with().startswith("plain")  # what `xlstm-zoo doctor` reports
    wx, R = make_inputs(2, 2, 7, 3, dtype=torch.float64)
    h, _ = ops.slstm_sequence(wx, R, None, gates=GateSchemes(), backend="cpp")
    torch.testing.assert_close(h, reference_slstm(wx, R, None, gates=GateSchemes())[0], rtol=1e-12, atol=1e-12)


def test_failed_build_warns_once_and_dispatch_falls_back(fresh_build, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    wx, R = make_inputs(1, 2, 5, 3)
    with pytest.warns(build.CppBuildWarning, match="fall back to the fused PyTorch loops"):
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
    monkeypatch.setattr(build, "SOURCES", (bad,))
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
    assert select("lstm_sequence", torch.device("cpu"), torch.float32).name == "cpp"
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


# -- the LSTM loops ------------------------------------------------------------------------------------

@needs_compiler
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "state"])
def test_lstm_matches_the_fused_loop_with_gradients(with_state):
    """Outputs, final state and every gradient (W x, R, initial state) equal the fused PyTorch loop's, with
    gradients reaching the final state too."""
    from xlstm_zoo.backends.cpp.lstm import lstm_sequence as cpp_lstm
    from xlstm_zoo.backends.fused.lstm import lstm_sequence as fused_lstm
    from xlstm_zoo.backends.states import LSTMState

    B, H, T, Dh = 3, 2, 17, 5
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    state = LSTMState(*(torch.randn(B, H, Dh, generator=g, dtype=torch.float64) for _ in range(2))) if with_state else None
    weights = [torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)] + \
              [torch.randn(B, H, Dh, generator=g, dtype=torch.float64) for _ in range(2)]

    def run(fn):
        leaves = [wx.clone().requires_grad_(), R.clone().requires_grad_()]
        s = LSTMState(*(x.clone().requires_grad_() for x in state)) if with_state else None
        h, final = fn(leaves[0], leaves[1], s)
        loss = sum((a * w).sum() for a, w in zip([h, *final], weights))
        inputs = leaves + (list(s) if with_state else [])
        return [h, *final], torch.autograd.grad(loss, inputs)

    (ours, our_grads), (theirs, their_grads) = run(cpp_lstm), run(fused_lstm)
    for a, b in zip([*ours, *our_grads], [*theirs, *their_grads]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@needs_compiler
def test_lstm_low_precision_and_threads():
    from xlstm_zoo.backends.cpp.lstm import lstm_sequence as cpp_lstm
    from xlstm_zoo.backends.reference.lstm import lstm_sequence as reference_lstm

    wx, R = make_inputs(2, 4, 40, 8, dtype=torch.bfloat16)
    h, s = cpp_lstm(wx, R, None)
    h_ref, s_ref = reference_lstm(wx.double(), R.double(), None)
    assert h.dtype == torch.bfloat16 and s.c.dtype == torch.float32
    assert_close(h.double(), h_ref, kind="kernel", dtype=torch.bfloat16, what="h vs float64")
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 3):
            torch.set_num_threads(n)
            results.append(cpp_lstm(wx.float(), R.float(), None))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1].c, results[1][1].c)


@pytest.mark.slow  # compiles the C++ library afresh (20-65 s)
@needs_compiler
@pytest.mark.skipif(build.platform.machine() != "x86_64", reason="x86-64-v2 is an x86-64 target")
def test_a_named_cpu_target_builds_its_own_library(fresh_build, monkeypatch):
    """XLSTM_ZOO_CPU_TARGET builds for that -march (here the SSE4.2 baseline: none of the AVX paths), cached
    apart from the native build, and it computes the same maths."""
    monkeypatch.delenv("XLSTM_ZOO_CPU_TARGET", raising=False)
    native = build.cache_path()
    monkeypatch.setenv("XLSTM_ZOO_CPU_TARGET", "x86-64-v2")
    assert fresh_build.get()[1] is None
    assert build.cache_path() != native
    assert build.built_with().endswith(", for x86-64-v2 (XLSTM_ZOO_CPU_TARGET)")
    assert "-march=x86-64-v2" in build.flags_file(build.cache_path()).read_text().split()
    wx, R = make_inputs(2, 2, 7, 3, dtype=torch.float64)
    h, _ = ops.slstm_sequence(wx, R, None, gates=GateSchemes(), backend="cpp")
    torch.testing.assert_close(h, reference_slstm(wx, R, None, gates=GateSchemes())[0], rtol=1e-12, atol=1e-12)


def test_a_malformed_cpu_target_warns_and_falls_back(fresh_build, monkeypatch):
    monkeypatch.setenv("XLSTM_ZOO_CPU_TARGET", "native -O0")
    with pytest.warns(build.CppBuildWarning, match="XLSTM_ZOO_CPU_TARGET='native -O0' is not a -march value"):
        assert fresh_build.get()[0] is None
    assert "is not a -march value" in build.built_with()
