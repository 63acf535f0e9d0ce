"""xLSTM-7B layouts: Hugging Face ``xLSTMForCausalLM`` and the official ``xlstm_large``.

Both hold the same blocks (``backbone.blocks.{i}``): RMSNorm, the mLSTM layer (q, k, v, output
gate, soft-capped input/forget gates with biases, per-head LayerNorm, out_proj), RMSNorm, SwiGLU.
They differ in the embedding's name (HF ``backbone.embeddings``, xlstm_large ``embedding``) and the
config file (``config.json`` / ``config.yaml``). ``weight_mode: fused`` stores q|k|v|o, i|f and
gate|up as one matrix each. Sizes come from the tensors; the config supplies what tensors cannot
say (eps, soft-caps) and is cross-checked. The xlstm-zoo model is ``causal_lm`` with ``mlstm_7b``
blocks; see docs/pretrained.md for every key.
"""

from __future__ import annotations

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.mapping import Rule
from xlstm_zoo.pretrained.tensorfile import TensorSource

EMBEDDING = {"hf": "backbone.embeddings.weight", "xlstm_large": "embedding.weight"}
LAYER = "backbone.blocks.{i}.mlstm_layer."
# Config fields that only choose kernels or are read by no model code: kept in provenance, never maths.
BACKEND_FIELDS = ("chunkwise_kernel", "sequence_kernel", "step_kernel", "mode", "autocast_kernel_dtype",
                  "inference_state_dtype", "return_last_states", "max_inference_chunksize", "chunk_size",
                  "norm_reduction_force_float32", "torch_dtype")
CPU_KERNELS = {"chunkwise_kernel": "chunkwise--native_autograd", "sequence_kernel": "native_sequence__native",
               "step_kernel": "native"}


def _blocks(source: TensorSource) -> int:
    found = {int(k.split(".")[2]) for k in source.keys() if k.startswith("backbone.blocks.")}
    if not found or found != set(range(len(found))):
        raise ConfigError(f"no consecutive backbone.blocks.0 .. N keys (found blocks {sorted(found)})")
    return len(found)


def _size(config: dict, names: tuple[str, ...], actual: int, what: str) -> None:
    given = {n: config[n] for n in names if config.get(n) is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"the config gives {what} twice, differently: {given} (HF would build a broken model)",
                          path=names[0])
    for name, value in given.items():
        if value != actual:
            raise ConfigError(f"{name}={value} but the tensors have {what} {actual}", path=name)


