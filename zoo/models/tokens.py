"""Token ids and generation settings, checked where they enter a model.

A bad id would otherwise surface as torch's bare "index out of range in self" (or, on CUDA, a
device-side assert): here it is one :class:`~xlstm_zoo.errors.InputError` naming the id, its
position and the vocabulary.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from xlstm_zoo.errors import InputError

ID_DTYPES = (torch.int64, torch.int32)


def embed_tokens(embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
    """``embedding(tokens)``; a bad id is found only after the lookup fails, so the hot path reads nothing."""
    if tokens.dtype not in ID_DTYPES:
        raise InputError(f"token ids must be an int64 or int32 tensor, got {str(tokens.dtype).removeprefix('torch.')}")
    try:
        return embedding(tokens)
    except IndexError:
        raise out_of_vocabulary(tokens, embedding.num_embeddings) from None


def check_token_ids(tokens: torch.Tensor, vocab_size: int, what: str = "token ids") -> None:
    """Read every id (one reduction): for inputs checked once per call, such as a prompt, on any device."""
    if tokens.dtype not in ID_DTYPES:
        raise InputError(f"{what} must be an int64 or int32 tensor, got {str(tokens.dtype).removeprefix('torch.')}")
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        raise out_of_vocabulary(tokens, vocab_size, what)


def out_of_vocabulary(tokens: torch.Tensor, vocab_size: int, what: str = "token ids") -> InputError:
    bad = ((tokens < 0) | (tokens >= vocab_size)).nonzero()
    if not len(bad):  # the lookup failed for another reason: say what was asked
        return InputError(f"{what} could not be looked up in the vocabulary of {vocab_size}")
    position = tuple(bad[0].tolist())
    return InputError(f"{what}: id {int(tokens[position])} at position {position if len(position) > 1 else position[0]} "
                      f"is outside the vocabulary (ids 0..{vocab_size - 1}, vocab_size {vocab_size}; "
                      f"{len(bad)} such id{'s' if len(bad) > 1 else ''})")


def check_generation(max_new_tokens, temperature, top_k, greedy: bool) -> None:
    """Generation settings: a whole number of new tokens >= 0; when sampling, a finite temperature > 0
    (temperature 0 is not greedy decoding: ask for that with greedy=True, --greedy); top_k None or >= 1."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise InputError(f"top_k must be a whole number >= 1 (or None: no limit), got {top_k!r}")
    if greedy:
        return
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature)
            or temperature <= 0):
        raise InputError(f"temperature must be > 0 and finite when sampling, got {temperature!r} "
                         "(for the most likely token every time: greedy=True, or --greedy)")
