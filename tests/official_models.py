"""Random-weight official models and their checkpoint directories, built in a temporary folder
(never downloaded). Every tensor is randomised, norms around 1 and biases included, so that a
mapping mistake anywhere changes the logits."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from xlstm_zoo.pretrained.tensorfile import write_safetensors

large_model = pytest.importorskip("xlstm.xlstm_large.model", reason="the official xlstm package (test extra)")

VOCAB, DIM = 97, 128  # dim 128: qk width 64, which HF's cache needs (a multiple of 64)
NATIVE = dict(chunkwise_kernel="chunkwise--native_autograd", sequence_kernel="native_sequence__native",
              step_kernel="native")


def randomise(model: torch.nn.Module, scale: float = 0.3, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "embedding" in name:
                p.copy_(noise)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(2 * noise + (3 if "fgate" in name else 0))
            else:
                p.copy_(scale * noise)
    return model.eval()


def large_config(**changes):
    fields = dict(embedding_dim=DIM, num_heads=4, num_blocks=2, vocab_size=VOCAB, chunk_size=16, mode="inference",
                  return_last_states=True, **NATIVE)
    return large_model.xLSTMLargeConfig(**{**fields, **changes})


def official_large(**changes):
    torch.manual_seed(0)
    return randomise(large_model.xLSTMLarge(large_config(**changes)))


def write_large_dir(directory: Path, model, shards: int = 1, fused: bool = False) -> Path:
    """The official xlstm_large layout: config.yaml + model.safetensors (or model_0, model_1, ...)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = dataclasses.asdict(model.config)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if fused:
        from xlstm.xlstm_large.utils import convert_single_weights_to_fused_weights
        state = {k: v.contiguous() for k, v in convert_single_weights_to_fused_weights(dict(state)).items()}
        config["weight_mode"] = "fused"
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    keys = list(state)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", state)
    else:
        for i in range(shards):
            write_safetensors(directory / f"model_{i}.safetensors", {k: state[k] for k in keys[i::shards]})
    return directory


def hf_model_from(official, **changes):
    from transformers import xLSTMConfig, xLSTMForCausalLM
    c = official.config
    config = xLSTMConfig(vocab_size=c.vocab_size, embedding_dim=c.embedding_dim, hidden_size=c.embedding_dim,
                         num_blocks=c.num_blocks, num_hidden_layers=c.num_blocks, num_heads=c.num_heads,
                         chunk_size=c.chunk_size, mode="inference", return_last_states=True,
                         ffn_proj_factor=c.ffn_proj_factor, tie_word_embeddings=False, **NATIVE, **changes)
    hf = xLSTMForCausalLM(config).eval()
    state = {("backbone.embeddings.weight" if k == "embedding.weight" else k): v for k, v in official.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    return hf


def hub_like_config(directory: Path) -> None:
    """Rewrite an HF config.json the way the NX-AI/xLSTM-7b hub file is: no hidden_size and
    num_hidden_layers, legacy fields, Triton kernel names (which no CPU build can construct)."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key in ("hidden_size", "num_hidden_layers"):
        config.pop(key)
    config.update(chunkwise_kernel="chunkwise--triton_xl_chunk", sequence_kernel="native_sequence__triton",
                  step_kernel="triton", add_embedding_dropout=False, add_qk_norm=False, cell_norm_eps=1e-6,
                  head_dim=32, igate_bias_init_range=-10.0, mlstm_round_up_to_multiple_of=64,
                  force_bos_token_insert=True, torch_dtype="float32")
    path.write_text(json.dumps(config))
