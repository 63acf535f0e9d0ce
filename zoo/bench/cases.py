"""Benchmark cases: each one is "ours vs a baseline" at the same shapes, built fresh for every run.

A :class:`Case` has a name (``group/what``), a group, a description of its shapes and two builders,
``ours()`` and ``baseline()``, that return a :class:`Prepared`: a zero-argument callable to time plus
what the table shows beside the time (parameter count, a note). A baseline that cannot be built
(package not installed, quadratic memory beyond the limit) raises :class:`BaselineUnavailable`; its
message goes into the table and ours is still measured.

Same architecture on both sides. The official NeurIPS blocks project q/k/v block-diagonally
(``qkv_proj_blocksize=4``), so ours is built with ``stack.blocks.m.cell.proj=blockdiag`` (block size
4). Its sLSTM block projects z/o per head and its gated feed-forward rounds
``1.3 * dim`` up to a multiple of 64 (192 at dim 128), so ours gets ``stack.blocks.s.cell.proj=headwise``
and the same MLP width. What cannot be matched (our i/f gates and our LSTM cell's projections are
full linear maps, the official ones are per head) shows in the parameter counts the table prints.

Shapes come from a :class:`Scale`: :data:`FULL` is the "training shape" (B=4, T=1024, d=128, 4 heads,
fp32, CPU), :data:`QUICK` the same with fewer sweep points, :data:`SMOKE` tiny shapes for tests.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F

from xlstm_zoo.bench.packed_cases import packed_cases
from xlstm_zoo.backends import GateSchemes, linear_step, mlstm_sequence
from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.config import BuildContext
from xlstm_zoo.recipe import build, load_recipe

MLSTM_PROJ = "stack.blocks.m.cell.proj=blockdiag"  # = the official qkv_proj_blocksize=4 (our proj_blocksize default)
SLSTM_PROJ = "stack.blocks.s.cell.proj=headwise"   # the official sLSTM layer's z/o projections are per head
OFFICIAL_FFN_FACTOR = 1.3                         # FeedForwardConfig(proj_factor=1.3), rounded up to 64
OFFICIAL_FFN_ROUND = 64
# mlstm_kernels 2.0.6 `parallel--native_autograd` forward keeps 8 fp32 [B, H, T, T] intermediates alive
# at once (log-forget matrix, its masked copy, log D, stabilised log D, D, S, C~, C) plus a bool mask.
PARALLEL_TT_MATRICES = 8


class BaselineUnavailable(Exception):
    """The baseline side of a case cannot run here; the message is shown in its table cell."""


@dataclass(frozen=True)
class Scale:
    """Shapes of every case. ``dim``/``heads``: blocks and stacks; ``op_*``: the mLSTM op cases."""

    name: str = "full"
    batch: int = 4
    seq_len: int = 1024
    dim: int = 128
    heads: int = 4
    op_head_dim: int = 64
    chunk_size: int = 64
    sweep_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    sweep_ref: int = 1024
    sweep_batch: int = 1
    positions: tuple[int, ...] = (10, 1000, 10000)
    official_prefill_max: int = 10000  # the official stack returns no state from forward: it steps to a position
    quadratic_limit_bytes: int = 4 * 2**30
    large_dims: tuple[int, ...] = (256, 512, 1024)  # the xLSTM-7B layout vs the official xLSTMLarge
    large_batch: int = 2
    large_seq_len: int = 1024
    large_blocks: int = 4
    large_vocab: int = 1000
    large_heads: int = 4
    large_step_batches: tuple[int, ...] = (1, 16)
    large_prefill: int = 64
    linear_rows: tuple[int, ...] = (1, 2, 4, 8, 16)  # the linear_step op's cases: a step's rows
    linear_size: int = 1024       # ... through 8 square maps of this size (8 x 4 MiB at 1024: from memory)
    gemm_size: int = 1024         # the square fp32 GEMM of the roofline column
    seed: int = 0


FULL = Scale()
QUICK = replace(FULL, name="quick", sweep_lengths=(256, 1024, 4096), official_prefill_max=1000, large_dims=(256,))
SMOKE = replace(FULL, name="smoke", batch=1, seq_len=32, dim=16, heads=4, op_head_dim=8, chunk_size=8,
                sweep_lengths=(16, 32, 64), sweep_ref=32, positions=(2, 8), official_prefill_max=8,
                large_dims=(32,), large_seq_len=32, large_vocab=50, large_blocks=2, large_step_batches=(1, 2),
                large_prefill=8, linear_rows=(1, 2), linear_size=64, gemm_size=64)
SCALES = {s.name: s for s in (FULL, QUICK, SMOKE)}


@dataclass
class Prepared:
    """A zero-argument callable to time, with what the table shows beside its time."""

    fn: Callable[[], Any]
    params: int | None = None
    note: str = ""


@dataclass
class Case:
    name: str
    group: str
    shapes: str
    ours: Callable[[], Prepared]
    baseline: Callable[[], Prepared]
    baseline_name: str = "official"
    memory: bool = False        # also measure peak memory (one extra call per side)
    ref: str | None = None      # case whose times this one's are divided by (the "x ref" column)
    sample_factor: int = 1      # cheap cases take this many times more timed calls (a steadier median)
    roofline: int | None = None # count FLOPs and time a square fp32 GEMM of this size beside the case
    info: dict = field(default_factory=dict)


# --- the official packages (imported lazily: test-only dependencies) --------------------------------


def _official_xlstm():
    """The official ``xlstm`` classes, or BaselineUnavailable("not installed ...")."""
    try:  # the official package: an optional baseline (test extra)
        from xlstm.blocks.mlstm.block import mLSTMBlockConfig
        from xlstm.blocks.mlstm.layer import mLSTMLayerConfig
        from xlstm.blocks.slstm.block import sLSTMBlockConfig
        from xlstm.blocks.slstm.layer import sLSTMLayerConfig
        from xlstm.components.feedforward import FeedForwardConfig
        from xlstm.xlstm_block_stack import xLSTMBlockStack, xLSTMBlockStackConfig
    except ImportError as err:
        raise BaselineUnavailable(f"not installed (xlstm: {err})") from None
    return dict(mLSTMBlockConfig=mLSTMBlockConfig, mLSTMLayerConfig=mLSTMLayerConfig,
                sLSTMBlockConfig=sLSTMBlockConfig, sLSTMLayerConfig=sLSTMLayerConfig,
                FeedForwardConfig=FeedForwardConfig, xLSTMBlockStack=xLSTMBlockStack,
                xLSTMBlockStackConfig=xLSTMBlockStackConfig)


def _official_mlstm_kernel(name: str):
    try:  # an optional baseline (test extra)
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError as err:
        raise BaselineUnavailable(f"not installed (mlstm_kernels: {err})") from None
    return get_mlstm_kernel(name)


def official_stack(scale: Scale, num_blocks: int, slstm_at, *, function: str = "slstm",
                   context_length: int | None = None) -> torch.nn.Module:
    """The official ``xLSTMBlockStack`` (NeurIPS blocks) at the scale's dim and heads, CPU backends."""
    x = _official_xlstm()
    cfg = x["xLSTMBlockStackConfig"](
        mlstm_block=x["mLSTMBlockConfig"](mlstm=x["mLSTMLayerConfig"](
            conv1d_kernel_size=4, qkv_proj_blocksize=4, num_heads=scale.heads)),
        slstm_block=x["sLSTMBlockConfig"](
            slstm=x["sLSTMLayerConfig"](backend="vanilla", num_heads=scale.heads, conv1d_kernel_size=4,
                                        bias_init="powerlaw_blockdependent", function=function),
            feedforward=x["FeedForwardConfig"](proj_factor=OFFICIAL_FFN_FACTOR, act_fn="gelu")),
        context_length=context_length or scale.seq_len, num_blocks=num_blocks, embedding_dim=scale.dim,
        slstm_at=slstm_at)
    return x["xLSTMBlockStack"](cfg)


