"""RWKV-4 in the Hugging Face layout: ``RwkvForCausalLM`` (``config.json`` with ``model_type: rwkv``).

HF's ``RwkvBlock`` i is a pre-norm time-mixing residual (``ln1``, ``attention``) then a pre-norm
channel-mixing residual (``ln2``, ``feed_forward``); block 0 first normalises the embeddings
(``pre_ln``); ``ln_out`` (eps 1e-5, not the config's) ends the stack. In xlstm-zoo: ``causal_lm`` with
``embedding_norm: layernorm`` and a stack of ``residual`` blocks alternating the ``rwkv`` and
``rwkv_channel_mix`` cells (``tctc...``), so HF block i is our blocks 2i and 2i+1. Sizes come from the
tensors; the config's are cross-checked. ``rescale_every`` (HF halves the hidden state every so many
layers in inference mode, which changes the LayerNorms' rounding through their eps) is refused where it
would act.
"""

from __future__ import annotations

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.mapping import Rule
from xlstm_zoo.pretrained.tensorfile import TensorSource

MODEL_TYPE = "rwkv"
LN_OUT_EPS = 1e-5  # HF builds ln_out as nn.LayerNorm(hidden_size): torch's default eps
# Config fields that choose kernels or generation and never the maths: kept in provenance only.
IGNORED_FIELDS = ("context_length", "use_cache", "bos_token_id", "eos_token_id", "torch_dtype", "dtype")


def is_rwkv(model_config) -> bool:
    """Whether a ``causal_lm`` config is the RWKV layout this module reads and writes (by its cells)."""
    stack = model_config.stack
    cells = {getattr(getattr(block, "cell", None), "type", None) for block in getattr(stack, "blocks", {}).values()} \
        if isinstance(getattr(stack, "blocks", None), dict) else set()
    return bool(cells & {"rwkv", "rwkv_channel_mix"})


def _layers(source: TensorSource) -> int:
    found = {int(k.split(".")[2]) for k in source.keys() if k.startswith("rwkv.blocks.")}
    if not found or found != set(range(len(found))):
        raise ConfigError(f"no consecutive rwkv.blocks.0 .. N keys (found blocks {sorted(found)})")
    return len(found)


def _check(config: dict, name: str, actual, what: str) -> None:
    if config.get(name) is not None and config[name] != actual:
        raise ConfigError(f"{name}={config[name]} but the tensors have {what} {actual}", path=name)


def recipe(config: dict, source: TensorSource, name: str) -> dict:
    """The ``causal_lm`` recipe (a dict) for an HF RWKV-4 checkpoint."""
    emb = "rwkv.embeddings.weight"
    if emb not in source:
        raise ConfigError(f"no {emb} tensor: not an HF RWKV checkpoint")
    vocab, dim = source.shape(emb)
    layers = _layers(source)
    _check(config, "vocab_size", vocab, "the vocabulary size")
    _check(config, "hidden_size", dim, "the width")
    _check(config, "num_hidden_layers", layers, "the number of layers")
    attention = source.shape("rwkv.blocks.0.attention.key.weight")[0]
    hidden = source.shape("rwkv.blocks.0.feed_forward.key.weight")[0]
    _check(config, "attention_hidden_size", attention, "the attention width")
    _check(config, "intermediate_size", hidden, "the channel-mixing width")
    rescale = int(config.get("rescale_every", 6) or 0)
    if rescale > 0 and layers >= rescale:
        raise ConfigError(f"rescale_every={rescale} with {layers} layers: HF halves the hidden state every {rescale} "
                          "layers in inference mode, which xlstm-zoo does not implement (allowed: 0, or more than "
                          "num_hidden_layers)", path="rescale_every")
    eps = float(config.get("layer_norm_epsilon", 1e-5))
    norm = {"type": "layernorm", "eps": eps}
    tied = "head.weight" not in source
    if tied and not config.get("tie_word_embeddings", False):
        raise ConfigError("no head.weight tensor but tie_word_embeddings is not true", path="tie_word_embeddings")
    return {
        "name": f"{name} (converted)",
        "description": "converted from the Hugging Face layout (RWKV-4 architecture)",
        "model": {"type": "causal_lm", "vocab_size": vocab, "dim": dim, "tie_weights": tied, "embedding_norm": norm,
                  "stack": {"type": "xlstm", "pattern": "tc" * layers,
                            "blocks": {"t": {"type": "residual", "norm": norm,
                                             "cell": {"type": "rwkv", "attention_dim": attention}},
                                       "c": {"type": "residual", "norm": norm,
                                             "cell": {"type": "rwkv_channel_mix", "hidden_dim": hidden}}},
                            "post_norm": {"type": "layernorm", "eps": LN_OUT_EPS}}},
    }


# HF name within a block -> ours within the cell, and how many of our blocks in (0: time, 1: channel)
TIME = {"time_decay": "decay", "time_first": "bonus", "time_mix_key": "mix_k", "time_mix_value": "mix_v",
        "time_mix_receptance": "mix_r", "key.weight": "key.weight", "value.weight": "value.weight",
        "receptance.weight": "receptance.weight", "output.weight": "output.weight"}
CHANNEL = {"time_mix_key": "mix_k", "time_mix_receptance": "mix_r", "key.weight": "key.weight",
           "receptance.weight": "receptance.weight", "value.weight": "value.weight"}
FIELD = "model.stack.blocks.{letter}.cell"


def _flat(t):
    return t.reshape(-1)


