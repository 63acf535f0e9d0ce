"""The CUDA sLSTM backend: sources compile, the JIT build fails safely, the glue is exact, the kernel matches
the reference (GPU tests).

Without a GPU only the first three parts run: nvcc compiles the kernel file (and the host compiler the
torch binding), a failed or successful build is simulated, and the Python glue plus the fused backward is
checked with a PyTorch stand-in for the compiled extension.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from xlstm_zoo.backends import dispatch
from xlstm_zoo.backends import slstm_sequence as dispatched_slstm_sequence
from xlstm_zoo.backends.cuda import CudaBuildWarning, cuda_backend, jit
from xlstm_zoo.backends.cuda import slstm as cuda_slstm
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.slstm import _cell as reference_cell
from xlstm_zoo.backends.reference.slstm import slstm_sequence as reference_slstm
from xlstm_zoo.backends.states import SLSTMState

NVCC = jit.nvcc_path()
GATES = [GateSchemes(i, f) for i in ("sigmoid", "exponential") for f in ("sigmoid", "exponential")]
GATE_IDS = [f"i_{g.input[:3]}-f_{g.forget[:3]}" for g in GATES]
# torch's JIT build passes these to nvcc; the kernel must not rely on implicit half/bfloat16 conversions.
TORCH_NVCC_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                      "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


# ---------------------------------------------------------------- sources compile

@pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")
def test_kernel_compiles_with_nvcc_alone(tmp_path):
    cmd = [NVCC, "-c", "-std=c++17", "-O3", "-arch=sm_90", *TORCH_NVCC_DEFINES, str(jit.KERNEL_SOURCE),
           "-o", str(tmp_path / "slstm_kernel.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "slstm_kernel.o").stat().st_size > 0


@pytest.mark.slow  # 25-31 s here on 2 shared cores: the torch headers dominate
@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the binding needs cuda_runtime.h")
@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler (c++)")
def test_binding_compiles_against_torch_headers():
    # Syntax and types only, as torch's build would compile it (c++20, torch + CUDA + Python includes).
    # The binding avoids ATen/c10 CUDA headers, so this works even with a CPU-only torch.
    homes = [os.environ.get("CUDA_HOME"), Path(NVCC).resolve().parent.parent, "/usr/local/cuda"]
    cuda_includes = [Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").is_file()]
    if not cuda_includes:
        pytest.skip(f"cuda_runtime.h not found next to {NVCC}, under $CUDA_HOME or /usr/local/cuda")
    includes = [*torch.utils.cpp_extension.include_paths(), str(cuda_includes[0]), sysconfig.get_paths()["include"]]
    cmd = ["c++", "-fsyntax-only", "-std=c++20", "-DTORCH_EXTENSION_NAME=xlstm_zoo_slstm_cuda",
           *(f"-I{p}" for p in includes), str(jit.BINDING_SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"


def test_python_head_dim_limit_matches_header():
    found = re.search(r"#define XLSTM_ZOO_SLSTM_MAX_HEAD_DIM (\d+)", jit.HEADER.read_text())
    assert found and int(found.group(1)) == jit.MAX_HEAD_DIM


# ---------------------------------------------------------------- availability and fallback

@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """No build tried yet in this process, an empty cache folder, and no cached dispatch decisions."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "_state", jit.JitBuild())
    monkeypatch.setattr(dispatch, "_cache", {})
    monkeypatch.delenv(dispatch.ENV_FORCE, raising=False)
    return tmp_path


