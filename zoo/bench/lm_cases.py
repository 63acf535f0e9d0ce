"""One language-model training step (embedding, stack, head, next-token cross-entropy, backward) of each
row of the ``lm_comparison`` grid at its smaller size (``size=s``) against the reference implementation
of the same architecture and size: Hugging Face transformers' ``LlamaForCausalLM``, ``MambaForCausalLM``
and ``RwkvForCausalLM`` (each config built from the row's recipe), and the official ``xlstm`` package's
``xLSTMLMModel`` for the xLSTM rows, ours then in the official layout (:mod:`.official`) at the row's
width, heads and depth. RetNet has no reference installed (transformers has none; torchscale is not a
dependency): its case times ours alone."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from xlstm_zoo.bench.case import BaselineUnavailable, Case, Prepared, Scale, count, first
from xlstm_zoo.bench.official import official_lm, our_model
from xlstm_zoo.bench.transformers_cases import _transformers
from xlstm_zoo.layers import mlp_width
from xlstm_zoo.recipe_loader import Recipe, apply_override, build, load_recipe, validate_recipe

GRID, SIZE = "lm_comparison", "s"
GROUP = "LM training step vs reference implementations"
# xLSTM rows: our model recipe in the official layout, and where the official stack puts its sLSTM blocks
OFFICIAL_ROWS = {"xLSTM[1:0]": ("xlstm_1_0", []), "xLSTM[7:1]": ("xlstm_7_1", [1]), "xLSTM[1:1]": ("xlstm_1_1", [1, 3])}
HF_ROWS = {"Llama": "llama", "Mamba": "mamba", "RWKV-4": "rwkv"}


@functools.cache
def _grid() -> Recipe:
    return load_recipe(GRID)


def grid_row(row: str, vocab: int) -> Recipe:
    """The grid's recipe for ``row`` at ``size=s`` with this vocabulary (the grid's own cell overrides)."""
    base = _grid()
    data = base.model_dump()
    for path, value in base.grid.variant_overrides(row, {"size": SIZE}):
        apply_override(data, path.split("."), value)
    data["grid"], data["model"]["vocab_size"] = None, vocab
    return validate_recipe(data, f"{GRID} row {row} at size={SIZE}")


def tokens(scale: Scale) -> torch.Tensor:
    g = torch.Generator().manual_seed(scale.seed + 7)
    return torch.randint(0, scale.lm_vocab, (scale.lm_batch, scale.lm_seq_len), generator=g)


def training_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """Forward, next-token cross-entropy and backward (gradients reset each call), the same for every side."""
    model.train()

    def fn():
        model.zero_grad(set_to_none=True)
        out = model(ids)
        logits = out.logits if hasattr(out, "logits") else first(out)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return fn


class _HFCausalLM(torch.nn.Module):
    """A transformers causal LM called on token ids alone, without its generation cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False)