# --- ours ---------------------------------------------------------------------------------------------


def _ffn_factor(dim: int) -> float:
    """Our MLP factor giving the official feed-forward width (1.3 * dim rounded up to 64; 1.5 at dim 128)."""
    return OFFICIAL_FFN_ROUND * math.ceil(OFFICIAL_FFN_FACTOR * dim / OFFICIAL_FFN_ROUND) / dim


def recipe_overrides(recipe: str, scale: Scale, num_blocks: int | None = None) -> list[str]:
    """The --set overrides that give our recipe the official architecture at this scale."""
    common = [f"dim={scale.dim}"]
    if recipe == "lstm_up_projection":  # the official sLSTM block with function="lstm": post-up, conv 4, FFN
        return common + ["stack.pattern=l", "stack.blocks.l.conv_kernel=4", f"stack.blocks.l.cell.num_heads={scale.heads}",
                         f"stack.blocks.l.mlp.proj_factor={_ffn_factor(scale.dim)}"]
    out = common + [MLSTM_PROJ, SLSTM_PROJ, f"stack.blocks.m.cell.num_heads={scale.heads}",
                    f"stack.blocks.s.cell.num_heads={scale.heads}", f"stack.blocks.s.mlp.proj_factor={_ffn_factor(scale.dim)}",
                    f"stack.blocks.m.cell.chunk_size={scale.chunk_size}"]
    if num_blocks is not None:
        out.append(f"stack.num_blocks={num_blocks}")
    return out