@pytest.fixture
def pretend_gpu(monkeypatch):
    """A machine where the build would be attempted: GPU visible, CUDA torch, nvcc and ninja present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(jit, "nvcc_path", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(torch.utils.cpp_extension, "is_ninja_available", lambda: True)


# What torch.utils.cpp_extension.load raises when ninja fails: the whole build log in the message.
BUILD_LOG = (
    "Error building extension 'xlstm_zoo_slstm_cuda': [1/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile "
    "-DTORCH_EXTENSION_NAME=xlstm_zoo_slstm_cuda -O3 -std=c++20 -c /pkg/slstm_kernel.cu -o slstm_kernel.cuda.o\n"
    "FAILED: slstm_kernel.cuda.o\n"
    "/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -O3 -std=c++20 -c /pkg/slstm_kernel.cu -o slstm_kernel.cuda.o\n"
    "/pkg/slstm_kernel.cu(97): error: identifier \"__ldg_missing\" is undefined\n"
    "\n"
    "1 error detected in the compilation of \"/pkg/slstm_kernel.cu\".\n"
    "ninja: build stopped: subcommand failed.\n"
)


def test_failed_build_warns_once_names_the_cause_and_falls_back(fresh_build, pretend_gpu, monkeypatch, capsys):
    attempts = []

    def failing_build(directory):
        attempts.append(directory)
        raise RuntimeError(BUILD_LOG)

    monkeypatch.setattr(jit, "_build", failing_build)
    backend = cuda_backend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reasons = [backend.unavailable_reason() for _ in range(3)]
        rows = {name: status for name, _, status in dispatch.explain("slstm_sequence", torch.device("cuda"), torch.float32)}
        chosen = dispatch.select("slstm_sequence", torch.device("cuda"), torch.bfloat16)

    assert len(attempts) == 1, "a failed build must not be retried on every call"
    assert Path(attempts[0]).is_relative_to(fresh_build)
    assert reasons[0].startswith("compile failed: ") and "__ldg_missing" in reasons[0], reasons[0]
    assert "ninja: build stopped" not in reasons[0] and "FAILED:" not in reasons[0], reasons[0]
    assert reasons == [reasons[0]] * 3
    ours = [w for w in caught if issubclass(w.category, CudaBuildWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert issubclass(CudaBuildWarning, RuntimeWarning) and "__ldg_missing" in str(ours[0].message)
    assert rows["cuda"] == reasons[0]
    assert chosen.name != "cuda" and rows[chosen.name] == "ok"
    assert capsys.readouterr().err.count("compiling the sLSTM CUDA kernel (first use; cached in") == 1


def test_successful_build_runs_once_and_is_reused(fresh_build, pretend_gpu, monkeypatch, capsys):
    module, attempts = object(), []
    monkeypatch.setattr(jit, "_build", lambda directory: attempts.append(directory) or module)
    backend = cuda_backend()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaBuildWarning)
        assert [backend.unavailable_reason() for _ in range(3)] == [None] * 3
        assert jit.extension() is module and jit.extension() is module
        chosen = dispatch.select("slstm_sequence", torch.device("cuda"), torch.float16)
    assert len(attempts) == 1
    assert chosen.name == "cuda"
    assert dispatch.select("slstm_sequence", torch.device("cpu"), torch.float32).name != "cuda"
    assert capsys.readouterr().err.count("compiling the sLSTM CUDA kernel") == 1


def test_cached_build_is_found_without_the_compiling_notice(fresh_build, pretend_gpu, monkeypatch, capsys):
    directory = jit.build_directory()
    directory.mkdir(parents=True)
    (directory / f"{jit.EXTENSION_NAME}.so").touch()  # what an earlier process left
    monkeypatch.setattr(jit, "_build", lambda d: object())
    assert cuda_backend().unavailable_reason() is None
    assert "compiling" not in capsys.readouterr().err


def test_build_directory_follows_torch_extensions_dir(fresh_build, monkeypatch):
    assert jit.build_directory().is_relative_to(fresh_build)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert jit.build_directory().is_relative_to(Path.home() / ".cache" / "xlstm_zoo" / "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without a GPU")
def test_reason_names_the_missing_gpu(fresh_build, monkeypatch):
    monkeypatch.setattr(jit, "_build", lambda d: pytest.fail("no build may start without a GPU"))
    reason = cuda_backend().unavailable_reason()
    assert reason is not None and "no CUDA GPU is visible" in reason


def test_reasons_name_missing_toolkit_and_cpu_torch(fresh_build, pretend_gpu, monkeypatch):
    monkeypatch.setattr(jit, "_build", lambda d: pytest.fail("no build may start without a toolkit"))
    monkeypatch.setattr(jit, "nvcc_path", lambda: None)
    assert cuda_backend().unavailable_reason().startswith("nvcc not found (set CUDA_HOME")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "torch was built without CUDA" in cuda_backend().unavailable_reason()


def test_supports_only_cuda_kernel_dtypes_and_head_dims():
    backend = cuda_backend()
    cuda = torch.device("cuda")
    assert all(backend.supports("slstm_sequence", cuda, dt) for dt in (torch.float32, torch.bfloat16, torch.float16))
    assert not backend.supports("slstm_sequence", cuda, torch.float64)
    assert not backend.supports("slstm_sequence", torch.device("cpu"), torch.float32)
    assert not backend.supports("mlstm_sequence", cuda, torch.float32)
    assert backend.supports("slstm_sequence", cuda, torch.float32, head_dim=256)
    assert not backend.supports("slstm_sequence", cuda, torch.float32, head_dim=jit.MAX_HEAD_DIM + 1)


def test_compiler_reason_falls_back_to_last_lines():
    log = "Error building extension 'x': [1/2] c++ -c a.cpp -o a.o\n/bin/sh: 1: c++: not found\nninja: build stopped: subcommand failed.\n"
    assert jit.compiler_reason(log) == "/bin/sh: 1: c++: not found"


# ---------------------------------------------------------------- glue, on CPU with a stand-in extension

class _TorchExtension:
    """The compiled extension's ``forward`` contract in PyTorch (reference cell, fp32), for CPU tests of the glue."""

    calls: list = []

    @classmethod
    def forward(cls, wx, R, c0, n0, m0, h0, input_exp, forget_exp, save_states, stream):
        cls.calls.append(save_states)
        gates = GateSchemes("exponential" if input_exp else "sigmoid", "exponential" if forget_exp else "sigmoid")
        s, outs, steps = SLSTMState(c0, n0, m0, h0), [], [SLSTMState(c0, n0, m0, h0)]
        for wx_t in wx.float().unbind(2):
            s = reference_cell(wx_t, R, s, gates)
            outs.append(s.h)
            steps.append(s)
        h = torch.stack(outs, dim=2).to(wx.dtype)
        result = [h, s.c, s.n, s.m, s.h]
        if save_states:  # [4, T+1, H, B, Dh]: (c, n, m, h) per step, time-major
            result.append(torch.stack([torch.stack([getattr(st, f) for st in steps]) for f in "cnmh"]).transpose(2, 3))
        return result


