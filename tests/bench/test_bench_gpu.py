"""GPU kernel benchmarks: our kernels against a baseline measured in the same run.

    python -m pytest tests/bench/test_bench_gpu.py --benchmark-enable -q -s -p no:cacheprovider

(pytest's addopts ignore tests/bench for the default run; an explicit path still collects.) Skipped
with a reason without a CUDA GPU. Every benchmark times with CUDA events (``WARMUP`` warm-up rounds,
then ``ROUNDS`` timed rounds through ``benchmark.pedantic``); the CUDA-event median is in
``benchmark.extra_info["cuda_median_ms"]`` and in the report. Cases, each test independent (a
baseline that fails or is missing is skipped with its reason, the others still run):

1. mLSTM chunkwise, forward (no_grad) and forward+backward, B=8, 8 heads, qk head dim 128, v head
   dim 256, T from ``XLSTM_ZOO_BENCH_SEQ_LENS``, bf16: ours (``mlstm_sequence(backend="triton")``,
   chunk sizes from ``XLSTM_ZOO_BENCH_CHUNKS``) vs mlstm_kernels ``chunkwise--triton_xl_chunk``
   (TFLA, its default chunk 128) and ``chunkwise--triton_limit_chunk`` (chunk 64) vs torch SDPA
   with the flash backend forced. Flash needs equal head dims, so it runs q, k, v at head dim 128 (half the v width of the mLSTM cases): a reference
   point, not the same work.
2. sLSTM, forward (no_grad) and forward+backward, B=16, T=1024, hidden 1024, 4 heads (Dh=256), bf16
   and fp32:
   ours (``slstm_sequence(backend="triton" / "cuda")``) vs the official ``xlstm`` CUDA sLSTM cell
   (JIT-compiled with nvcc; it adds the bias and the recurrent matmul inside, as our ops do with
   ``wx`` and ``R``).
3. mLSTM step (generation, no_grad, bf16 inputs, fp32 state), B from ``XLSTM_ZOO_BENCH_STEP_BATCHES``,
   H=8, Dk=128, Dv=256: achieved state bandwidth ``2 * (C + n) bytes / time`` as a fraction of this device's copy
   bandwidth (``dst.copy_(src)`` of 1 GiB, ``2 * bytes / time``), vs the mlstm_kernels Triton step
   kernel and the torch reference step.

4. Language model, the xLSTM-7B layout at dim 768 with 12 blocks (162M parameters with a 50,304-token
   untied vocabulary), bf16: a training step (forward, backward, fused AdamW; B and T from
   ``XLSTM_ZOO_BENCH_LM_BATCH``/``_LM_T``, default 8 x 2048) and a generation step at B from
   ``XLSTM_ZOO_BENCH_LM_STEP_BATCHES`` (eager and ``compiled_step()``), ours vs the official
   ``xlstm_large`` model with its Triton kernels; the generation step beside the time to read the
   weights once at this device's copy bandwidth.

Report: a table printed at the end (speedup = baseline ms / ours ms, > 1 means ours is faster),
also written as ``gpu_kernels.json`` and ``gpu_kernels.md`` under ``$XLSTM_ZOO_BENCH_OUT`` (default
``tests/bench/results/``), each replaced atomically. Environment knobs: ``XLSTM_ZOO_BENCH_ROUNDS``
(default 20), ``XLSTM_ZOO_BENCH_WARMUP`` (3), ``XLSTM_ZOO_BENCH_CHUNKS`` (``64,128``),
``XLSTM_ZOO_BENCH_SEQ_LENS`` (``1024,4096,16384``), ``XLSTM_ZOO_BENCH_STEP_BATCHES`` (``1,16,64``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("pytest_benchmark", reason="needs pytest-benchmark (pip install pytest-benchmark)")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _ints(name: str, default: str) -> list[int]:
    raw = os.environ.get(name, default)
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"${name} must be comma-separated integers, got {raw!r}") from None


ROUNDS = _ints("XLSTM_ZOO_BENCH_ROUNDS", "20")[0]
WARMUP = _ints("XLSTM_ZOO_BENCH_WARMUP", "3")[0]
OUR_CHUNKS = _ints("XLSTM_ZOO_BENCH_CHUNKS", "64,128")
SEQ_LENS = _ints("XLSTM_ZOO_BENCH_SEQ_LENS", "1024,4096,16384")
STEP_BATCHES = _ints("XLSTM_ZOO_BENCH_STEP_BATCHES", "1,16,64")
OUT_DIR = Path(os.environ.get("XLSTM_ZOO_BENCH_OUT") or Path(__file__).parent / "results")

M_BATCH, M_HEADS, M_DQK, M_DV = 8, 8, 128, 256  # embedding 2048: qk = 2048 / 2 / 8, v = 2048 / 8
FLASH_D = M_DQK  # flash attention: v at the qk head dim
S_BATCH, S_T, S_HIDDEN, S_HEADS = 16, 1024, 1024, 4
BF16 = torch.bfloat16
MODES = ["fwd", "fwd+bwd"]

# Filled by the tests, written by the module fixture at the end.
_records: list[dict] = []
_skips: list[dict] = []
_copy: dict = {}


def _resume_report() -> None:
    """``XLSTM_ZOO_BENCH_APPEND=1``: start from the report a previous process wrote to the same folder,
    so a baseline that may abort its process runs in a process of its own and its rows still pair with
    ours in one table. (On an H200 with Triton 3.6.0, mlstm_kernels 2.0.6's TFLA forward kernel aborted
    the whole process in LLVM's SLP vectorizer: an assertion, which no ``except`` can catch.)"""
    path = OUT_DIR / "gpu_kernels.json"
    if os.environ.get("XLSTM_ZOO_BENCH_APPEND") == "1" and path.exists():
        old = json.loads(path.read_text())
        _records.extend(old.get("records", []))
        _skips.extend(old.get("skipped", []))
        _copy.update(old.get("copy_bandwidth") or {})


_resume_report()


# ---------------------------------------------------------------------------------------------
# Timing and bookkeeping


def _require_enabled(benchmark):
    if benchmark.disabled:
        pytest.skip("benchmarks are disabled (pytest addopts say --benchmark-disable); pass --benchmark-enable")


def _skip(case: str, mode: str, shape: str, impl: str, reason: str):
    _skips.append(dict(case=case, mode=mode, shape=shape, impl=impl, reason=reason))
    write_report()  # after every row: a later crash of the process loses only its own case
    pytest.skip(f"{impl}: {reason}")


def _probe(case, mode, shape, impl, fn, setup=None):
    """Run once before timing: a baseline that cannot run is skipped with its error, not failed."""
    try:
        if setup is not None:
            setup()
        fn()
        torch.cuda.synchronize()
    except Exception as err:  # any failure of a kernel or library we compare against
        torch.cuda.empty_cache()
        _skip(case, mode, shape, impl, f"first call failed: {type(err).__name__}: {str(err)[:300]}")


def cuda_time(benchmark, fn, setup=None) -> float:
    """Median CUDA-event time (ms) of ``fn`` over ``ROUNDS`` rounds after ``WARMUP`` warm-up rounds.

    ``setup`` (untimed, before every round) resets gradients; every round is synchronised, so the
    wall-clock stats pytest-benchmark keeps are meaningful too."""
    times: list[float] = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def prepare():
        if setup is not None:
            setup()
        torch.cuda.synchronize()

    def target():
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))

    benchmark.pedantic(target, setup=prepare, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    timed = times[-ROUNDS:]  # pedantic runs the warm-up rounds through the same target
    median = statistics.median(timed)
    benchmark.extra_info.update(cuda_median_ms=median, cuda_min_ms=min(timed), cuda_rounds=len(timed),
                                cuda_warmup_rounds=WARMUP)
    return median


def _record(benchmark, case, mode, shape, impl, median_ms, **extra):
    benchmark.group = f"{case} {mode} {shape}"
    benchmark.extra_info.update(case=case, mode=mode, shape=shape, impl=impl, **extra)
    _records.append(dict(case=case, mode=mode, shape=shape, impl=impl, median_ms=median_ms, **extra))
    write_report()  # after every row: a later crash of the process loses only its own case


def _grad_reset(*tensors, module=None):
    def reset():
        for t in tensors:
            t.grad = None
        if module is not None:
            module.zero_grad(set_to_none=True)
    return reset


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    if not _records and not _skips:
        return
    text = write_report()
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            print("\n" + text)
    else:
        print("\n" + text)


# ---------------------------------------------------------------------------------------------
# 1. mLSTM chunkwise vs TFLA vs flash attention

MLSTM_IMPLS = [f"ours-triton-c{c}" for c in OUR_CHUNKS] + ["tfla-xl_chunk-c128", "mlstm_kernels-limit_chunk-c64",
                                                         f"sdpa-flash-d{FLASH_D}"]


def _mlstm_inputs(T, dv, requires_grad):
    B = M_BATCH
    g = torch.Generator(device="cuda").manual_seed(T)
    q, k = (torch.randn(B, M_HEADS, T, M_DQK, device="cuda", dtype=BF16, generator=g) for _ in range(2))
    v = torch.randn(B, M_HEADS, T, dv, device="cuda", dtype=BF16, generator=g)
    i_pre = torch.randn(B, M_HEADS, T, device="cuda", dtype=BF16, generator=g)
    f_pre = torch.randn(B, M_HEADS, T, device="cuda", dtype=BF16, generator=g) + 3.0  # forget gates mostly open
    xs = [q, k, v, i_pre, f_pre]
    for x in xs:
        x.requires_grad_(requires_grad)
    return xs


@pytest.mark.parametrize("impl", MLSTM_IMPLS)
@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("mode", MODES)
def test_mlstm_chunkwise(benchmark, mode, T, impl):
    _require_enabled(benchmark)
    case, grad = "mlstm-chunkwise", mode == "fwd+bwd"
    shape = f"B={M_BATCH} H={M_HEADS} T={T} dqk={M_DQK} dv={M_DV}"
    if impl.startswith("ours"):
        from xlstm_zoo.backends import mlstm_sequence

        chunk = int(impl.rsplit("-c", 1)[1])
        q, k, v, i, f = _mlstm_inputs(T, M_DV, grad)

        def run():
            return mlstm_sequence(q, k, v, i, f, backend="triton", chunk_size=chunk)[0]
    elif impl.startswith(("tfla", "mlstm_kernels")):
        # TFLA (xl_chunk, chunk 128) or mlstm_kernels' older limit_chunk kernel (chunk 64, the official
        # xlstm_large default), a second baseline where TFLA does not compile.
        name, chunk = (("chunkwise--triton_xl_chunk", 128) if impl.startswith("tfla")
                       else ("chunkwise--triton_limit_chunk", 64))
        try:
            from mlstm_kernels.torch import get_mlstm_kernel

            baseline = get_mlstm_kernel(name)
        except Exception as err:
            _skip(case, mode, shape, impl, f"mlstm_kernels {name} unavailable: {type(err).__name__}: {err}")
        q, k, v, i, f = _mlstm_inputs(T, M_DV, grad)

        # i is the exponential input gate's pre-activation, f the sigmoid forget gate's (it takes
        # logsigmoid inside), q scaled by Dk**-0.5: the same maths as our default gates.
        # Forward-only returns the last states as ours always does.
        def run():
            out = baseline(q, k, v, i, f, return_last_states=not grad, chunk_size=chunk)
            return out[0] if isinstance(out, tuple) else out
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        q, k, v, i, f = _mlstm_inputs(T, FLASH_D, grad)
        shape_note = dict(note=f"flash attention runs q, k, v at head dim {FLASH_D} (equal dims needed)")

        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(q, k, v, is_causal=True)
    xs = [q, k, v, i, f]
    grad_out = torch.randn_like(v) if grad else None

    if grad:
        def fn():
            run().backward(grad_out)
    else:
        def fn():
            with torch.no_grad():
                run()
    setup = _grad_reset(*xs) if grad else None
    _probe(case, mode, shape, impl, fn, setup)
    median = cuda_time(benchmark, fn, setup)
    extra = shape_note if impl.startswith("sdpa") else {}
    _record(benchmark, case, mode, shape, impl, median, tokens=M_BATCH * T, **extra)


# ---------------------------------------------------------------------------------------------
# 2. sLSTM vs the official xlstm CUDA cell

SLSTM_IMPLS = ["ours-triton", "ours-cuda", "official-xlstm-cuda"]
_official_cells: dict = {}


def _official_cell(dtype: torch.dtype):
    """The official CUDA sLSTM cell for ``dtype`` (built once per run and dtype: nvcc JIT); raises what
    the build raised. Its states are kept in ``dtype`` (bf16 in the bf16 case), ours always in fp32."""
    key = str(dtype).removeprefix("torch.")
    if key not in _official_cells:
        try:
            from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig

            cfg = sLSTMCellConfig(hidden_size=S_HIDDEN, num_heads=S_HEADS, backend="cuda", batch_size=S_BATCH,
                                  dtype=key)
            cell = sLSTMCell(cfg)
            dh = S_HIDDEN // S_HEADS
            with torch.no_grad():  # its default recurrent init is zeros; random weights, as ours get
                cell.recurrent_kernel[...] = torch.randn(S_HEADS, dh, 4, dh) / dh ** 0.5
            _official_cells[key] = cell.to("cuda")
        except BaseException as err:  # a failed nvcc build may raise SystemExit-like errors too
            if isinstance(err, KeyboardInterrupt):
                raise
            _official_cells[key] = err
    if isinstance(_official_cells[key], BaseException):
        raise _official_cells[key]
    return _official_cells[key]


@pytest.mark.parametrize("impl", SLSTM_IMPLS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=["bf16", "fp32"])
def test_slstm(benchmark, dtype, mode, impl):
    _require_enabled(benchmark)
    case, grad = "slstm", mode == "fwd+bwd"
    dh = S_HIDDEN // S_HEADS
    shape = f"B={S_BATCH} T={S_T} hidden={S_HIDDEN} heads={S_HEADS} dh={dh} {str(dtype).removeprefix('torch.')}"
    g = torch.Generator(device="cuda").manual_seed(0)
    module = None
    if impl.startswith("ours"):
        import xlstm_zoo.backends as backends

        name = impl.split("-", 1)[1]
        try:
            backends.select("slstm_sequence", torch.device("cuda"), dtype, force=name)
        except Exception as err:
            _skip(case, mode, shape, impl, f"backend {name!r} unavailable: {err}")
        wx = torch.randn(S_BATCH, S_HEADS, S_T, 4 * dh, device="cuda", dtype=dtype, generator=g)
        R = (torch.randn(S_HEADS, dh, 4 * dh, device="cuda", generator=g) / dh ** 0.5).to(dtype)
        xs = [wx.requires_grad_(grad), R.requires_grad_(grad)]

        def run():
            return backends.slstm_sequence(wx, R, backend=name)[0]
    else:
        try:
            cell = _official_cell(dtype)
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt):
                raise
            _skip(case, mode, shape, impl, f"official CUDA sLSTM did not build/load: {type(err).__name__}: "
                                           f"{str(err)[:300]}")
        cell.train(grad)
        module = cell
        # Input [B, T, 4*hidden] laid out (gate, head, d), gates (i, f, z, o); bias and R are inside the cell.
        x = torch.randn(S_BATCH, S_T, 4 * S_HIDDEN, device="cuda", dtype=dtype, generator=g)
        xs = [x.requires_grad_(grad)]

        def run():
            return cell(x)[0]
    grad_out = torch.randn(S_BATCH, S_HEADS, S_T, dh, device="cuda", dtype=dtype, generator=g) if grad else None

    if grad:
        def fn():
            run().backward(grad_out)
    else:
        def fn():
            with torch.no_grad():
                run()
    setup = _grad_reset(*xs, module=module) if grad else None
    _probe(case, mode, shape, impl, fn, setup)
    median = cuda_time(benchmark, fn, setup)
    _record(benchmark, case, mode, shape, impl, median)