def our_model(recipe: str, scale: Scale, num_blocks: int | None = None):
    torch.manual_seed(scale.seed)
    return build(load_recipe(recipe, recipe_overrides(recipe, scale, num_blocks)))


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- what is timed ------------------------------------------------------------------------------------


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _forward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    module.eval()

    def fn():
        with torch.no_grad():
            _first(module(x))
    return fn


def _forward_backward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """Sum of the output, backward to the input and every parameter (gradients reset each call)."""
    module.train()
    xg = x.detach().clone().requires_grad_()

    def fn():
        module.zero_grad(set_to_none=True)
        xg.grad = None
        _first(module(xg)).sum().backward()
    return fn


def _input(scale: Scale) -> torch.Tensor:
    g = torch.Generator().manual_seed(scale.seed + 1)
    return torch.randn(scale.batch, scale.seq_len, scale.dim, generator=g)


# (case id, title, our recipe, blocks, official slstm_at, official function)
ARCHITECTURES = [
    ("mlstm_block", "mLSTM block", "xlstm_1_0", 1, [], "slstm"),
    ("slstm_block", "sLSTM block", "xlstm_0_1", 1, "all", "slstm"),
    ("lstm_block", "LSTM block", "lstm_up_projection", 1, "all", "lstm"),
    ("xlstm_1_0", "xLSTM[1:0]", "xlstm_1_0", 4, [], "slstm"),
    ("xlstm_0_1", "xLSTM[0:1]", "xlstm_0_1", 4, "all", "slstm"),
    ("xlstm_7_1", "xLSTM[7:1]", "xlstm_7_1", 8, [1], "slstm"),
]


def _architecture_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} heads={scale.heads} fp32"
    for key, title, recipe, blocks, slstm_at, function in ARCHITECTURES:
        nb = 1 if recipe == "lstm_up_projection" else blocks
        for group, wrap, label in (("forward", _forward, "fwd"), ("forward+backward", _forward_backward, "fwdbwd")):
            def ours(recipe=recipe, nb=nb, wrap=wrap):
                stack = our_model(recipe, scale, None if recipe == "lstm_up_projection" else nb).stack
                return Prepared(wrap(stack, _input(scale)), count(stack),
                                note="build(load_recipe(recipe, overrides)).stack (overrides in results.json)")

            def baseline(nb=nb, slstm_at=slstm_at, function=function, wrap=wrap):
                torch.manual_seed(scale.seed)
                stack = official_stack(scale, nb, slstm_at, function=function)
                return Prepared(wrap(stack, _input(scale)), count(stack),
                                note="xlstm.xLSTMBlockStack (same layout; its mLSTM layer runs the parallel form, "
                                     "its sLSTM the vanilla backend)")

            cases.append(Case(f"{label}/{key}", group, shapes, ours, baseline,
                              info=dict(title=title, recipe=recipe, overrides=recipe_overrides(recipe, scale, nb))))
    return cases


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


def _op_cases(scale: Scale) -> list[Case]:
    B, H, T, D, L = scale.batch, scale.heads, scale.seq_len, scale.op_head_dim, scale.chunk_size
    shapes = f"B={B} H={H} T={T} Dqk=Dv={D} chunk={L} fp32"
    cases = []
    for label, group, backward in (("fwd", "mLSTM op", False), ("fwdbwd", "mLSTM op", True)):
        def ours(backward=backward):
            return Prepared(_op_callable(_our_mlstm(L), _qkvif(B, H, T, D, scale.seed, backward), backward),
                            note="mlstm_sequence chunkwise (default dispatch)")

        def baseline(backward=backward):
            kernel = _official_mlstm_kernel("chunkwise--native_autograd")
            op = lambda q, k, v, i, f: kernel(q, k, v, i, f, chunk_size=L)  # noqa: E731
            return Prepared(_op_callable(op, _qkvif(B, H, T, D, scale.seed, backward), backward),
                            note="chunkwise--native_autograd")

        cases.append(Case(f"op/mlstm_chunkwise/{label}", group + (" fwd+bwd" if backward else " fwd"), shapes,
                          ours, baseline, baseline_name="mlstm_kernels"))
    return cases