def _loss(h, state, weights):
    return (h.double() * weights[0]).sum() + sum((s.double() * w).sum() for s, w in zip(state, weights[1:]))


def _random_state(B, H, Dh, device="cpu"):
    return SLSTMState(torch.randn(B, H, Dh, device=device), 1 + torch.rand(B, H, Dh, device=device),
                      torch.randn(B, H, Dh, device=device), 0.5 * torch.randn(B, H, Dh, device=device))


@pytest.mark.parametrize("gates", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_glue_and_fused_backward_match_reference(gates, dtype, monkeypatch):
    monkeypatch.setattr(jit, "extension", lambda: _TorchExtension)
    _TorchExtension.calls = []
    B, H, T, Dh = 3, 2, 9, 5
    wx = torch.randn(B, H, T, 4 * Dh).to(dtype)
    R = torch.randn(H, Dh, 4 * Dh) / Dh ** 0.5
    state = _random_state(B, H, Dh)
    weights = [torch.randn(B, H, T, Dh, dtype=torch.float64)] + [torch.randn(B, H, Dh, dtype=torch.float64) for _ in range(4)]

    leaves = [x.clone().requires_grad_() for x in (wx, R, *state)]
    h, s = cuda_slstm.slstm_sequence(leaves[0], leaves[1], SLSTMState(*leaves[2:]), gates=gates)
    _loss(h, s, weights).backward()
    ref_leaves = [x.double().requires_grad_() for x in (wx, R, *state)]
    h_ref, s_ref = reference_slstm(ref_leaves[0], ref_leaves[1], SLSTMState(*ref_leaves[2:]), gates=gates)
    _loss(h_ref, s_ref, weights).backward()

    assert _TorchExtension.calls == [True]
    assert h.dtype == dtype and all(x.dtype == torch.float32 for x in s)
    # bf16: the output is rounded to bf16 (and so is the gradient flowing into it); states stay fp32.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(h.double(), h_ref.to(dtype).double(), rtol=tol, atol=tol)
    for name, a, b in zip("cnmh", s, s_ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"state {n}: {m}")
    for name, a, b in zip(["wx", "R", "c0", "n0", "m0", "h0"], leaves, ref_leaves):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=tol, atol=tol * b.grad.abs().max().item(),
                                   msg=lambda m, n=name: f"grad {n}: {m}")

    with torch.no_grad():  # inference saves no per-step states
        h_ng, _ = cuda_slstm.slstm_sequence(wx, R, state, gates=gates)
    assert _TorchExtension.calls == [True, False]
    torch.testing.assert_close(h_ng, h.detach())