# ---------------------------------------------------------------------------------------------
# 3. mLSTM step: state bandwidth vs the device's copy bandwidth

STEP_IMPLS = ["ours-triton", "mlstm_kernels-triton-step", "torch-reference-step"]


@pytest.fixture(scope="module")
def copy_bandwidth():
    """Bytes/s of ``dst.copy_(src)`` for 1 GiB of fp32 (read + write counted), median of ``ROUNDS``."""
    src = torch.randn(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(WARMUP + ROUNDS):
        torch.cuda.synchronize()
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if r >= WARMUP:
            times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    bw = 2 * src.numel() * src.element_size() / (ms * 1e-3)
    _copy.update(median_ms=ms, bytes_per_s=bw, bytes=2 * src.numel() * src.element_size())
    del src, dst
    torch.cuda.empty_cache()
    return bw


@pytest.mark.parametrize("impl", STEP_IMPLS)
@pytest.mark.parametrize("B", STEP_BATCHES)
def test_mlstm_step(benchmark, copy_bandwidth, B, impl):
    _require_enabled(benchmark)
    case, mode = "mlstm-step", "fwd"
    H, DK, DV = M_HEADS, M_DQK, M_DV
    shape = f"B={B} H={H} dk={DK} dv={DV}"
    g = torch.Generator(device="cuda").manual_seed(B)
    q, k = (torch.randn(B, H, DK, device="cuda", dtype=BF16, generator=g) for _ in range(2))
    v = torch.randn(B, H, DV, device="cuda", dtype=BF16, generator=g)
    i_pre = torch.randn(B, H, device="cuda", generator=g)
    f_pre = torch.randn(B, H, device="cuda", generator=g) + 3.0
    C = torch.randn(B, H, DK, DV, device="cuda", generator=g)
    n = torch.randn(B, H, DK, device="cuda", generator=g)
    m = torch.randn(B, H, device="cuda", generator=g)
    if impl == "ours-triton":
        from xlstm_zoo.backends import MLSTMState, mlstm_step

        state = MLSTMState(C, n, m)

        def run():
            return mlstm_step(q, k, v, i_pre, f_pre, state, backend="triton")
    elif impl == "torch-reference-step":
        from xlstm_zoo.backends import MLSTMState, mlstm_step

        state = MLSTMState(C, n, m)

        def run():
            return mlstm_step(q, k, v, i_pre, f_pre, state, backend="reference")
    else:
        try:
            from mlstm_kernels.torch import get_mlstm_step_kernel

            step = get_mlstm_step_kernel("triton")
        except Exception as err:
            _skip(case, mode, shape, impl, f"mlstm_kernels step kernel unavailable: {type(err).__name__}: {err}")
        i3, f3, m3 = i_pre[..., None], f_pre[..., None], m[..., None]

        def run():  # same maths: exponential i, sigmoid f, q scaled by Dk**-0.5, fp32 state
            return step(q, k, v, i3, f3, C, n, m3, dtype_state=torch.float32)

    def fn():
        with torch.no_grad():
            run()
    _probe(case, mode, shape, impl, fn)
    median = cuda_time(benchmark, fn)
    state_bytes = 2 * (C.numel() + n.numel()) * 4  # C and n, read and written, fp32
    achieved = state_bytes / (median * 1e-3)
    _record(benchmark, case, mode, shape, impl, median, state_bytes=state_bytes, state_bytes_per_s=achieved,
            copy_bytes_per_s=copy_bandwidth, fraction_of_copy_bw=achieved / copy_bandwidth)


# ---------------------------------------------------------------------------------------------
# 4. Language model: the xLSTM-7B layout at GPT-2 small width (dim 768, 12 mLSTM blocks, 3 heads: qk
#    head dim 128, v 256; vocabulary 50,304, untied head), bf16 weights and activations: one training
#    step (forward, backward, fused AdamW) at B x T tokens, and one generation step at B=1 and 16,
#    ours (eager and compiled_step()) vs the official xlstm_large model with its Triton kernels
#    (TFLA chunkwise for training, the mlstm_kernels step kernel for generation).

LM_DIM, LM_BLOCKS, LM_HEADS, LM_VOCAB = 768, 12, 3, 50304
LM_T = _ints("XLSTM_ZOO_BENCH_LM_T", "2048")[0]
LM_BATCH = _ints("XLSTM_ZOO_BENCH_LM_BATCH", "8")[0]
LM_STEP_BATCHES = _ints("XLSTM_ZOO_BENCH_LM_STEP_BATCHES", "1,16")
LM_OVERRIDES = [f"dim={LM_DIM}", f"vocab_size={LM_VOCAB}", f"stack.pattern={'m' * LM_BLOCKS}",
                f"stack.blocks.m.cell.num_heads={LM_HEADS}"]


def _ours_lm():
    import xlstm_zoo

    torch.manual_seed(0)
    return xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_7b_small", LM_OVERRIDES)).to("cuda", BF16)


def _official_lm(mode: str):
    from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig

    cfg = xLSTMLargeConfig(embedding_dim=LM_DIM, num_heads=LM_HEADS, num_blocks=LM_BLOCKS, vocab_size=LM_VOCAB,
                           chunkwise_kernel="chunkwise--triton_xl_chunk", sequence_kernel="native_sequence__triton",
                           step_kernel="triton", mode=mode, chunk_size=128, return_last_states=mode == "inference")
    torch.manual_seed(0)
    return xLSTMLarge(cfg).to("cuda", BF16)


def _lm_or_skip(case, mode, shape, impl, make):
    try:
        return make()
    except Exception as err:
        _skip(case, mode, shape, impl, f"model did not build: {type(err).__name__}: {str(err)[:300]}")


@pytest.mark.parametrize("impl", ["ours-xlstm_7b_layout", "official-xlstm_large-tfla"])
def test_lm_training_step(benchmark, impl):
    _require_enabled(benchmark)
    case, mode = "lm-train-step", "fwd+bwd+adamw"
    shape = f"dim={LM_DIM} blocks={LM_BLOCKS} heads={LM_HEADS} vocab={LM_VOCAB} B={LM_BATCH} T={LM_T} bf16"
    ours = impl.startswith("ours")
    model = _lm_or_skip(case, mode, shape, impl, _ours_lm if ours else lambda: _official_lm("train"))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, LM_VOCAB, (LM_BATCH, LM_T + 1), device="cuda", generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def fn():
        out = model(x)
        logits = out[0] if isinstance(out, tuple) else out
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _probe(case, mode, shape, impl, fn)
    median = cuda_time(benchmark, fn)
    params = sum(p.numel() for p in model.parameters())
    tokens_per_s = LM_BATCH * LM_T / (median * 1e-3)
    _record(benchmark, case, mode, shape, impl, median, params=params, tokens_per_s=tokens_per_s,
            note=f"{tokens_per_s / 1e3:.0f}k tokens/s, {params / 1e6:.1f}M parameters")
    del model, opt


@pytest.mark.parametrize("impl", ["ours-eager", "ours-compiled_step", "official-xlstm_large-step"])
@pytest.mark.parametrize("B", LM_STEP_BATCHES)
def test_lm_generation_step(benchmark, copy_bandwidth, B, impl):
    """One token for every row, from a state; the floor is reading the weights once (bandwidth bound)."""
    _require_enabled(benchmark)
    case, mode = "lm-generation-step", "no_grad"
    shape = f"dim={LM_DIM} blocks={LM_BLOCKS} heads={LM_HEADS} vocab={LM_VOCAB} B={B} bf16"
    ours = impl.startswith("ours")
    model = _lm_or_skip(case, mode, shape, impl, _ours_lm if ours else lambda: _official_lm("inference"))
    model.eval()
    g = torch.Generator(device="cuda").manual_seed(B)
    prompt = torch.randint(0, LM_VOCAB, (B, 16), device="cuda", generator=g)
    token = prompt[:, -1]
    with torch.no_grad():
        if ours:
            _, state = model(prompt)
            step = model.compiled_step() if impl == "ours-compiled_step" else model.step

            def run():
                return step(token, state)[0]
        else:
            _, state = model(prompt)

            def run():
                return model(token[:, None], state)[0]

    def fn():
        with torch.no_grad():
            run()
    _probe(case, mode, shape, impl, fn)
    median = cuda_time(benchmark, fn)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor_ms = weight_bytes / copy_bandwidth * 1e3
    _record(benchmark, case, mode, shape, impl, median, weight_bytes=weight_bytes, bandwidth_floor_ms=floor_ms,
            note=f"weights read once at copy bandwidth: {floor_ms:.3f} ms ({floor_ms / median:.0%} of this step)")
    del model


# ---------------------------------------------------------------------------------------------
# Report


def _environment() -> dict:
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               python=platform.python_version(), rounds=ROUNDS, warmup_rounds=WARMUP,
               time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    for mod in ("triton", "mlstm_kernels", "xlstm"):
        try:
            from importlib.metadata import version

            env[mod] = version(mod.replace("_", "-"))
        except Exception:
            env[mod] = None
    return env


def _table() -> list[str]:
    """One row per (ours, baseline) pair of each case/mode/shape; speedup = baseline ms / ours ms."""
    lines = ["| case | mode | shape | ours | ours ms | baseline | baseline ms | speedup (baseline/ours) | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple, list[dict]] = {}
    for r in _records:
        groups.setdefault((r["case"], r["mode"], r["shape"]), []).append(r)
    for s in _skips:
        groups.setdefault((s["case"], s["mode"], s["shape"]), [])

    def note(r):
        parts = []
        if "fraction_of_copy_bw" in r:
            parts.append(f"{r['state_bytes_per_s'] / 1e9:.0f} GB/s = {100 * r['fraction_of_copy_bw']:.0f}% of copy")
        if "note" in r:
            parts.append(r["note"])
        return "; ".join(parts)

    for key in sorted(groups, key=lambda k: (k[0], k[1])):  # stable: shapes stay in run order
        recs = groups[key]
        ours = [r for r in recs if r["impl"].startswith("ours")]
        base = [r for r in recs if not r["impl"].startswith("ours")]
        skipped = [s for s in _skips if (s["case"], s["mode"], s["shape"]) == key]
        for o in ours or ([None] if base else []):
            for b in base or [None]:
                o_ms = f"{o['median_ms']:.3f}" if o else "-"
                b_ms = f"{b['median_ms']:.3f}" if b else "-"
                ratio = f"{b['median_ms'] / o['median_ms']:.2f}x" if o and b else "-"
                parts = (note(o) if o else "", f"baseline: {note(b)}" if b and note(b) else "")
                notes = "; ".join(x for x in parts if x)
                lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {o['impl'] if o else '-'} | {o_ms} | "
                             f"{b['impl'] if b else '-'} | {b_ms} | {ratio} | {notes} |")
        for s in skipped:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | skipped: {s['impl']} | - | - | - | - | "
                         f"{s['reason'].replace('|', '/')} |")
    return lines


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_report() -> str:
    env = _environment()
    header = [f"# GPU kernel benchmarks ({env['gpu']})", "",
              f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, mlstm_kernels "
              f"{env['mlstm_kernels']}, xlstm {env['xlstm']}; CUDA-event median of {ROUNDS} rounds after "
              f"{WARMUP} warm-up rounds; bf16 inputs unless the shape names another dtype; our states fp32 (the official sLSTM keeps its states in the input dtype). Speedup > 1: ours is faster."]
    if _copy:
        header.append(f"Device copy bandwidth (1 GiB dst.copy_(src), read + write): "
                      f"{_copy['bytes_per_s'] / 1e9:.0f} GB/s.")
    text = "\n".join(header + [""] + _table()) + "\n"
    payload = dict(environment=env, copy_bandwidth=_copy or None, records=_records, skipped=_skips)
    _atomic_write(OUT_DIR / "gpu_kernels.json", json.dumps(payload, indent=2, default=str) + "\n")
    _atomic_write(OUT_DIR / "gpu_kernels.md", text)
    return text + f"\nwritten: {OUT_DIR / 'gpu_kernels.json'}, {OUT_DIR / 'gpu_kernels.md'}"
