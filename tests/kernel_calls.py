"""Which kernel the dispatcher runs: record the calls it sends to one backend's kernel of an op."""

from __future__ import annotations

import torch


def kernel_calls(monkeypatch, op: str, backend: str = "cpp") -> list:
    """From now on (until the test ends), each call of ``backend``'s ``op`` kernel appends its first argument's
    dtype and shape; the kernel still runs."""
    from xlstm_zoo.registry import registry

    instance = registry.instance("backend", backend)
    real, calls = instance.ops[op], []

    def spy(*args, **kwargs):
        first = args[0]
        calls.append((first.dtype, tuple(first.shape)) if isinstance(first, torch.Tensor) else first)
        return real(*args, **kwargs)

    monkeypatch.setitem(instance.ops, op, spy)
    return calls