def test_glue_empty_sequence_and_zero_state(monkeypatch):
    monkeypatch.setattr(jit, "extension", lambda: _TorchExtension)
    wx, R = torch.randn(2, 3, 0, 16), torch.randn(3, 4, 16)
    h, s = cuda_slstm.slstm_sequence(wx, R, gates=GateSchemes())
    assert h.shape == (2, 3, 0, 4) and torch.equal(s.m, torch.full((2, 3, 4), float("-inf")))
    wx = torch.randn(2, 3, 5, 16)
    h, s = cuda_slstm.slstm_sequence(wx, R, gates=GateSchemes())
    h_ref, s_ref = reference_slstm(wx, R, gates=GateSchemes())
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(s.m, s_ref.m)


def test_glue_rejects_unknown_gate_scheme():
    with pytest.raises(ValueError, match="unknown gate scheme 'relu'"):
        cuda_slstm.slstm_sequence(torch.randn(1, 1, 2, 8), torch.randn(1, 2, 8), gates=GateSchemes("relu", "sigmoid"))


# ---------------------------------------------------------------- the kernel itself (GPU machines)

SHAPES = [(256, 64), (67, 256), (64, 33)]  # (T, Dh): long, widest head at odd T, Dh not a multiple of 32
SHAPE_IDS = [f"T{t}-Dh{d}" for t, d in SHAPES]


def _gpu_inputs(T, Dh, dtype, random_state, B=16, H=4, seed=0):
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    wx = torch.randn(B, H, T, 4 * Dh, device=dev).to(dtype)
    R = torch.randn(H, Dh, 4 * Dh, device=dev) / Dh ** 0.5
    return wx, R, (_random_state(B, H, Dh, dev) if random_state else None)


def _reference64(wx, R, state, gates):
    st = None if state is None else SLSTMState(*(x.double() for x in state))
    return reference_slstm(wx.double(), R.double(), st, gates=gates)


def _close(actual, expected, tol, what):
    """Elementwise ``|a - e| <= tol * (|e| + max|e|)``: relative, with an absolute floor at the tensor's scale."""
    expected = expected.double()
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * expected.abs().max().item(),
                               msg=lambda m: f"{what}: {m}")


@pytest.fixture(scope="module")
def built_extension():
    """Builds (or loads the cached build) once for the module; a failed build fails here with its reason."""
    if torch.cuda.is_available():
        return jit.extension()
    return None


