"""The NeurIPS paper's architecture: official ``xLSTMLMModel`` state dicts.

There is no standard file: a state dict (``.pt`` read with ``weights_only=True``, or
``.safetensors``) plus the ``xLSTMLMModelConfig`` as YAML or a dict (optional; sizes come from the
tensors). mLSTM blocks become ``pre_up`` blocks (gates read cat(q, k, v)), sLSTM blocks
``post_up`` blocks (headwise gates). The transforms, each needed (docs/pretrained.md):

- every LayerNorm stores ``w`` and applies ``1 + w``: add 1;
- the sLSTM layer feeds ``fgate`` into the input slot and ``igate`` into the forget slot: swap the
  weights, not the biases (those live in the cell, indexed by slot);
- the sLSTM recurrent kernel and bias are stored in a backend-specific internal layout (vanilla or
  cuda, told apart by the kernel's shape);
- headwise projections are ``[blocks, out, in]``, ours ``[blocks, in, out]``; conv ``[C, 1, K]``.
"""

from __future__ import annotations

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.mapping import Rule
from xlstm_zoo.pretrained.tensorfile import TensorSource

P = "xlstm_block_stack."
EPS = 1e-5  # every NeurIPS LayerNorm
ACTIVATIONS = {"gelu": "gelu", "swish": "silu", "silu": "silu"}
PREFIXES = ("module.", "_orig_mod.", "model.")


def strip_prefixes(keys: list[str]) -> str:
    """The wrapper prefix (``module.``, ``_orig_mod.``, ``model.``, nested) every key carries, or ''."""
    prefix = ""
    while True:
        for candidate in PREFIXES:
            if keys and all(k.startswith(prefix + candidate) for k in keys):
                prefix += candidate
                break
        else:
            return prefix


def block_kinds(source: TensorSource) -> str:
    kinds = {}
    for key in source.keys():
        if key.startswith(P + "blocks."):
            i = int(key.split(".")[2])
            if ".xlstm.mlstm_cell." in key:
                kinds[i] = "m"
            elif ".xlstm.slstm_cell." in key:
                kinds[i] = "s"
    if not kinds or set(kinds) != set(range(len(kinds))):
        raise ConfigError(f"no consecutive {P}blocks.0 .. N with an mlstm_cell or slstm_cell (found {sorted(kinds)})")
    return "".join(kinds[i] for i in range(len(kinds)))


def model_config(config: dict | None) -> dict:
    """The ``xLSTMLMModelConfig`` fields, bare or under ``model:``."""
    config = dict(config or {})
    return dict(config["model"]) if isinstance(config.get("model"), dict) else config