def parallel_bytes(batch: int, heads: int, seq_len: int) -> int:
    """Estimated peak of the official quadratic parallel form (its T x T intermediates)."""
    return PARALLEL_TT_MATRICES * batch * heads * seq_len * seq_len * 4 + seq_len * seq_len


def _sweep_cases(scale: Scale) -> list[Case]:
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
            kernel = _official_mlstm_kernel("parallel--native_autograd")
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


GENERATION_SAMPLE_FACTOR = 10  # a step takes milliseconds: ten times the repeats for a steady median


def _our_step(scale: Scale, p: int, compiled: bool = False) -> Prepared:
    """One generation step of our xLSTM[7:1] model at position ``p`` (prefilled chunkwise); ``compiled``:
    through ``model.compiled_step()`` (torch.compile), compiled here, outside the timed calls."""
    model = our_model("xlstm_7_1", scale).eval()
    g = torch.Generator().manual_seed(scale.seed + 2)
    tokens = torch.randint(0, model.embedding.num_embeddings, (1, p + 1), generator=g)
    with torch.no_grad():
        _, prefilled = model(tokens[:, :p])  # chunkwise prefill to position p
    token = tokens[:, p]
    step = model.compiled_step() if compiled else model.step
    if compiled:
        with torch.no_grad():
            step(token, prefilled)

    def fn():  # every call steps from the same state: the position stays p
        with torch.no_grad():
            step(token, prefilled)
    return Prepared(fn, count(model.stack), note="model.compiled_step() (torch.compile; embedding + stack + head)"
                    if compiled else "model.step (embedding + stack + head)")


def _official_step(scale: Scale, p: int) -> Prepared:
    """One step of the official xLSTM[7:1] stack at position ``p`` (prefilled by official steps)."""
    if p > scale.official_prefill_max:
        raise BaselineUnavailable(f"skipped: the official forward returns no state, reaching position {p} "
                                  f"takes {p} official steps (limit {scale.official_prefill_max}; full run)")
    torch.manual_seed(scale.seed)
    stack = official_stack(scale, 8, [1], context_length=16).eval()
    g = torch.Generator().manual_seed(scale.seed + 3)
    xs = torch.randn(1, p + 1, scale.dim, generator=g)
    state = None
    with torch.no_grad():
        for t in range(p):  # official prefill: one step per token
            _, state = stack.step(xs[:, t:t + 1], state)
    x_t = xs[:, p:p + 1]

    def fn():
        with torch.no_grad():
            stack.step(x_t, dict(state))  # step() writes into the dict it gets
    return Prepared(fn, count(stack), note="xLSTMBlockStack.step (stack only)")


def _generation_cases(scale: Scale) -> list[Case]:
    cases = []
    first = scale.positions[0]
    ref_name = f"generate/xlstm_7_1/pos={first}"
    for p in scale.positions:
        cases.append(Case(f"generate/xlstm_7_1/pos={p}", "generation step (B=1)", f"B=1 d={scale.dim} position {p}",
                          lambda p=p: _our_step(scale, p), lambda p=p: _official_step(scale, p), memory=False,
                          ref=ref_name, info=dict(position=p), sample_factor=GENERATION_SAMPLE_FACTOR))
    # The step a user gets from generate(compile=True): eagerly a step is ~1,000 small ops (dispatch-bound).
    cases.append(Case(f"generate/xlstm_7_1_compiled/pos={first}", "generation step (B=1), ours compiled",
                      f"B=1 d={scale.dim} position {first}", lambda: _our_step(scale, first, compiled=True),
                      lambda: _official_step(scale, first), memory=False, info=dict(position=first),
                      sample_factor=GENERATION_SAMPLE_FACTOR))
    # Does a step get slower as the position grows? Our step at p against our step at the first
    # position, interleaved in one case, so a drift in machine speed hits both.
    for p in scale.positions[1:]:
        cases.append(Case(f"generate/position/pos={p}", "step latency vs position", f"B=1 d={scale.dim} position {p} vs {first}",
                          lambda p=p: _our_step(scale, p),
                          lambda: replace(_our_step(scale, first), note=f"the same model.step at position {first}"),
                          baseline_name=f"ours at position {first}", info=dict(position=p),
                          sample_factor=GENERATION_SAMPLE_FACTOR))
    return cases


