"""Sizes checked before anything is allocated: a model's weights (counted on a ``meta`` build of its
config, which takes no memory) and a training step's weights, optimiser state and activations,
against the memory free where they will live. A ``--set model.dim=1000000000`` is one line, not an
allocation the OOM killer ends. ``XLSTM_ZOO_SKIP_MEMORY_CHECK=1`` skips the checks.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import nn

from xlstm_zoo.config import BuildContext, ZooConfig, build as build_component
from xlstm_zoo.errors import ConfigError

GiB = 2**30
SKIP = "XLSTM_ZOO_SKIP_MEMORY_CHECK"
# A training step holds each parameter 4 times in float32: the weight, its gradient and AdamW's two moments.
TRAINING_COPIES = 4


def available_memory(device: torch.device | str) -> int | None:
    """Free bytes on ``device`` (None: unknown, no check): CUDA's free memory; on the CPU, MemAvailable
    (/proc/meminfo), or less where this process's cgroup has a lower limit."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free = [_meminfo_available(), _cgroup_room()]
    return min((f for f in free if f is not None), default=None)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # no /proc: what the OS reports as available pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    """The cgroup's memory limit less its usage (v2, then v1); None without a limit."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= 2**60:  # no limit
                return None
            with open(usage) as f:
                return max(int(text) - int(f.read().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


def model_bytes(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of the distinct parameters and buffers (a tied weight counts once), in ``dtype`` or their own."""
    seen = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * (dtype or t.dtype).itemsize for t in seen.values())


class ModelSize(NamedTuple):
    """What a model config builds, counted on ``meta``: bytes of its weights, the width of its residual
    stream, its blocks and its output features per token (for the activations a training step keeps)."""

    weight_bytes: int
    width: int
    blocks: int
    outputs: int


def model_size(config: ZooConfig) -> ModelSize | None:
    """Count ``config``'s model on ``meta`` (remembered per config). None where it cannot be built there (a
    third-party part that computes at build time): then nothing is checked. A tensor too large to describe
    at all is refused here."""
    key = config.model_dump_json()
    if key not in _SIZES:
        if len(_SIZES) >= 64:
            _SIZES.clear()
        _SIZES[key] = _count_on_meta(config)
    return _SIZES[key]


_SIZES: dict[str, ModelSize | None] = {}


def _count_on_meta(config: ZooConfig) -> ModelSize | None:
    try:
        # fork_rng: some inits draw from the CPU generator even on meta, and a seeded build must not depend on
        # whether this config was counted before (torch.manual_seed(0); build(r) twice gives equal weights)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = build_component(config, BuildContext(dim=getattr(config, "dim", 0), path="model"), "model")
    except ConfigError:
        raise
    except RuntimeError as err:
        if "overflow" in str(err):  # torch cannot even compute the byte size of one tensor
            raise ConfigError(f"the model is too large to allocate: {str(err).splitlines()[0]}") from None
        return None
    except Exception:  # not buildable on meta: the real build says what it says
        return None
    blocks = len(getattr(getattr(model, "stack", None), "blocks", ())) or 1
    head = getattr(model, "head", None)
    return ModelSize(model_bytes(model), getattr(config, "dim", 0) or 0, blocks, getattr(head, "out_features", 0) or 0)


def check_model_fits(config: ZooConfig, device: torch.device | str) -> None:
    """Refuse, in one line, a model whose weights exceed the memory free on ``device``."""
    if os.environ.get(SKIP) == "1" or torch.device(device).type == "meta":
        return
    size, free = model_size(config), available_memory(device)
    if size is None or free is None or size.weight_bytes <= free:
        return
    raise ConfigError(f"the model's weights need about {_gib(size.weight_bytes)} but {_gib(free)} are free on "
                      f"{device}: make it smaller (dim, num_blocks, vocab_size) ({SKIP}=1 skips this check)")


def check_training_fits(config: ZooConfig, rows: int, tokens_per_row: int, device: torch.device | str) -> None:
    """Refuse, in one line, a training step that cannot fit: the weights with their gradients and AdamW
    moments (float32), plus an estimate of the activations of ``rows`` sequences of ``tokens_per_row``
    (one processed part: a process's micro-batch). The estimate is a floor, not a peak: per token, each
    block's output and the model's outputs, in float32."""
    if os.environ.get(SKIP) == "1" or torch.device(device).type == "meta":
        return
    size, free = model_size(config), available_memory(device)
    if size is None or free is None:
        return
    per_token = 4 * (size.width * (size.blocks + 1) + size.outputs)
    activations = rows * tokens_per_row * per_token
    need = TRAINING_COPIES * size.weight_bytes + activations
    if need <= free:
        return
    fitting = max((free - TRAINING_COPIES * size.weight_bytes) // max(tokens_per_row * per_token, 1), 0)
    hint = (f"even by this floor at most {fitting:,} rows per micro-batch fit (lower train.batch_size, or raise "
            "train.micro_batches)" if fitting else "the weights and optimiser state alone do not fit: make the model smaller")
    raise ConfigError(f"a training step needs about {_gib(need)} ({_gib(TRAINING_COPIES * size.weight_bytes)} weights, "
                      f"gradients and AdamW state; {_gib(activations)} activations for {rows:,} rows of "
                      f"{tokens_per_row} tokens) but {_gib(free)} are free on {device}; {hint} "
                      f"({SKIP}=1 skips this check)", path="train.batch_size" if fitting else "model")


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:,.1f} MiB"
