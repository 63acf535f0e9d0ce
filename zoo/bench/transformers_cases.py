"""The baselines' layers (RWKV-4, Llama, Mamba) against Hugging Face transformers (a test dependency)."""

from __future__ import annotations

import logging

import torch

from xlstm_zoo.bench.case import BaselineUnavailable, Case, Prepared, Scale, count, forward, forward_backward, stack_input
from xlstm_zoo.recipe_loader import build, load_recipe


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


def rwkv_cases(scale: Scale) -> list[Case]:
    """One RWKV-4 layer (time mixing, channel mixing, two pre-norm residuals) against transformers' block."""
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} fp32"
    overrides = [f"dim={scale.dim}", "stack.pattern=tc", "stack.post_norm.type=none"]
    for label, wrap in (("fwd", forward), ("fwdbwd", forward_backward)):
        def ours(wrap=wrap):
            torch.manual_seed(scale.seed)
            stack = build(load_recipe("rwkv", overrides)).stack
            return Prepared(wrap(stack, stack_input(scale)), count(stack),
                            note="rwkv recipe, one layer (tc): the WKV loop compiled, forward and backward")

        def baseline(wrap=wrap):
            layer = _transformers_rwkv_layer(scale)
            return Prepared(wrap(layer, stack_input(scale)), count(layer), note="transformers RwkvBlock (CPU path: a "
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


def baseline_layer_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} fp32"
    for kind, title, what in (("mamba", "Mamba layer vs transformers (CPU path: sequential scan)", "MambaBlock"),
                              ("attention", "Llama layer vs transformers (SDPA)", "LlamaDecoderLayer")):
        for label, wrap in (("fwd", forward), ("fwdbwd", forward_backward)):
            def ours(kind=kind, wrap=wrap):
                layer = _our_layer(kind, scale)
                return Prepared(wrap(layer, stack_input(scale)), count(layer), note="residual block, default dispatch")

            def baseline(kind=kind, wrap=wrap, what=what):
                layer = _hf_layer(kind, scale)
                return Prepared(wrap(layer, stack_input(scale)), count(layer), note=f"transformers {what}")

            cases.append(Case(f"baselines/{kind}_layer/{label}", f"{title} {label}", shapes, ours, baseline,
                              baseline_name="transformers"))
    return cases