# --- the xLSTM-7B layout vs the official xLSTMLarge ---------------------------------------------------

OFFICIAL_LARGE_FFN = 2.6667  # xLSTMLargeConfig defaults: ffn_proj_factor, rounded up to a multiple of 64
OFFICIAL_LARGE_ROUND = 64


def large_overrides(scale: Scale, dim: int) -> list[str]:
    """Our ``xlstm_7b_small`` at the official xLSTMLarge's sizes (same parameter count)."""
    ffn = OFFICIAL_LARGE_ROUND * math.ceil(OFFICIAL_LARGE_FFN * dim / OFFICIAL_LARGE_ROUND) / dim
    return [f"dim={dim}", f"vocab_size={scale.large_vocab}", "stack.pattern=" + "m" * scale.large_blocks,
            f"stack.blocks.m.cell.num_heads={scale.large_heads}", f"stack.blocks.m.mlp.proj_factor={ffn}",
            f"stack.blocks.m.cell.chunk_size={scale.chunk_size}"]


def our_large(scale: Scale, dim: int):
    torch.manual_seed(scale.seed)
    return build(load_recipe("xlstm_7b_small", large_overrides(scale, dim)))


def official_large(scale: Scale, dim: int, mode: str) -> torch.nn.Module:
    """The official ``xLSTMLarge`` on its CPU kernels: chunkwise (native autograd) and the native step."""
    try:  # the official package: an optional baseline (test extra)
        from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig
    except ImportError as err:
        raise BaselineUnavailable(f"not installed (xlstm: {err})") from None
    torch.manual_seed(scale.seed)
    return xLSTMLarge(xLSTMLargeConfig(
        embedding_dim=dim, num_heads=scale.large_heads, num_blocks=scale.large_blocks, vocab_size=scale.large_vocab,
        chunkwise_kernel="chunkwise--native_autograd", sequence_kernel="native_sequence__native", step_kernel="native",
        mode=mode, return_last_states=True, chunk_size=scale.chunk_size, autocast_kernel_dtype="float32",
        weight_mode="fused"))  # "fused": one projection for q/k/v/o/gates, the faster of its two modes here