def hf_model(row: str, scale: Scale) -> torch.nn.Module:
    """transformers' model of ``row``'s architecture, its config read from our recipe for the row."""
    t, m = _transformers(), grid_row(row, scale.lm_vocab).model
    blocks = m.stack.blocks
    torch.manual_seed(scale.seed)
    if row == "Llama":
        a = blocks["a"]
        config = t.LlamaConfig(
            vocab_size=m.vocab_size, hidden_size=m.dim, intermediate_size=mlp_width(m.dim, a.mlp),
            num_hidden_layers=len(m.stack.pattern), num_attention_heads=a.cell.num_heads,
            num_key_value_heads=a.cell.num_kv_heads, rms_norm_eps=a.norm.eps, rope_theta=a.cell.rope_theta,
            max_position_embeddings=scale.lm_seq_len, tie_word_embeddings=m.tie_weights)
        config._attn_implementation = "sdpa"
        return _HFCausalLM(t.LlamaForCausalLM(config))
    if row == "Mamba":
        c = blocks["m"].cell
        config = t.MambaConfig(
            vocab_size=m.vocab_size, hidden_size=m.dim, state_size=c.state_size, num_hidden_layers=len(m.stack.pattern),
            expand=int(c.expand), conv_kernel=c.conv_kernel, use_bias=c.bias, time_step_rank=c.dt_rank or "auto",
            layer_norm_epsilon=blocks["m"].norm.eps, tie_word_embeddings=m.tie_weights)
        return _HFCausalLM(t.MambaForCausalLM(config))
    tm, cm = blocks["t"].cell, blocks["c"].cell
    config = t.RwkvConfig(
        vocab_size=m.vocab_size, context_length=scale.lm_seq_len, hidden_size=m.dim,
        num_hidden_layers=m.stack.pattern.count("t"), attention_hidden_size=tm.attention_dim or m.dim,
        intermediate_size=cm.hidden_dim or 4 * m.dim, layer_norm_epsilon=blocks["t"].norm.eps, rescale_every=0,
        tie_word_embeddings=m.tie_weights)
    return _HFCausalLM(t.RwkvForCausalLM(config))


def official_shape(row: str, scale: Scale) -> tuple[Scale, int]:
    """The scale at the row's width and mLSTM heads, and its number of blocks."""
    m = grid_row(row, scale.lm_vocab).model
    return replace(scale, dim=m.dim, heads=m.stack.blocks["m"].cell.num_heads), m.stack.num_blocks


def _our_official_layout(row: str, scale: Scale) -> Prepared:
    recipe, _ = OFFICIAL_ROWS[row]
    at, blocks = official_shape(row, scale)
    model = our_model(recipe, at, blocks, [f"vocab_size={scale.lm_vocab}"])
    return Prepared(training_step(model, tokens(scale)), count(model),
                    note=f"{recipe} recipe in the official layout (dim {at.dim}, {blocks} blocks, {at.heads} heads)")


def _official(row: str, scale: Scale) -> Prepared:
    _, slstm_at = OFFICIAL_ROWS[row]
    at, blocks = official_shape(row, scale)
    model = official_lm(at, blocks, slstm_at, scale.lm_vocab)
    return Prepared(training_step(model, tokens(scale)), count(model),
                    note="xlstm.xLSTMLMModel (mLSTM: parallel form; sLSTM: vanilla backend)")


def _our_row(row: str, scale: Scale) -> Prepared:
    torch.manual_seed(scale.seed)
    model = build(grid_row(row, scale.lm_vocab))
    return Prepared(training_step(model, tokens(scale)), count(model), note=f"{GRID} grid row, size={SIZE}")


def _hf(row: str, scale: Scale) -> Prepared:
    model = hf_model(row, scale)
    return Prepared(training_step(model, tokens(scale)), count(model),
                    note=f"transformers {type(model.model).__name__} (CPU path)")


def _no_retnet_reference() -> Prepared:
    raise BaselineUnavailable("no reference installed: transformers has no RetNet, torchscale is not a dependency")


def lm_cases(scale: Scale) -> list[Case]:
    shapes = f"B={scale.lm_batch} T={scale.lm_seq_len} vocab={scale.lm_vocab} fp32, {GRID} size={SIZE}"
    cases = [Case(f"lm/{recipe}", GROUP, shapes, lambda row=row: _our_official_layout(row, scale),
                  lambda row=row: _official(row, scale), info=dict(row=row))
             for row, (recipe, _) in OFFICIAL_ROWS.items()]
    cases += [Case(f"lm/{name}", GROUP, shapes, lambda row=row: _our_row(row, scale), lambda row=row: _hf(row, scale),
                   baseline_name="transformers", info=dict(row=row)) for row, name in HF_ROWS.items()]
    cases.append(Case("lm/retnet", GROUP, shapes, lambda: _our_row("RetNet", scale), _no_retnet_reference,
                      baseline_name="none", info=dict(row="RetNet")))
    return cases