def rules(source: TensorSource, model_config) -> list[Rule]:
    """Source key -> zoo key for every tensor, in the zoo model's order."""
    out = [Rule("embedding.weight", ("rwkv.embeddings.weight",), field="model.dim / model.vocab_size")]
    out += [Rule(f"embedding_norm.norm.{p}", (f"rwkv.blocks.0.pre_ln.{p}",)) for p in ("weight", "bias")]
    for i in range(len(model_config.stack.layout()) // 2):
        hf, time, channel = f"rwkv.blocks.{i}.", f"stack.blocks.{2 * i}.", f"stack.blocks.{2 * i + 1}."
        out += [Rule(f"{time}norm.norm.{p}", (f"{hf}ln1.{p}",)) for p in ("weight", "bias")]
        for theirs, ours in TIME.items():
            flat = theirs.startswith("time_mix")
            out.append(Rule(f"{time}cell.{ours}", (f"{hf}attention.{theirs}",), _flat if flat else None,
                            "reshape(-1)" if flat else "-", FIELD.format(letter="t")))
        out += [Rule(f"{channel}norm.norm.{p}", (f"{hf}ln2.{p}",)) for p in ("weight", "bias")]
        for theirs, ours in CHANNEL.items():
            flat = theirs.startswith("time_mix")
            out.append(Rule(f"{channel}cell.{ours}", (f"{hf}feed_forward.{theirs}",), _flat if flat else None,
                            "reshape(-1)" if flat else "-", FIELD.format(letter="c")))
    out += [Rule(f"stack.post_norm.norm.{p}", (f"rwkv.ln_out.{p}",)) for p in ("weight", "bias")]
    if "head.weight" in source:
        out.append(Rule("head.weight", ("head.weight",), field="model.tie_weights"))
    return out


# --- writing the HF layout ---------------------------------------------------------------------------

def hf_export(model) -> tuple[dict, dict]:
    """``(config.json dict, HF state dict)`` for a ``causal_lm`` in the RWKV layout above; refused, naming
    the field, for anything HF's RWKV cannot express."""
    c = model.config
    stack = c.stack
    layout = stack.layout() if stack.type == "xlstm" else ""
    blocks = stack.blocks if stack.type == "xlstm" else {}
    norm = c.embedding_norm

    def layernorm(n, eps=None):
        return n.type == "layernorm" and n.bias and (eps is None or n.eps == eps)

    letters = (layout[:1], layout[1:2])
    time, channel = (blocks.get(letter) for letter in letters) if len(layout) >= 2 else (None, None)
    want = {
        "model.stack.pattern": (len(layout) >= 2 and len(layout) % 2 == 0 and layout == (layout[:2] * (len(layout) // 2))
                                and layout[0] != layout[1], "two letters alternating, time mixing first (tctc...)"),
        "model.embedding_norm": (layernorm(norm), "layernorm with bias"),
    }
    if want["model.stack.pattern"][0]:
        want.update({
            "time block": (time.type == "residual" and time.mlp is None and time.cell.type == "rwkv"
                           and layernorm(time.norm, norm.eps), "residual, no mlp, cell rwkv, layernorm with "
                                                               "embedding_norm's eps"),
            "channel block": (channel.type == "residual" and channel.mlp is None
                              and channel.cell.type == "rwkv_channel_mix" and layernorm(channel.norm, norm.eps),
                              "residual, no mlp, cell rwkv_channel_mix, layernorm with embedding_norm's eps"),
        })
    want["model.stack.post_norm"] = (stack.post_norm.type == "layernorm" and stack.post_norm.bias
                                     and stack.post_norm.eps == LN_OUT_EPS, f"layernorm, eps {LN_OUT_EPS:g} (HF's ln_out)")
    want["model.logit_softcap"] = (c.logit_softcap is None, "null")
    bad = [f"{k} (must be {need})" for k, (ok, need) in want.items() if not ok]
    if bad:
        raise ConfigError("cannot write the HF RWKV layout: " + "; ".join(bad))
    layers = len(layout) // 2
    first_time, first_channel = model.stack.blocks[0].cell, model.stack.blocks[1].cell
    config = {
        "architectures": ["RwkvForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.dim, "num_hidden_layers": layers, "attention_hidden_size": first_time.attention_dim,
        "intermediate_size": first_channel.key.out_features, "layer_norm_epsilon": float(norm.eps),
        "rescale_every": 0, "tie_word_embeddings": bool(c.tie_weights),
        "dtype": str(model.embedding.weight.dtype).removeprefix("torch."),
    }
    state = {"rwkv.embeddings.weight": model.embedding.weight,
             "rwkv.blocks.0.pre_ln.weight": model.embedding_norm.norm.weight,
             "rwkv.blocks.0.pre_ln.bias": model.embedding_norm.norm.bias}
    for i in range(layers):
        hf = f"rwkv.blocks.{i}."
        time_block, channel_block = model.stack.blocks[2 * i], model.stack.blocks[2 * i + 1]
        for part, block, names in (("attention", time_block, TIME), ("feed_forward", channel_block, CHANNEL)):
            ln = "ln1" if part == "attention" else "ln2"
            state[f"{hf}{ln}.weight"], state[f"{hf}{ln}.bias"] = block.norm.norm.weight, block.norm.norm.bias
            for theirs, ours in names.items():
                tensor = block.cell.get_parameter(ours)
                state[f"{hf}{part}.{theirs}"] = tensor.reshape(1, 1, -1) if theirs.startswith("time_mix") else tensor
    state["rwkv.ln_out.weight"], state["rwkv.ln_out.bias"] = model.stack.post_norm.norm.weight, model.stack.post_norm.norm.bias
    if not c.tie_weights:
        state["head.weight"] = model.head.weight
    return config, {k: v.detach().contiguous() for k, v in state.items()}