def _tokens(scale: Scale, batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(scale.seed + 4)
    return torch.randint(0, scale.large_vocab, (batch, length), generator=g)


def _lm_forward(model, tokens) -> Callable[[], None]:
    model.eval()

    def fn():
        with torch.no_grad():
            _first(model(tokens))
    return fn


def _lm_forward_backward(model, tokens) -> Callable[[], None]:
    """Sum of the logits, backward to every parameter (gradients reset each call)."""
    model.train()

    def fn():
        model.zero_grad(set_to_none=True)
        _first(model(tokens)).sum().backward()
    return fn


def _large_step(model, scale: Scale, batch: int, ours: bool, compiled: bool = False) -> Callable[[], None]:
    """One generation step from a state prefilled over ``large_prefill`` tokens (chunkwise on both sides);
    ``compiled``: our step under torch.compile (compiled here, outside the timed calls)."""
    model.eval()
    tokens = _tokens(scale, batch, scale.large_prefill + 1)
    with torch.no_grad():
        _, state = model(tokens[:, :-1])
    if ours:
        token = tokens[:, -1]
        step = model.compiled_step() if compiled else model.step
        with torch.no_grad():
            step(token, state)

        def fn():
            with torch.no_grad():
                step(token, state)
        return fn
    token = tokens[:, -1:]

    def fn():  # T=1 in inference mode: the official native step kernel
        with torch.no_grad():
            model(token, {k: tuple(v) for k, v in state.items()})
    return fn


def _large_cases(scale: Scale) -> list[Case]:
    cases = []
    B, T = scale.large_batch, scale.large_seq_len
    for dim in scale.large_dims:
        shapes = f"B={B} T={T} d={dim} heads={scale.large_heads} blocks={scale.large_blocks} vocab={scale.large_vocab} fp32"
        info = dict(title=f"xLSTM-7B layout d={dim}", recipe="xlstm_7b_small", overrides=large_overrides(scale, dim))
        for label, wrap, mode in (("fwd", _lm_forward, "inference"), ("fwdbwd", _lm_forward_backward, "train")):
            def ours(dim=dim, wrap=wrap):
                model = our_large(scale, dim)
                return Prepared(wrap(model, _tokens(scale, B, T)), count(model),
                                note="build(load_recipe('xlstm_7b_small', overrides)) (embedding + stack + head)")

            def baseline(dim=dim, wrap=wrap, mode=mode):
                model = official_large(scale, dim, mode)
                return Prepared(wrap(model, _tokens(scale, B, T)), count(model),
                                note=f"xlstm.xLSTMLarge, chunkwise--native_autograd, weight_mode=fused, mode={mode}")

            group = "7B layout " + ("forward" if label == "fwd" else "forward+backward")
            cases.append(Case(f"7b/{label}/d={dim}", group, shapes, ours, baseline, info=info,
                              roofline=scale.gemm_size))
        for compiled in (False, True):
            for batch in scale.large_step_batches:
                def ours_step(dim=dim, batch=batch, compiled=compiled):
                    model = our_large(scale, dim)
                    return Prepared(_large_step(model, scale, batch, True, compiled), count(model),
                                    note="model.compiled_step() (torch.compile)" if compiled else "model.step")

                def base_step(dim=dim, batch=batch):
                    model = official_large(scale, dim, "inference")
                    return Prepared(_large_step(model, scale, batch, False), count(model),
                                    note="xlstm.xLSTMLarge, one token in inference mode (native step kernel)")

                name, group = ("step_compiled", "7B layout generation step, ours compiled") if compiled else \
                    ("step", "7B layout generation step")
                cases.append(Case(f"7b/{name}/d={dim}/B={batch}", group, f"B={batch} d={dim} "
                                  f"after {scale.large_prefill} tokens", ours_step, base_step, info=info,
                                  sample_factor=GENERATION_SAMPLE_FACTOR))
        for batch in scale.large_step_batches:
            cases.append(Case(f"7b/step_linears/d={dim}/B={batch}", "7B layout: a step's linear maps vs F.linear",
                              f"B={batch} d={dim}, every linear layer of the model once",
                              lambda dim=dim, batch=batch: _step_linears(scale, dim, batch, ours=True),
                              lambda dim=dim, batch=batch: _step_linears(scale, dim, batch, ours=False),
                              baseline_name="F.linear", sample_factor=GENERATION_SAMPLE_FACTOR))
    return cases


def _step_linears(scale: Scale, dim: int, batch: int, *, ours: bool) -> Prepared:
    """Every linear layer of the 7B layout once on a step's ``[batch, in]`` input, in model order (so each
    weight comes from memory as in a real step): through our layers (the ``linear_step`` op) or ``F.linear``."""
    model = our_large(scale, dim).eval()
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(batch, m.in_features) for m in layers}

    def fn():
        with torch.no_grad():
            for m in layers:
                x = inputs[m.in_features]
                if ours:
                    m(x)
                else:
                    F.linear(x, m.weight, m.bias)
    return Prepared(fn, count(model), note="our Linear layers (linear.step op)" if ours else "torch.nn.functional.linear")


# --- a step's linear maps: the linear_step op vs F.linear ---------------------------------------------------

LINEAR_MAPS = 8  # more weight than the caches hold, so each map comes from memory as in a model's step


def _linear_maps(scale: Scale, rows: int, *, ours: bool) -> Prepared:
    g = torch.Generator().manual_seed(scale.seed)
    n = scale.linear_size
    maps = [(torch.randn(n, n, generator=g), torch.randn(n, generator=g)) for _ in range(LINEAR_MAPS)]
    x = torch.randn(rows, n, generator=g)
    run = linear_step if ours else F.linear

    def fn():
        with torch.no_grad():
            for W, b in maps:
                run(x, W, b)
    return Prepared(fn, LINEAR_MAPS * n * (n + 1),
                    note="xlstm_zoo.backends.linear_step (the dispatcher's choice)" if ours else "F.linear")