def recipe(config: dict | None, source: TensorSource, name: str) -> dict:
    cfg = model_config(config)
    vocab, dim = source.shape("token_embedding.weight")
    if isinstance(cfg.get("embedding_dim"), int) and cfg["embedding_dim"] != dim:
        raise ConfigError(f"embedding_dim={cfg['embedding_dim']} but token_embedding has width {dim}", path="embedding_dim")
    if cfg.get("bias") and not any(k.endswith("proj_up.bias") for k in source.keys()):
        raise ConfigError("bias: true but the tensors have no biases", path="bias")
    pattern = block_kinds(source)
    layer_norm = {"type": "layernorm", "bias": False, "eps": EPS}
    blocks = {}
    if "m" in pattern:
        i = pattern.index("m")
        x = f"{P}blocks.{i}.xlstm."
        inner = source.shape(x + "learnable_skip")[0]
        q_blocks, _, block_in = source.shape(x + "q_proj.weight")
        bias = x + "proj_up.bias" in source
        blocks["m"] = {
            "type": "pre_up", "inner_dim": inner, "conv_kernel": source.shape(x + "conv1d.conv.weight")[2], "bias": bias,
            "norm": layer_norm, "cell_norm": {"type": "multihead_layernorm", "eps": EPS},
            "cell": {"type": "mlstm", "num_heads": source.shape(x + "mlstm_cell.igate.weight")[0], "proj": "blockdiag",
                     "proj_blocksize": block_in, "qk_dim_factor": 1.0, "gate_input": "qkv", "bias": bias},
        }
    if "s" in pattern:
        s_cfg = dict(cfg.get("slstm_block") or {})
        if (s_cfg.get("slstm") or {}).get("function", "slstm") != "slstm":
            raise ConfigError("slstm.function must be slstm (the lstm variant is not supported)",
                              path="slstm_block.slstm.function")
        i = pattern.index("s")
        b = f"{P}blocks.{i}."
        heads = source.shape(b + "xlstm.fgate.weight")[0]
        conv = b + "xlstm.conv1d.conv.weight"
        mlp = None
        if b + "ffn.proj_down.weight" in source:
            act = ((s_cfg.get("feedforward") or {}).get("act_fn") or "gelu")
            if act not in ACTIVATIONS:
                raise ConfigError(f"feedforward act_fn {act!r} is not supported (allowed: {', '.join(ACTIVATIONS)})",
                                  path="slstm_block.feedforward.act_fn")
            mlp = {"hidden_dim": source.shape(b + "ffn.proj_down.weight")[1], "activation": ACTIVATIONS[act],
                   "bias": b + "ffn.proj_down.bias" in source}
        headwise = {"proj": "headwise"}
        blocks["s"] = {
            "type": "post_up", "conv_kernel": source.shape(conv)[2] if conv in source else 0,
            "norm": layer_norm, "mlp_norm": layer_norm, "mlp": mlp, "cell_norm": {"type": "multihead_layernorm", "eps": EPS},
            "cell": {"type": "slstm", "num_heads": heads, "proj": "headwise",
                     "input_gate": {"type": "exponential", **headwise}, "forget_gate": {"type": "sigmoid", **headwise}},
        }
    tied = bool(cfg.get("tie_weights", "lm_head.weight" not in source))
    return {
        "name": f"{name} (converted)",
        "description": "converted from an official xLSTMLMModel (NeurIPS architecture)",
        "model": {"type": "causal_lm", "vocab_size": vocab, "dim": dim, "tie_weights": tied,
                  "stack": {"type": "xlstm", "pattern": pattern, "blocks": blocks,
                            "post_norm": layer_norm if P + "post_blocks_norm.weight" in source else {"type": "none"}}},
    }


def _plus_one(w):
    return w + 1


def _headwise(w):
    return w.transpose(1, 2)


def _conv(w):
    return w[:, 0, :]


def rules(source: TensorSource, model_config) -> list[Rule]:
    out = [Rule("embedding.weight", ("token_embedding.weight",))]
    pattern = model_config.stack.layout()
    for i, kind in enumerate(pattern):
        b, z = f"{P}blocks.{i}.", f"stack.blocks.{i}."
        x = b + "xlstm."
        out.append(Rule(z + "norm.norm.weight", (b + "xlstm_norm.weight",), _plus_one, "1 + w"))
        out += _mlstm(source, x, z) if kind == "m" else _slstm(source, b, x, z, model_config)
    if P + "post_blocks_norm.weight" in source:
        out.append(Rule("stack.post_norm.norm.weight", (P + "post_blocks_norm.weight",), _plus_one, "1 + w"))
    if not model_config.tie_weights:
        out.append(Rule("head.weight", ("lm_head.weight",), field="model.tie_weights"))
    return out


def ignored(source: TensorSource, model_config) -> set[str]:
    """Source tensors that hold nothing new: a tied head's copy of the embedding."""
    return {"lm_head.weight"} if model_config.tie_weights and "lm_head.weight" in source else set()


def _mlstm(source, x, z) -> list[Rule]:
    field = "model.stack.blocks.m."
    out = [Rule(z + "up.weight", (x + "proj_up.weight",), field=field + "inner_dim"),
           Rule(z + "down.weight", (x + "proj_down.weight",), field=field + "inner_dim"),
           Rule(z + "conv.weight", (x + "conv1d.conv.weight",), _conv, "[:, 0, :]", field + "conv_kernel"),
           Rule(z + "conv.bias", (x + "conv1d.conv.bias",)),
           Rule(z + "cell_norm.weight", (x + "mlstm_cell.outnorm.weight",), _plus_one, "1 + w"),
           Rule(z + "skip", (x + "learnable_skip",))]
    if x + "proj_up.bias" in source:
        out += [Rule(z + "up.bias", (x + "proj_up.bias",)), Rule(z + "down.bias", (x + "proj_down.bias",))]
    for name in ("q", "k", "v"):
        out.append(Rule(z + f"cell.{name}.weight", (x + f"{name}_proj.weight",), _headwise, "transpose(1, 2)",
                        field + "cell.proj_blocksize"))
        if x + f"{name}_proj.bias" in source:
            out.append(Rule(z + f"cell.{name}.bias", (x + f"{name}_proj.bias",)))
    for ours, theirs in (("input_gate", "igate"), ("forget_gate", "fgate")):
        out += [Rule(z + f"cell.{ours}.proj.weight", (x + f"mlstm_cell.{theirs}.weight",), field=field + "cell.gate_input"),
                Rule(z + f"cell.{ours}.bias", (x + f"mlstm_cell.{theirs}.bias",))]
    return out


