"""Hugging Face Llama (``LlamaForCausalLM``) and Mamba (``MambaForCausalLM``) directories.

Both become a ``causal_lm`` whose stack repeats one ``residual`` block (RMSNorm first):

- Llama: the ``attention`` cell (q, k, v, o; rotary positions; grouped key/value heads), then a
  SwiGLU MLP whose ``up`` is ``cat([gate_proj, up_proj])``; ``max_cache`` = ``max_position_embeddings``;
- Mamba: the ``mamba`` cell (no MLP); the conv weight ``[E, 1, K]`` loses its middle axis.

Sizes come from the tensors and are cross-checked with ``config.json``; a config switch we do not
implement (a rope type other than default, an activation other than SiLU, Mamba without a conv
bias) is refused naming the field, never loaded approximately. docs/pretrained.md lists every key.
"""

from __future__ import annotations

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.mapping import Rule
from xlstm_zoo.pretrained.tensorfile import TensorSource

MODEL_TYPES = ("llama", "mamba")


def _layers(source: TensorSource, prefix: str) -> int:
    found = {int(k[len(prefix):].split(".")[0]) for k in source.keys() if k.startswith(prefix)}
    if not found or found != set(range(len(found))):
        raise ConfigError(f"no consecutive {prefix}0 .. N keys (found layers {sorted(found)})")
    return len(found)


def _agrees(config: dict, field: str, actual, what: str) -> None:
    if config.get(field) not in (None, "auto") and config[field] != actual:  # Mamba's time_step_rank may be auto
        raise ConfigError(f"{field}={config[field]} but the tensors have {what} {actual}", path=field)


def _refuse_unless(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{field}={value!r} is not supported (allowed: {allowed}); refusing to load it "
                          "approximately", path=field)


def recipe(config: dict, source: TensorSource, name: str) -> dict:
    kind = config.get("model_type")
    make = {"llama": _llama_recipe, "mamba": _mamba_recipe}[kind]
    data = make(config, source)
    tied = "lm_head.weight" not in source
    _agrees(config, "tie_word_embeddings", tied, "a tied head (no lm_head.weight):")
    return {"name": f"{name} (converted)", "description": f"converted from a Hugging Face {kind} checkpoint",
            "model": {"type": "causal_lm", "vocab_size": data.pop("vocab"), "dim": data.pop("dim"),
                      "tie_weights": tied, "stack": data["stack"]}}


def _stack(block: dict, layers: int, eps: float, letter: str) -> dict:
    return {"stack": {"type": "xlstm", "pattern": letter * layers, "blocks": {letter: block},
                      "post_norm": {"type": "rmsnorm", "eps": eps}}}


def _llama_recipe(config: dict, source: TensorSource) -> dict:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _refuse_unless(rope_type == "default", "rope_parameters.rope_type", rope_type, "default")
    _refuse_unless(config.get("hidden_act", "silu") == "silu", "hidden_act", config.get("hidden_act"), "silu")
    _refuse_unless(config.get("pretraining_tp", 1) == 1, "pretraining_tp", config.get("pretraining_tp"), "1")
    vocab, dim = source.shape("model.embed_tokens.weight")
    _agrees(config, "hidden_size", dim, "width")
    _agrees(config, "vocab_size", vocab, "vocabulary size")
    layers = _layers(source, "model.layers.")
    _agrees(config, "num_hidden_layers", layers, "layers:")
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int):
        raise ConfigError("num_attention_heads is missing: the tensors cannot tell heads from head size",
                          path="num_attention_heads")
    q_rows = source.shape("model.layers.0.self_attn.q_proj.weight")[0]
    if q_rows % heads:
        raise ConfigError(f"q_proj has {q_rows} rows, not a multiple of num_attention_heads={heads}",
                          path="num_attention_heads")
    head_dim = q_rows // heads
    _agrees(config, "head_dim", head_dim, "head size")
    kv_heads = source.shape("model.layers.0.self_attn.k_proj.weight")[0] // head_dim
    _agrees(config, "num_key_value_heads", kv_heads, "key/value heads")
    eps = float(config.get("rms_norm_eps", 1e-6))
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    bias = "model.layers.0.self_attn.q_proj.bias" in source
    mlp_bias = "model.layers.0.mlp.down_proj.bias" in source
    rms = {"type": "rmsnorm", "eps": eps}
    block = {"type": "residual", "norm": rms, "mlp_norm": rms,
             "cell": {"type": "attention", "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
                      "rope_theta": theta, "bias": bias, "max_cache": int(config.get("max_position_embeddings", 2048))},
             "mlp": {"activation": "silu", "hidden_dim": source.shape("model.layers.0.mlp.down_proj.weight")[1],
                     "bias": mlp_bias}}
    return {"vocab": vocab, "dim": dim, **_stack(block, layers, eps, "a")}


