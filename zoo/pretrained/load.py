"""Building a model on ``meta`` and filling it tensor by tensor, after a memory check.

The model is built without storage (``with torch.device("meta")``), every source tensor is read,
transformed and cast one at a time, and ``load_state_dict(assign=True)`` adopts the results as the
parameters: peak memory is about the model's size in the target dtype plus one source tensor,
never a second full copy.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.mapping import Rule, check, convert, targets
from xlstm_zoo.pretrained.tensorfile import TensorSource
from xlstm_zoo.recipe_loader import build, load_recipe
from xlstm_zoo.recipe_loader.sizes import GiB, available_memory, model_bytes


def ensure_memory(model: nn.Module, source: TensorSource, dtype: torch.dtype, device: torch.device) -> None:
    largest = max((source.nbytes(k) for k in source.keys()), default=0)
    need = model_bytes(model, dtype) + 2 * largest
    free = available_memory(device)
    if free is None or need <= free or os.environ.get("XLSTM_ZOO_SKIP_MEMORY_CHECK") == "1":
        return
    smaller = [d for d in (torch.bfloat16,) if d.itemsize < dtype.itemsize
               and model_bytes(model, d) + 2 * largest <= free]
    hint = (f"load it in {str(smaller[0]).removeprefix('torch.')} (dtype=torch.bfloat16, --dtype bfloat16: "
            f"{(model_bytes(model, smaller[0]) + 2 * largest) / GiB:.1f} GiB)" if smaller
            else "free memory or use a machine with more")
    raise ConfigError(f"not enough memory: the model needs about {need / GiB:.1f} GiB in "
                      f"{str(dtype).removeprefix('torch.')} on {device} but {free / GiB:.1f} GiB are free; {hint} "
                      "(XLSTM_ZOO_SKIP_MEMORY_CHECK=1 skips this check)")


def build_meta(recipe_data):
    recipe = load_recipe(recipe_data)
    with torch.device("meta"):
        model = build(recipe)
    return recipe, model


def weights_dtype(source: TensorSource, rules: list[Rule]) -> torch.dtype:
    """The checkpoint's own dtype: that of most of its floating-point weights (by elements), so one
    integer or odd tensor among them does not decide the whole model's dtype."""
    elements: dict[torch.dtype, int] = {}
    for key in dict.fromkeys(k for r in rules for k in r.sources):
        dtype = source.dtype(key)
        if dtype.is_floating_point:
            elements[dtype] = elements.get(dtype, 0) + math.prod(source.shape(key))
    if not elements:
        raise ConfigError("the checkpoint has no floating-point tensors: not model weights")
    return max(elements, key=elements.get)


def load_into(model: nn.Module, rules: list[Rule], source: TensorSource, *, dtype: torch.dtype | None,
              device: str | torch.device = "cpu", ignored: set[str] = frozenset(), memory_check: bool = True,
              what: str = "source") -> nn.Module:
    """Fill the ``meta`` ``model`` from ``source`` by ``rules`` (checked strictly first)."""
    device = torch.device(device)
    expected = targets(model)
    check(rules, source, expected, ignored=ignored, what=what)
    if dtype is None:
        dtype = weights_dtype(source, rules)
    if memory_check:
        ensure_memory(model, source, dtype, device)
    exact = {name: t.dtype for name, t in model.state_dict(keep_vars=True).items() if not t.is_floating_point()}
    state = dict(convert(rules, source, dtype=dtype, device=device, exact=exact))
    # a tied weight appears under each of its names in state_dict(): give every alias the one tensor
    names_of = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(tensor), []).append(name)
    for names in names_of.values():
        for alias in names[1:]:
            state[alias] = state[names[0]]
    model.load_state_dict(state, strict=True, assign=True)
    if getattr(getattr(model, "config", None), "tie_weights", False):
        model.head.weight = model.embedding.weight  # assign=True replaced the two names separately
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ConfigError(f"{len(left)} tensors were not loaded (still on meta): {', '.join(left[:5])}")
    return model.eval()