@pytest.mark.parametrize("random_state", [False, True], ids=["zero_state", "random_state"])
@pytest.mark.parametrize("gates", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("T,Dh", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_forward_matches_reference(T, Dh, gates, random_state, dtype, tol):
    wx, R, state = _gpu_inputs(T, Dh, dtype, random_state)
    with torch.no_grad():
        h, s = cuda_slstm.slstm_sequence(wx, R, state, gates=gates)
        h_ref, s_ref = _reference64(wx, R, state, gates)
    torch.cuda.synchronize()
    assert h.dtype == dtype and h.shape == h_ref.shape and all(x.dtype == torch.float32 for x in s)
    assert torch.isfinite(h).all(), "NaN left in the output: an element the kernel did not write"
    # The output is rounded to the input dtype (tol); the states are fp32 arithmetic on the same
    # (exactly representable) inputs, so they meet the fp32 tolerance in every dtype.
    _close(h, h_ref, tol, "h")
    for name, a, b in zip("cnmh", s, s_ref):
        assert torch.isfinite(a).all(), f"state {name} not finite"
        _close(a, b, 1e-4, f"state {name}")


@pytest.mark.parametrize("random_state", [False, True], ids=["zero_state", "random_state"])
@pytest.mark.parametrize("gates", GATES, ids=GATE_IDS)
@pytest.mark.parametrize("T,Dh", [(67, 64), (64, 256)], ids=["T67-Dh64", "T64-Dh256"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_gradients_match_reference(T, Dh, gates, random_state, dtype, tol):
    wx, R, state = _gpu_inputs(T, Dh, dtype, random_state, B=8)
    B, H = wx.shape[:2]
    weights = [torch.randn(B, H, T, Dh, device="cuda", dtype=torch.float64)] + \
              [torch.randn(B, H, Dh, device="cuda", dtype=torch.float64) for _ in range(4)]
    inputs = [wx, R] + ([] if state is None else list(state))
    leaves = [x.clone().requires_grad_() for x in inputs]
    h, s = cuda_slstm.slstm_sequence(leaves[0], leaves[1], None if state is None else SLSTMState(*leaves[2:]), gates=gates)
    _loss(h, s, weights).backward()
    ref_leaves = [x.double().requires_grad_() for x in inputs]
    h_ref, s_ref = reference_slstm(ref_leaves[0], ref_leaves[1], None if state is None else SLSTMState(*ref_leaves[2:]),
                                   gates=gates)
    _loss(h_ref, s_ref, weights).backward()
    # bf16: the incoming gradient of h is rounded to bf16 as well, hence the bf16 tolerance on all of them.
    for name, a, b in zip(["wx", "R", "c0", "n0", "m0", "h0"], leaves, ref_leaves):
        assert torch.isfinite(a.grad).all(), f"grad {name} not finite"
        _close(a.grad, b.grad, tol, f"grad {name}")


@pytest.mark.parametrize("Dh", [16, 512], ids=["Dh16", "Dh512"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_head_dim_extremes_forward_and_gradients(Dh, dtype, tol):
    """Head dims 16 and 512 (the kernel's limit), odd T, random state: outputs and every gradient."""
    gates = GateSchemes()
    wx, R, state = _gpu_inputs(65, Dh, dtype, True, B=4, H=2)
    B, H, T = wx.shape[:3]
    weights = [torch.randn(B, H, T, Dh, device="cuda", dtype=torch.float64)] + \
              [torch.randn(B, H, Dh, device="cuda", dtype=torch.float64) for _ in range(4)]
    inputs = [wx, R, *state]
    leaves = [x.clone().requires_grad_() for x in inputs]
    h, s = cuda_slstm.slstm_sequence(leaves[0], leaves[1], SLSTMState(*leaves[2:]), gates=gates)
    _loss(h, s, weights).backward()
    ref_leaves = [x.double().requires_grad_() for x in inputs]
    h_ref, s_ref = reference_slstm(ref_leaves[0], ref_leaves[1], SLSTMState(*ref_leaves[2:]), gates=gates)
    _loss(h_ref, s_ref, weights).backward()
    _close(h.detach(), h_ref.detach(), tol, "h")
    for name, a, b in zip("cnmh", s, s_ref):
        _close(a.detach(), b.detach(), 1e-4, f"state {name}")
    for name, a, b in zip(["wx", "R", "c0", "n0", "m0", "h0"], leaves, ref_leaves):
        assert torch.isfinite(a.grad).all(), f"grad {name} not finite"
        _close(a.grad, b.grad, tol, f"grad {name}")


@pytest.mark.parametrize("gates", GATES, ids=GATE_IDS)
@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_large_gate_preactivations(gates):
    """Pre-activations around +-30: the stabiliser keeps every output and state finite and exact."""
    wx, R, state = _gpu_inputs(200, 64, torch.float32, False, B=4, H=2)
    wx = wx * 20
    with torch.no_grad():
        h, s = cuda_slstm.slstm_sequence(wx, R, None, gates=gates)
        h_ref, s_ref = _reference64(wx, R, None, gates)
    assert torch.isfinite(h).all() and all(torch.isfinite(x).all() for x in s)
    _close(h, h_ref, 1e-4, "h")
    for name, a, b in zip("cnmh", s, s_ref):
        _close(a, b, 1e-4, f"state {name}")


@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dispatch_picks_cuda_and_handles_strided_input_and_empty_sequence():
    wx, R, state = _gpu_inputs(33, 48, torch.float32, True, B=5, H=3)
    wx_strided = wx.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    assert dispatch.select("slstm_sequence", wx.device, wx.dtype).name == "cuda"
    with torch.no_grad():
        h, s = dispatched_slstm_sequence(wx_strided, R, state, backend="cuda")
        h_ref, s_ref = _reference64(wx, R, state, GateSchemes())
    _close(h, h_ref, 1e-4, "h")
    _close(s.m, s_ref.m, 1e-4, "m")
    h0, s0 = cuda_slstm.slstm_sequence(wx[:, :, :0], R, state, gates=GateSchemes())
    assert h0.shape == (5, 3, 0, 48) and torch.equal(s0.c, state.c)


@pytest.mark.usefixtures("built_extension")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_runs_on_a_side_stream():
    wx, R, state = _gpu_inputs(40, 64, torch.bfloat16, True, B=4, H=2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        h, s = cuda_slstm.slstm_sequence(wx, R, state, gates=GateSchemes())
    torch.cuda.current_stream().wait_stream(side)
    h_ref, s_ref = _reference64(wx, R, state, GateSchemes())
    _close(h, h_ref, 2e-2, "h")
    _close(s.c, s_ref.c, 1e-4, "c")