def _mamba_recipe(config: dict, source: TensorSource) -> dict:
    _refuse_unless(config.get("hidden_act", "silu") == "silu", "hidden_act", config.get("hidden_act"), "silu")
    _refuse_unless(config.get("use_conv_bias", True), "use_conv_bias", config.get("use_conv_bias"), "true")
    vocab, dim = source.shape("backbone.embeddings.weight")
    _agrees(config, "hidden_size", dim, "width")
    _agrees(config, "vocab_size", vocab, "vocabulary size")
    layers = _layers(source, "backbone.layers.")
    _agrees(config, "num_hidden_layers", layers, "layers:")
    m = "backbone.layers.0.mixer."
    inner, state = source.shape(m + "A_log")
    _agrees(config, "intermediate_size", inner, "inner size")
    _agrees(config, "state_size", state, "state size")
    rank = source.shape(m + "dt_proj.weight")[1]
    _agrees(config, "time_step_rank", rank, "dt rank")
    kernel = source.shape(m + "conv1d.weight")[2]
    _agrees(config, "conv_kernel", kernel, "conv kernel")
    eps = float(config.get("layer_norm_epsilon", 1e-5))
    rms = {"type": "rmsnorm", "eps": eps}
    block = {"type": "residual", "norm": rms,
             "cell": {"type": "mamba", "state_size": state, "inner_dim": inner, "dt_rank": rank, "conv_kernel": kernel,
                      "bias": m + "in_proj.bias" in source}}
    return {"vocab": vocab, "dim": dim, **_stack(block, layers, eps, "m")}


def _with_bias(source, theirs: str, ours: str, field: str | None = None) -> list[Rule]:
    out = [Rule(f"{ours}.weight", (f"{theirs}.weight",), field=field)]
    if f"{theirs}.bias" in source:
        out.append(Rule(f"{ours}.bias", (f"{theirs}.bias",), field=field))
    return out


def _conv(w):
    return w[:, 0, :]


def _cat(gate, up):
    return torch.cat([gate, up], 0)


def rules(source: TensorSource, config: dict, model_config) -> list[Rule]:
    """Source key -> zoo key for every tensor."""
    llama = config.get("model_type") == "llama"
    layers = len(model_config.stack.layout())
    out = [Rule("embedding.weight", ("model.embed_tokens.weight" if llama else "backbone.embeddings.weight",),
                field="model.dim / model.vocab_size")]
    for i in range(layers):
        z = f"stack.blocks.{i}."
        if llama:
            b = f"model.layers.{i}."
            field = "model.stack.blocks.a.cell."
            out.append(Rule(z + "norm.weight", (b + "input_layernorm.weight",)))
            for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
                out += _with_bias(source, b + "self_attn." + theirs, z + "cell." + ours, field + "num_kv_heads")
            out.append(Rule(z + "mlp_norm.weight", (b + "post_attention_layernorm.weight",)))
            mlp = b + "mlp."
            for part in ("weight", "bias"):
                if part == "weight" or mlp + "gate_proj.bias" in source:
                    out.append(Rule(z + f"mlp.up.{part}", (mlp + f"gate_proj.{part}", mlp + f"up_proj.{part}"), _cat,
                                    "cat([gate_proj, up_proj], 0)", "model.stack.blocks.a.mlp.hidden_dim"))
            out += _with_bias(source, mlp + "down_proj", z + "mlp.down", "model.stack.blocks.a.mlp.hidden_dim")
        else:
            b, m = f"backbone.layers.{i}.", f"backbone.layers.{i}.mixer."
            field = "model.stack.blocks.m.cell."
            out.append(Rule(z + "norm.weight", (b + "norm.weight",)))
            out += _with_bias(source, m + "in_proj", z + "cell.in_proj", field + "inner_dim")
            out += [Rule(z + "cell.conv.weight", (m + "conv1d.weight",), _conv, "[:, 0, :]", field + "conv_kernel"),
                    Rule(z + "cell.conv.bias", (m + "conv1d.bias",)),
                    Rule(z + "cell.x_proj.weight", (m + "x_proj.weight",), field=field + "state_size"),
                    Rule(z + "cell.dt_proj.weight", (m + "dt_proj.weight",), field=field + "dt_rank"),
                    Rule(z + "cell.dt_proj.bias", (m + "dt_proj.bias",)),
                    Rule(z + "cell.A_log", (m + "A_log",), field=field + "state_size"),
                    Rule(z + "cell.D", (m + "D",))]
            out += _with_bias(source, m + "out_proj", z + "cell.out_proj", field + "inner_dim")
    out.append(Rule("stack.post_norm.weight", ("model.norm.weight" if llama else "backbone.norm_f.weight",)))
    if "lm_head.weight" in source:
        out.append(Rule("head.weight", ("lm_head.weight",), field="model.tie_weights"))
    return out


# --- writing the HF layout ---------------------------------------------------------------------------

def model_type_of(model) -> str | None:
    """``llama`` or ``mamba`` when ``model`` is one of those layouts' shapes of stack, else None."""
    stack = model.config.stack
    if stack.type != "xlstm" or len(set(stack.layout())) != 1:
        return None
    cell = stack.blocks[stack.layout()[0]].cell.type
    return {"attention": "llama", "mamba": "mamba"}.get(cell)