def _linear_step_cases(scale: Scale) -> list[Case]:
    n = scale.linear_size
    return [Case(f"linear_step/B={rows}", "a step's linear maps: the linear_step op vs F.linear",
                 f"B={rows}, {LINEAR_MAPS} maps {n} x {n} fp32",
                 lambda rows=rows: _linear_maps(scale, rows, ours=True),
                 lambda rows=rows: _linear_maps(scale, rows, ours=False),
                 baseline_name="F.linear", sample_factor=GENERATION_SAMPLE_FACTOR) for rows in scale.linear_rows]


# --- our LSTM cell vs torch.nn.LSTM (oneDNN) -------------------------------------------------------------


# Interleaved with torch's LSTM, our cell's first 2-4 timed calls after the warm-up grow the heap (3,000-4,000
# page faults, ~3 ms of a 9 ms forward) until the two sides' buffers recycle; with 5 calls the median often
# landed on them (0.88-1.27 against torch.nn.LSTM over runs). The cell is cheap: 20 calls a side.
LSTM_CELL_SAMPLE_FACTOR = 4


def _our_lstm_cell(scale: Scale):
    torch.manual_seed(scale.seed)
    return LSTMCell(LSTMCellConfig(), BuildContext(dim=scale.dim))


def _lstm_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d=hidden={scale.dim} one layer fp32"
    for label, wrap in (("fwd", _forward), ("fwdbwd", _forward_backward)):
        def ours(wrap=wrap):
            cell = _our_lstm_cell(scale)
            return Prepared(wrap(cell, _input(scale)), count(cell), note="LSTMCell (recurrent=full), default dispatch")

        def baseline(wrap=wrap):
            torch.manual_seed(scale.seed)
            lstm = torch.nn.LSTM(scale.dim, scale.dim, batch_first=True)
            return Prepared(wrap(lstm, _input(scale)), count(lstm), note="torch.nn.LSTM (oneDNN on CPU)")

        # No roofline column: torch's flop counter sees no matmul inside the fused LSTM kernel (both sides run one).
        cases.append(Case(f"lstm_cell/{label}", "LSTM cell vs torch.nn.LSTM", shapes, ours, baseline,
                          baseline_name="torch.nn.LSTM", sample_factor=LSTM_CELL_SAMPLE_FACTOR))
    return cases


def _transformers_rwkv_layer(scale: Scale) -> torch.nn.Module:
    """transformers' ``RwkvBlock`` (not the first: no embedding norm) at the scale's width, its CPU path."""
    try:  # optional: transformers is a test extra, never a dependency
        from transformers.models.rwkv.modeling_rwkv import RwkvBlock, RwkvConfig
    except ImportError:
        raise BaselineUnavailable("transformers is not installed (pip install transformers)") from None
    config = RwkvConfig(hidden_size=scale.dim, attention_hidden_size=scale.dim, intermediate_size=4 * scale.dim,
                        num_hidden_layers=2)
    torch.manual_seed(scale.seed)
    layer = RwkvBlock(config, layer_id=1)
    with torch.no_grad():  # its parameters are created empty; random values like ours
        for p in layer.parameters():
            p.normal_(0.0, 0.1)
    return layer


def _rwkv_cases(scale: Scale) -> list[Case]:
    """One RWKV-4 layer (time mixing, channel mixing, two pre-norm residuals) against transformers' block."""
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} fp32"
    overrides = [f"dim={scale.dim}", "stack.pattern=tc", "stack.post_norm.type=none"]
    for label, wrap in (("fwd", _forward), ("fwdbwd", _forward_backward)):
        def ours(wrap=wrap):
            torch.manual_seed(scale.seed)
            stack = build(load_recipe("rwkv", overrides)).stack
            return Prepared(wrap(stack, _input(scale)), count(stack),
                            note="rwkv recipe, one layer (tc): the WKV loop compiled without gradients, "
                                 "chunkwise (16) under autograd")

        def baseline(wrap=wrap):
            layer = _transformers_rwkv_layer(scale)
            return Prepared(wrap(layer, _input(scale)), count(layer), note="transformers RwkvBlock (CPU path: a "
                                                                           "Python loop over time)")

        cases.append(Case(f"rwkv/{label}", "RWKV-4 layer vs transformers", shapes, ours, baseline,
                          baseline_name="transformers", info=dict(recipe="rwkv", overrides=overrides)))
    return cases


# --- the baselines' layers against Hugging Face transformers (a test dependency) ------------------------

