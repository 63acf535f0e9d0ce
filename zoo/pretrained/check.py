"""``convert --check``: the official implementation on the same weights and tokens, compared.

Needs the official ``xlstm`` package (it is not a dependency of xlstm-zoo). The official model is
built on the CPU with its native (PyTorch) kernels whatever kernel names the config gives, and
holds a second copy of the weights: a 7B check needs memory for two models.
"""

from __future__ import annotations

import copy
import dataclasses
import typing

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.large import CPU_KERNELS, EMBEDDING
from xlstm_zoo.pretrained.neurips import model_config
from xlstm_zoo.pretrained.sources import Opened


def require(opened: Opened) -> None:
    """Fail early (before anything is written) when ``--check`` cannot run."""
    official_module = "xlstm.xlstm_large.model" if opened.layout in ("hf", "xlstm_large") else "xlstm"
    if opened.layout == "hf" and opened.config.get("model_type") != "xlstm":
        raise ConfigError(f"--check compares with the official xLSTM code; a {opened.config.get('model_type')} "
                          "checkpoint is checked against transformers in tests/zoo/pretrained/test_baselines.py")
    if opened.layout == "zoo":
        raise ConfigError("--check compares with the official implementation; an xlstm-zoo directory has none")
    if opened.layout == "neurips" and not opened.config:
        raise ConfigError("--check of a NeurIPS state dict needs its config (--config FILE)")
    try:
        __import__(official_module)
    except ImportError:
        raise ConfigError("--check needs the official xlstm package (pip install xlstm==2.0.6 mlstm-kernels==2.0.6)") from None


def official_model(opened: Opened, tokens: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The official model with the checkpoint's weights rounded to ``dtype`` (as ours were), in fp32."""
    try:  # optional: the official package is a test extra, never a dependency
        if opened.layout in ("hf", "xlstm_large"):
            from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig
        else:
            import xlstm
    except ImportError:
        raise ConfigError("--check needs the official xlstm package (pip install xlstm==2.0.6 mlstm-kernels==2.0.6)") from None
    source = opened.source
    state = {k: source.load(k).to(dtype).float() for k in source.keys()}
    if opened.layout in ("hf", "xlstm_large"):
        fields = {f.name for f in dataclasses.fields(xLSTMLargeConfig)}
        config = {k: v for k, v in opened.config.items() if k in fields}
        vocab, dim = source.shape(EMBEDDING[opened.layout])
        config.update(CPU_KERNELS, embedding_dim=dim, vocab_size=vocab, mode="inference", return_last_states=True,
                      num_blocks=len({k.split(".")[2] for k in state if k.startswith("backbone.blocks.")}),
                      weight_mode="fused" if any("qkv_opreact" in k for k in state) else "single")
        model = xLSTMLarge(xLSTMLargeConfig(**config))
        state = {("embedding.weight" if k == EMBEDDING["hf"] else k): v for k, v in state.items()}
        if "lm_head.weight" not in state:
            state["lm_head.weight"] = state["embedding.weight"]
    else:
        if not opened.config:
            raise ConfigError("--check of a NeurIPS state dict needs its config (--config FILE)")
        cfg = model_config(opened.config)
        cfg["context_length"] = max(cfg["context_length"] if isinstance(cfg.get("context_length"), int) else 0, tokens)
        cfg["vocab_size"] = source.shape("token_embedding.weight")[0]
        config = _dataclass(xlstm.xLSTMLMModelConfig, cfg)
        if config.slstm_block is not None:
            config.slstm_block.slstm.backend = "vanilla"  # CPU; the cuda layout is converted by the mapping below
        model = xlstm.xLSTMLMModel(config)
        _cuda_to_vanilla(model, state)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _cuda_to_vanilla(model, state: dict) -> None:
    """A checkpoint trained with the CUDA sLSTM kernel stores its cell in another layout."""
    from xlstm.blocks.slstm.cell import sLSTMCell_cuda  # optional package, only for --check
    for name, module in model.named_modules():
        key = f"{name}._recurrent_kernel_"
        if key in state and state[key].shape != module._recurrent_kernel_.shape:
            cuda = sLSTMCell_cuda(module.config, skip_backend_init=True)
            state[key] = module._recurrent_kernel_ext2int(cuda._recurrent_kernel_int2ext(state[key]))
            state[f"{name}._bias_"] = module._bias_ext2int(cuda._bias_int2ext(state[f"{name}._bias_"]))


def _dataclass(cls, data: dict):
    """``cls(**data)`` with nested dataclass fields built from their dicts (OmegaConf/dacite style)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} fields {unknown}")
    values = {}
    for key, value in data.items():
        kind = next((t for t in typing.get_args(hints[key]) or (hints[key],) if dataclasses.is_dataclass(t)), None)
        values[key] = _dataclass(kind, value) if kind is not None and isinstance(value, dict) else value
    return cls(**values)


def max_logit_difference(model: torch.nn.Module, opened: Opened, *, tokens: int = 64, seed: int = 0) -> float:
    """Max |logits(ours) - logits(official)| on random tokens ``[2, tokens]``, both computed in fp32
    from the same weights (rounded to our model's dtype first, so a bf16 load checks the mapping)."""
    official = official_model(opened, tokens, model.embedding.weight.dtype)
    ours = model if model.embedding.weight.dtype == torch.float32 else copy.deepcopy(model).float()
    ids = torch.randint(0, ours.embedding.num_embeddings, (2, tokens), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = official(ids)
        expected = expected[0] if isinstance(expected, tuple) else expected
        got, _ = ours(ids)
    return float((got - expected).abs().max())