def hf_export(model) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config.json dict, HF state dict)`` for a Llama- or Mamba-shaped ``causal_lm``; refused,
    naming the field, for anything those classes cannot express."""
    c = model.config
    kind = model_type_of(model)
    block = c.stack.blocks[c.stack.layout()[0]]
    cell = block.cell
    norms = [("block.norm", block.norm), ("model.stack.post_norm", c.stack.post_norm)]
    if kind == "llama":
        norms.append(("block.mlp_norm", block.mlp_norm))
    want = {field: (norm.type == "rmsnorm" and not norm.bias and norm.eps == block.norm.eps,
                    "rmsnorm without bias, one eps") for field, norm in norms}
    want["block.type"] = (block.type == "residual", "residual")
    if kind == "llama":
        want.update({"cell.positions": (cell.positions == "rope", "rope"),
                     "block.mlp": (block.mlp is not None and block.mlp.activation == "silu", "a silu MLP")})
    else:
        want["block.mlp"] = (block.mlp is None, "null (a Mamba layer has no MLP)")
    bad = [f"{k} (must be {need})" for k, (ok, need) in want.items() if not ok]
    if bad:
        raise ConfigError(f"cannot write the HF {kind} layout: " + "; ".join(bad))
    n = len(c.stack.layout())
    blocks = model.stack.blocks
    eps = float(block.norm.eps)
    common = {"vocab_size": c.vocab_size, "hidden_size": c.dim, "num_hidden_layers": n,
              "tie_word_embeddings": bool(c.tie_weights), "dtype": str(model.embedding.weight.dtype).removeprefix("torch.")}
    state = {}
    if kind == "llama":
        head_dim = blocks[0].cell.head_dim
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                  "intermediate_size": blocks[0].mlp.down.weight.shape[1], "num_attention_heads": cell.num_heads,
                  "num_key_value_heads": blocks[0].cell.num_kv_heads, "head_dim": head_dim, "hidden_act": "silu",
                  "max_position_embeddings": cell.max_cache, "rms_norm_eps": eps, "attention_bias": cell.bias,
                  "mlp_bias": block.mlp.bias, "rope_parameters": {"rope_type": "default", "rope_theta": cell.rope_theta}}
        state["model.embed_tokens.weight"] = model.embedding.weight
        for i, blk in enumerate(blocks):
            b = f"model.layers.{i}."
            state[b + "input_layernorm.weight"] = blk.norm.weight
            state[b + "post_attention_layernorm.weight"] = blk.mlp_norm.weight
            for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
                _put(state, b + "self_attn." + theirs, getattr(blk.cell, ours))
            gate, up = blk.mlp.up.weight.chunk(2, 0)
            state.update({b + "mlp.gate_proj.weight": gate, b + "mlp.up_proj.weight": up})
            if blk.mlp.up.bias is not None:
                gate_b, up_b = blk.mlp.up.bias.chunk(2, 0)
                state.update({b + "mlp.gate_proj.bias": gate_b, b + "mlp.up_proj.bias": up_b})
            _put(state, b + "mlp.down_proj", blk.mlp.down)
        state["model.norm.weight"] = model.stack.post_norm.weight
    else:
        mixer = blocks[0].cell
        if mixer.inner % c.dim:
            raise ConfigError(f"cannot write the HF mamba layout: the inner size {mixer.inner} is not a whole multiple "
                              f"of dim={c.dim} (HF's expand is an integer)", path="model.stack.blocks.m.cell.inner_dim")
        config = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", **common,
                  "state_size": mixer.state_size, "intermediate_size": mixer.inner, "expand": mixer.inner // c.dim,
                  "conv_kernel": cell.conv_kernel, "time_step_rank": mixer.dt_rank, "use_bias": cell.bias,
                  "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": eps}
        state["backbone.embeddings.weight"] = model.embedding.weight
        for i, blk in enumerate(blocks):
            b, m = f"backbone.layers.{i}.", f"backbone.layers.{i}.mixer."
            state[b + "norm.weight"] = blk.norm.weight
            _put(state, m + "in_proj", blk.cell.in_proj)
            state.update({m + "conv1d.weight": blk.cell.conv.weight[:, None, :], m + "conv1d.bias": blk.cell.conv.bias,
                          m + "x_proj.weight": blk.cell.x_proj.weight, m + "dt_proj.weight": blk.cell.dt_proj.weight,
                          m + "dt_proj.bias": blk.cell.dt_proj.bias, m + "A_log": blk.cell.A_log, m + "D": blk.cell.D})
            _put(state, m + "out_proj", blk.cell.out_proj)
        state["backbone.norm_f.weight"] = model.stack.post_norm.weight
    if not c.tie_weights:
        state["lm_head.weight"] = model.head.weight
    return config, {k: v.detach().contiguous() for k, v in state.items()}


def _put(state: dict, key: str, layer) -> None:
    state[key + ".weight"] = layer.weight
    if layer.bias is not None:
        state[key + ".bias"] = layer.bias