def _transformers():
    try:  # optional: transformers is a test dependency, never a runtime one
        import transformers
    except ImportError:
        raise BaselineUnavailable("transformers is not installed (pip install 'xlstm-zoo[test]')") from None
    logging.getLogger("transformers").setLevel(logging.ERROR)  # its "falling back to the reference scan" notes
    return transformers


def _baseline_layer_config(kind: str, scale: Scale):
    """Both sides' shapes: Llama (heads = scale.heads, 2 kv groups, SwiGLU 8/3 d), Mamba (N=16, E=2d, K=4)."""
    t = _transformers()
    if kind == "attention":
        config = t.LlamaConfig(hidden_size=scale.dim, intermediate_size=8 * ((8 * scale.dim // 3 + 7) // 8),
                               num_attention_heads=scale.heads, num_key_value_heads=max(1, scale.heads // 2),
                               num_hidden_layers=1, max_position_embeddings=scale.seq_len, vocab_size=32)
        config._attn_implementation = "sdpa"
        return config
    return t.MambaConfig(hidden_size=scale.dim, state_size=16, expand=2, conv_kernel=4, num_hidden_layers=1,
                         vocab_size=32)


class _HFLlamaLayer(torch.nn.Module):
    """HF's decoder layer with its rotary table computed per call, as the model does (ours does it too)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding  # optional: test dependency
        self.layer, self.rotary = LlamaDecoderLayer(config, 0), LlamaRotaryEmbedding(config)

    def forward(self, x):
        positions = torch.arange(x.shape[1])[None]
        return self.layer(x, position_ids=positions, position_embeddings=self.rotary(x, positions))


def _hf_layer(kind: str, scale: Scale) -> torch.nn.Module:
    config = _baseline_layer_config(kind, scale)
    torch.manual_seed(scale.seed)
    if kind == "attention":
        return _HFLlamaLayer(config)
    from transformers.models.mamba.modeling_mamba import MambaBlock  # optional: test dependency
    block = MambaBlock(config, 0)
    torch.nn.init.ones_(block.mixer.D)  # HF fills these in its model's init, not the block's
    with torch.no_grad():
        block.mixer.A_log.copy_(torch.log(torch.arange(1, 17, dtype=torch.float32)).repeat(block.mixer.A_log.shape[0], 1))
    return block


def _our_layer(kind: str, scale: Scale) -> torch.nn.Module:
    config = _baseline_layer_config(kind, scale)
    recipe = "llama" if kind == "attention" else "mamba"
    cell = (f"stack.blocks.a.cell.max_cache={scale.seq_len}", f"stack.blocks.a.cell.num_heads={scale.heads}",
            f"stack.blocks.a.cell.num_kv_heads={config.num_key_value_heads}") if kind == "attention" else ()
    torch.manual_seed(scale.seed)
    model = build(load_recipe(recipe, [f"dim={scale.dim}", "stack.pattern=" + ("a" if kind == "attention" else "m"),
                                       *cell]))
    return model.stack.blocks[0]


def _baseline_layer_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} fp32"
    for kind, title, what in (("mamba", "Mamba layer vs transformers (CPU path: sequential scan)", "MambaBlock"),
                              ("attention", "Llama layer vs transformers (SDPA)", "LlamaDecoderLayer")):
        for label, wrap in (("fwd", _forward), ("fwdbwd", _forward_backward)):
            def ours(kind=kind, wrap=wrap):
                layer = _our_layer(kind, scale)
                return Prepared(wrap(layer, _input(scale)), count(layer), note="residual block, default dispatch")

            def baseline(kind=kind, wrap=wrap, what=what):
                layer = _hf_layer(kind, scale)
                return Prepared(wrap(layer, _input(scale)), count(layer), note=f"transformers {what}")

            cases.append(Case(f"baselines/{kind}_layer/{label}", f"{title} {label}", shapes, ours, baseline,
                              baseline_name="transformers"))
    return cases


def make_cases(scale: Scale = FULL) -> list[Case]:
    """Every case at this scale, in table order."""
    return (_architecture_cases(scale) + _large_cases(scale) + _lstm_cases(scale) + _op_cases(scale)
            + _linear_step_cases(scale) + _sweep_cases(scale) + _generation_cases(scale) + _rwkv_cases(scale)
            + _baseline_layer_cases(scale) + packed_cases(scale, Prepared, Case))


def case_names(scale: Scale = FULL) -> list[str]:
    return [c.name for c in make_cases(scale)]