def _slstm(source, b, x, z, model_config) -> list[Rule]:
    dim = model_config.dim
    heads = model_config.stack.blocks["s"].cell.num_heads
    head_dim = dim // heads
    field = "model.stack.blocks.s."
    out = []
    if x + "conv1d.conv.weight" in source:
        out += [Rule(z + "conv.weight", (x + "conv1d.conv.weight",), _conv, "[:, 0, :]", field + "conv_kernel"),
                Rule(z + "conv.bias", (x + "conv1d.conv.bias",))]
    # the official layer feeds fgate into the input slot and igate into the forget slot
    out += [Rule(z + "cell.input_gate.proj.weight", (x + "fgate.weight",), _headwise, "fgate, transpose(1, 2)",
                 field + "cell.num_heads"),
            Rule(z + "cell.forget_gate.proj.weight", (x + "igate.weight",), _headwise, "igate, transpose(1, 2)",
                 field + "cell.num_heads"),
            Rule(z + "cell.z.weight", (x + "zgate.weight",), _headwise, "transpose(1, 2)", field + "cell.num_heads"),
            Rule(z + "cell.o.weight", (x + "ogate.weight",), _headwise, "transpose(1, 2)", field + "cell.num_heads")]
    kernel, bias = x + "slstm_cell._recurrent_kernel_", x + "slstm_cell._bias_"
    shape = source.shape(kernel)
    vanilla = len(shape) == 3 and shape[1] == 4 * head_dim and shape[2] == head_dim
    layout = "vanilla" if vanilla else "cuda"

    def ext_bias(t):  # -> [H, 4 (i, f, z, o), Dh]
        return t.reshape(4, heads, head_dim).permute(1, 0, 2) if vanilla else t.reshape(heads, 4, head_dim)

    def recurrent(t):
        ext = t.reshape(heads, 4, head_dim, head_dim).permute(0, 3, 1, 2) if vanilla else t.reshape(heads, head_dim, 4, head_dim)
        return ext.reshape(heads, head_dim, 4 * head_dim)

    out += [Rule(z + "cell.R", (kernel,), recurrent, f"{layout} internal -> [H, Dh, 4 Dh]", field + "cell.num_heads"),
            Rule(z + "cell.input_gate.bias", (bias,), lambda t: ext_bias(t)[:, 0].reshape(-1), f"{layout} slot i"),
            Rule(z + "cell.forget_gate.bias", (bias,), lambda t: ext_bias(t)[:, 1].reshape(-1), f"{layout} slot f"),
            Rule(z + "cell.zo_bias", (bias,), lambda t: torch.cat([ext_bias(t)[:, 2].reshape(-1), ext_bias(t)[:, 3].reshape(-1)]),
                 f"{layout} slots z, o")]
    if x + "group_norm.weight" in source:
        out.append(Rule(z + "cell_norm.weight", (x + "group_norm.weight",), _plus_one, "1 + w"))
    else:
        out.append(Rule(z + "cell_norm.weight", (), lambda: torch.ones(dim), "ones (group_norm_weight: false)"))
    if model_config.stack.blocks["s"].mlp is not None:
        out += [Rule(z + "mlp_norm.norm.weight", (b + "ffn_norm.weight",), _plus_one, "1 + w"),
                Rule(z + "mlp.up.weight", (b + "ffn.proj_up.weight",), field=field + "mlp.hidden_dim"),
                Rule(z + "mlp.down.weight", (b + "ffn.proj_down.weight",), field=field + "mlp.hidden_dim")]
        for part in ("up", "down"):
            if b + f"ffn.proj_{part}.bias" in source:
                out.append(Rule(z + f"mlp.{part}.bias", (b + f"ffn.proj_{part}.bias",)))
    return out
