"""The official packages (``xlstm``, ``mlstm_kernels``; test-only dependencies, imported lazily) and our recipes
set to the same architecture at a :class:`~xlstm_zoo.bench.case.Scale`."""

from __future__ import annotations

import math

import torch

from xlstm_zoo.bench.case import BaselineUnavailable, Scale
from xlstm_zoo.recipe_loader import build, load_recipe

MLSTM_PROJ = "stack.blocks.m.cell.proj=blockdiag"  # = the official qkv_proj_blocksize=4 (our proj_blocksize default)
SLSTM_PROJ = "stack.blocks.s.cell.proj=headwise"   # the official sLSTM layer's z/o projections are per head
MLSTM_ROUND = "stack.blocks.m.multiple_of=64"      # the official mLSTM up-projection: 2 * dim rounded up to 64
OFFICIAL_FFN_FACTOR = 1.3                         # FeedForwardConfig(proj_factor=1.3), rounded up to 64
OFFICIAL_FFN_ROUND = 64




def _official_xlstm():
    """The official ``xlstm`` classes, or BaselineUnavailable("not installed ...")."""
    try:  # the official package: an optional baseline (test extra)
        from xlstm.blocks.mlstm.block import mLSTMBlockConfig
        from xlstm.blocks.mlstm.layer import mLSTMLayerConfig
        from xlstm.blocks.slstm.block import sLSTMBlockConfig
        from xlstm.blocks.slstm.layer import sLSTMLayerConfig
        from xlstm.components.feedforward import FeedForwardConfig
        from xlstm.xlstm_block_stack import xLSTMBlockStack, xLSTMBlockStackConfig
        from xlstm.xlstm_lm_model import xLSTMLMModel, xLSTMLMModelConfig
    except ImportError as err:
        raise BaselineUnavailable(f"not installed (xlstm: {err})") from None
    return dict(mLSTMBlockConfig=mLSTMBlockConfig, mLSTMLayerConfig=mLSTMLayerConfig,
                sLSTMBlockConfig=sLSTMBlockConfig, sLSTMLayerConfig=sLSTMLayerConfig,
                FeedForwardConfig=FeedForwardConfig, xLSTMBlockStack=xLSTMBlockStack,
                xLSTMBlockStackConfig=xLSTMBlockStackConfig, xLSTMLMModel=xLSTMLMModel,
                xLSTMLMModelConfig=xLSTMLMModelConfig)


def official_mlstm_kernel(name: str):
    try:  # an optional baseline (test extra)
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError as err:
        raise BaselineUnavailable(f"not installed (mlstm_kernels: {err})") from None
    return get_mlstm_kernel(name)


def _official_config(config_class: str, scale: Scale, num_blocks: int, slstm_at, function: str,
                     context_length: int | None, **extra):
    """The official stack's config (NeurIPS blocks) at the scale's dim and heads, CPU backends."""
    x = _official_xlstm()
    return x[config_class](
        mlstm_block=x["mLSTMBlockConfig"](mlstm=x["mLSTMLayerConfig"](
            conv1d_kernel_size=4, qkv_proj_blocksize=4, num_heads=scale.heads)),
        slstm_block=x["sLSTMBlockConfig"](
            slstm=x["sLSTMLayerConfig"](backend="vanilla", num_heads=scale.heads, conv1d_kernel_size=4,
                                        bias_init="powerlaw_blockdependent", function=function),
            feedforward=x["FeedForwardConfig"](proj_factor=OFFICIAL_FFN_FACTOR, act_fn="gelu")),
        context_length=context_length or scale.seq_len, num_blocks=num_blocks, embedding_dim=scale.dim,
        slstm_at=slstm_at, **extra)


def official_stack(scale: Scale, num_blocks: int, slstm_at, *, function: str = "slstm",
                   context_length: int | None = None) -> torch.nn.Module:
    """The official ``xLSTMBlockStack`` (NeurIPS blocks) at the scale's dim and heads, CPU backends."""
    config = _official_config("xLSTMBlockStackConfig", scale, num_blocks, slstm_at, function, context_length)
    return _official_xlstm()["xLSTMBlockStack"](config)


def official_lm(scale: Scale, num_blocks: int, slstm_at, vocab_size: int) -> torch.nn.Module:
    """The official ``xLSTMLMModel`` (tied embedding and head, as ours) around that stack, for ``lm_seq_len`` tokens."""
    config = _official_config("xLSTMLMModelConfig", scale, num_blocks, slstm_at, "slstm", scale.lm_seq_len,
                              vocab_size=vocab_size, tie_weights=True)
    torch.manual_seed(scale.seed)
    model = _official_xlstm()["xLSTMLMModel"](config)
    model.reset_parameters()
    return model


# --- ours ---------------------------------------------------------------------------------------------


def ffn_factor(dim: int) -> float:
    """Our MLP factor giving the official feed-forward width (1.3 * dim rounded up to 64; 1.5 at dim 128)."""
    return OFFICIAL_FFN_ROUND * math.ceil(OFFICIAL_FFN_FACTOR * dim / OFFICIAL_FFN_ROUND) / dim


def recipe_overrides(recipe: str, scale: Scale, num_blocks: int | None = None) -> list[str]:
    """The --set overrides that give our recipe the official architecture at this scale."""
    common = [f"dim={scale.dim}"]
    if recipe == "lstm_up_projection":  # the official sLSTM block with function="lstm": post-up, conv 4, FFN
        return common + ["stack.pattern=l", "stack.blocks.l.conv_kernel=4", f"stack.blocks.l.cell.num_heads={scale.heads}",
                         f"stack.blocks.l.mlp.proj_factor={ffn_factor(scale.dim)}"]
    out = common + [MLSTM_PROJ, MLSTM_ROUND, SLSTM_PROJ, f"stack.blocks.m.cell.num_heads={scale.heads}",
                    f"stack.blocks.s.cell.num_heads={scale.heads}", f"stack.blocks.s.mlp.proj_factor={ffn_factor(scale.dim)}",
                    f"stack.blocks.m.cell.chunk_size={scale.chunk_size}"]
    if num_blocks is not None:
        out.append(f"stack.num_blocks={num_blocks}")
    return out


def our_model(recipe: str, scale: Scale, num_blocks: int | None = None, extra: list[str] | None = None):
    torch.manual_seed(scale.seed)
    return build(load_recipe(recipe, recipe_overrides(recipe, scale, num_blocks) + (extra or [])))



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