def recipe(config: dict, source: TensorSource, layout: str, name: str) -> dict:
    """The ``causal_lm`` recipe (a dict) for a 7B-layout checkpoint."""
    for key in ("chunkwise_kernel", "sequence_kernel", "step_kernel"):
        if "siging" in str(config.get(key, "")):
            raise ConfigError(f"{key}={config[key]!r} is a sigmoid-input-gate kernel without the normaliser: a "
                              "different model, not supported (use an exponential-input-gate kernel)", path=key)
    if float(config.get("v_dim_factor", 1.0)) != 1.0:
        raise ConfigError(f"v_dim_factor={config['v_dim_factor']} is not supported (the value width must equal "
                          "the embedding width; allowed: 1.0)", path="v_dim_factor")
    emb = EMBEDDING[layout]
    if emb not in source:
        raise ConfigError(f"no {emb} tensor: not an {layout} checkpoint")
    vocab, dim = source.shape(emb)
    _size(config, ("embedding_dim", "hidden_size"), dim, "the width")
    blocks = _blocks(source)
    _size(config, ("num_blocks", "num_hidden_layers"), blocks, "the number of blocks")
    _size(config, ("vocab_size",), vocab, "the vocabulary size")
    layer0 = LAYER.format(i=0)
    fused = layer0 + "qkv_opreact.weight" in source
    heads = source.shape(layer0 + ("ifgate_preact.weight" if fused else "igate_preact.weight"))[0] // (2 if fused else 1)
    _size(config, ("num_heads",), heads, "heads")
    if fused:
        qk = (source.shape(layer0 + "qkv_opreact.weight")[0] - 2 * dim) // 2
    else:
        qk = source.shape(layer0 + "q.weight")[0]
        if source.shape(layer0 + "v.weight")[0] != dim:
            raise ConfigError(f"the value width {source.shape(layer0 + 'v.weight')[0]} differs from the width {dim}: "
                              "v_dim_factor must be 1.0", path="v_dim_factor")
    ffn = source.shape("backbone.blocks.0.ffn.proj_down.weight")[1]
    bias = (layer0 + ("qkv_opreact.bias" if fused else "q.bias")) in source
    norm_bias = "backbone.blocks.0.norm_mlstm.bias" in source
    eps = float(config.get("norm_eps", 1e-6))
    cap = config.get("gate_soft_cap", 15.0)
    cap = None if cap is None else float(cap)
    logit_cap = config.get("output_logit_soft_cap", 30.0)
    tied = "lm_head.weight" not in source
    rms = {"type": "rmsnorm", "eps": eps, "bias": norm_bias}
    block = {
        "type": "mlstm_7b", "bias": bias, "norm": rms, "mlp_norm": rms,
        "mlp": {"activation": "silu", "hidden_dim": ffn, "bias": bias},
        "cell": {"type": "mlstm", "num_heads": heads, "qk_dim_factor": qk / dim, "output_gate": True,
                 "eps": float(config.get("eps", 1e-6)), "bias": bias, "chunk_size": int(config.get("chunk_size", 64)),
                 "norm": {"type": "multihead_layernorm", "eps": eps, "bias": bias},
                 "input_gate": {"type": "exponential", "softcap": cap},
                 "forget_gate": {"type": "sigmoid", "softcap": cap}},
    }
    has_out_norm = "backbone.out_norm.weight" in source
    return {
        "name": f"{name} (converted)",
        "description": f"converted from the {layout} layout (xLSTM-7B architecture)",
        "model": {"type": "causal_lm", "vocab_size": vocab, "dim": dim, "tie_weights": tied,
                  "logit_softcap": None if logit_cap is None else float(logit_cap),
                  "stack": {"type": "xlstm", "pattern": "m" * blocks, "blocks": {"m": block},
                            "post_norm": {**rms, "bias": "backbone.out_norm.bias" in source} if has_out_norm
                            else {"type": "none"}}},
    }


def rules(source: TensorSource, layout: str, model_config) -> list[Rule]:
    """Source key -> zoo key for every tensor, in the zoo model's order."""
    dim = model_config.dim
    cell = model_config.stack.blocks["m"].cell
    heads, qk = cell.num_heads, round(cell.qk_dim_factor * dim)
    out = [Rule("embedding.weight", (EMBEDDING[layout],), field="model.dim / model.vocab_size")]
    for i in range(len(model_config.stack.layout())):
        b, z = f"backbone.blocks.{i}.", f"stack.blocks.{i}."
        layer = LAYER.format(i=i)
        out += _maybe_bias(source, b + "norm_mlstm", z + "norm")
        if layer + "qkv_opreact.weight" in source:
            out += _split(source, layer + "qkv_opreact", [qk, qk, dim, dim], [z + "cell.q", z + "cell.k", z + "cell.v", z + "cell.o"],
                          "model.stack.blocks.m.cell.qk_dim_factor")
            out += _split(source, layer + "ifgate_preact", [heads, heads],
                          [z + "cell.input_gate.proj", z + "cell.forget_gate.proj"], "model.stack.blocks.m.cell.num_heads",
                          bias_targets=[z + "cell.input_gate.bias", z + "cell.forget_gate.bias"])
        else:
            for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "ogate_preact")):
                out += _maybe_bias(source, layer + theirs, z + f"cell.{ours}", "model.stack.blocks.m.cell.qk_dim_factor")
            for gate, theirs in (("input_gate", "igate_preact"), ("forget_gate", "fgate_preact")):
                out += [Rule(z + f"cell.{gate}.proj.weight", (layer + theirs + ".weight",), field="model.stack.blocks.m.cell.num_heads"),
                        Rule(z + f"cell.{gate}.bias", (layer + theirs + ".bias",))]
        out += _maybe_bias(source, layer + "multihead_norm", z + "cell.norm")
        out += _maybe_bias(source, layer + "out_proj", z + "out_proj")
        out += _maybe_bias(source, b + "norm_ffn", z + "mlp_norm")
        ffn = b + "ffn."
        if ffn + "proj_up_gate_z.weight" in source:
            out += _maybe_bias(source, ffn + "proj_up_gate_z", z + "mlp.up", "model.stack.blocks.m.mlp.hidden_dim")
        else:
            for suffix in ("weight", "bias"):
                if suffix == "weight" or ffn + "proj_up.bias" in source:
                    out.append(Rule(z + f"mlp.up.{suffix}", (ffn + f"proj_up_gate.{suffix}", ffn + f"proj_up.{suffix}"),
                                    lambda gate, up: torch.cat([gate, up], 0), "cat([proj_up_gate, proj_up], 0)",
                                    "model.stack.blocks.m.mlp.hidden_dim"))
        out += _maybe_bias(source, ffn + "proj_down", z + "mlp.down", "model.stack.blocks.m.mlp.hidden_dim")
    if "backbone.out_norm.weight" in source:
        out += _maybe_bias(source, "backbone.out_norm", "stack.post_norm")
    if "lm_head.weight" in source:
        out.append(Rule("head.weight", ("lm_head.weight",), field="model.tie_weights"))
    return out


def _maybe_bias(source, theirs: str, ours: str, field: str | None = None) -> list[Rule]:
    rules = [Rule(f"{ours}.weight", (f"{theirs}.weight",), field=field)]
    if f"{theirs}.bias" in source:
        rules.append(Rule(f"{ours}.bias", (f"{theirs}.bias",), field=field))
    return rules


def _split(source, theirs: str, sizes: list[int], ours: list[str], field: str, bias_targets=None) -> list[Rule]:
    def part(j):
        def take(t):
            if t.shape[0] != sum(sizes):
                raise RuntimeError(f"{theirs} has {t.shape[0]} rows where the split {sizes} needs {sum(sizes)}")
            return t.narrow(0, sum(sizes[:j]), sizes[j])
        return take
    out = []
    for j, target in enumerate(ours):
        note = f"rows {sum(sizes[:j])}:{sum(sizes[:j + 1])} of {sum(sizes)}"
        out.append(Rule(f"{target}.weight", (f"{theirs}.weight",), part(j), note, field))
        if f"{theirs}.bias" in source:
            out.append(Rule(bias_targets[j] if bias_targets else f"{target}.bias", (f"{theirs}.bias",), part(j), note, field))
    return out


# --- writing the HF layout ---------------------------------------------------------------------------

def hf_export(model) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config.json dict, HF state dict)`` for a ``causal_lm`` with official ``mlstm_7b`` blocks;
    refused, naming the field, for anything HF's xLSTM cannot express."""
    c = model.config
    blocks = [c.stack.blocks[letter] for letter in set(c.stack.layout())] if c.stack.type == "xlstm" else []
    if len(blocks) != 1 or blocks[0].type != "mlstm_7b":
        raise ConfigError("the HF layout holds only stacks of mlstm_7b blocks (one template)", path="model.stack")
    block = blocks[0]
    cell = block.cell
    want = {
        "model.logit_softcap": (c.logit_softcap is not None, "a number (HF has no logits without a soft-cap)"),
        "block.norm": (block.norm.type == "rmsnorm" and not block.norm.bias, "rmsnorm without bias"),
        "block.mlp_norm": (block.mlp_norm.type == "rmsnorm" and block.mlp_norm.eps == block.norm.eps
                           and not block.mlp_norm.bias, "rmsnorm with the block norm's eps"),
        "block.mlp.activation": (block.mlp.activation == "silu", "silu"),
        "cell.norm": (cell.norm.type == "multihead_layernorm" and cell.norm.eps == block.norm.eps and not cell.norm.bias,
                      "multihead_layernorm with the block norm's eps, no bias"),
        "cell.output_gate": (cell.output_gate, "true"),
        "cell.gate_input": (cell.gate_input == "x", "x"),
        "cell.proj": (cell.proj == "linear", "linear"),
        "cell.input_gate": (cell.input_gate.type == "exponential" and cell.input_gate.input_dependent
                            and cell.input_gate.proj == "linear", "exponential, input-dependent, linear"),
        "cell.forget_gate": (cell.forget_gate.type == "sigmoid" and cell.forget_gate.softcap == cell.input_gate.softcap
                             and cell.forget_gate.input_dependent and cell.forget_gate.proj == "linear",
                             "sigmoid with the input gate's softcap"),
        "bias": (not (block.bias or cell.bias or block.mlp.bias), "false everywhere (HF's own blocks have no "
                 "use_bias: true)"),
        "model.stack.post_norm": (c.stack.post_norm.type == "rmsnorm" and c.stack.post_norm.eps == block.norm.eps,
                                  "rmsnorm with the block norm's eps"),
    }
    bad = [f"{k} (must be {need})" for k, (ok, need) in want.items() if not ok]
    if bad:
        raise ConfigError("cannot write the HF layout: " + "; ".join(bad))
    dim, heads = c.dim, cell.num_heads
    qk = round(cell.qk_dim_factor * dim)
    width = model.stack.blocks[0].mlp.down.weight.shape[1]
    factor, multiple = ffn_factor(dim, width)
    n = len(c.stack.layout())
    config = {
        "architectures": ["xLSTMForCausalLM"], "model_type": "xlstm",
        "vocab_size": c.vocab_size, "embedding_dim": dim, "hidden_size": dim, "num_blocks": n, "num_hidden_layers": n,
        "num_heads": heads, "qk_dim_factor": qk / dim, "v_dim_factor": 1.0, "use_bias": False,
        "norm_eps": float(block.norm.eps), "eps": float(cell.eps), "norm_reduction_force_float32": True,
        "gate_soft_cap": float(cell.input_gate.softcap) if cell.input_gate.softcap else None,
        "output_logit_soft_cap": float(c.logit_softcap), "ffn_proj_factor": factor,
        "ffn_round_up_to_multiple_of": multiple, "add_out_norm": True, "weight_mode": "single",
        "tie_word_embeddings": bool(c.tie_weights), "chunk_size": int(cell.chunk_size), "mode": "inference",
        "return_last_states": True, "inference_state_dtype": "float32", "autocast_kernel_dtype": "bfloat16",
        **CPU_KERNELS, "dtype": str(model.embedding.weight.dtype).removeprefix("torch."),
    }
    if config["gate_soft_cap"] is None:
        raise ConfigError("cannot write the HF layout: the gates need a softcap (HF requires a number)",
                          path="model.stack.blocks.m.cell.input_gate.softcap")
    state = {"backbone.embeddings.weight": model.embedding.weight}
    for i, blk in enumerate(model.stack.blocks):
        b, layer = f"backbone.blocks.{i}.", LAYER.format(i=i)
        up_gate, up = blk.mlp.up.weight.chunk(2, 0)
        state.update({
            b + "norm_mlstm.weight": blk.norm.weight, layer + "q.weight": blk.cell.q.weight,
            layer + "k.weight": blk.cell.k.weight, layer + "v.weight": blk.cell.v.weight,
            layer + "ogate_preact.weight": blk.cell.o.weight,
            layer + "igate_preact.weight": blk.cell.input_gate.proj.weight, layer + "igate_preact.bias": blk.cell.input_gate.bias,
            layer + "fgate_preact.weight": blk.cell.forget_gate.proj.weight, layer + "fgate_preact.bias": blk.cell.forget_gate.bias,
            layer + "multihead_norm.weight": blk.cell.norm.weight, layer + "out_proj.weight": blk.out_proj.weight,
            b + "norm_ffn.weight": blk.mlp_norm.weight, b + "ffn.proj_up_gate.weight": up_gate,
            b + "ffn.proj_up.weight": up, b + "ffn.proj_down.weight": blk.mlp.down.weight,
        })
    state["backbone.out_norm.weight"] = model.stack.post_norm.weight
    if not c.tie_weights:
        state["lm_head.weight"] = model.head.weight
    return config, {k: v.detach() for k, v in state.items()}


def official_ffn_width(dim: int, factor: float, multiple: int) -> int:
    """The official FFN width: ``int(((x + m - 1) // m) * m)`` with ``x = dim * factor`` (not a ceil)."""
    x = dim * factor
    return int(((x + multiple - 1) // multiple) * multiple)


def ffn_factor(dim: int, width: int) -> tuple[float, int]:
    """``(ffn_proj_factor, ffn_round_up_to_multiple_of)`` that make the official formula give ``width``."""
    for factor, multiple in ((width / dim, 64), (width / dim, width)):
        if official_ffn_width(dim, factor, multiple) == width:
            return factor, multiple
    for multiple in range(1, width + 1):  # float error at both: any divisor that reproduces the width
        if width % multiple == 0 and official_ffn_width(dim, width / dim, multiple) == width:
            return width / dim, multiple
    raise ConfigError(f"no ffn_proj_factor reproduces the FFN width {width} at dim {dim} under the official rounding")

