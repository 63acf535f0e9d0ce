"""A tiny task for trainer and grid tests: remember the first token until a separator.

tokens = [a, x_1 .. x_L, SEP], scored only at SEP, where the answer is ``a``. Test sequences are
twice as long. Registered by ``register()`` (in-process or in a subprocess driver).
"""

from typing import Literal

import torch

from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.registry import component, registry
from xlstm_zoo.tasks.base import IGNORE, Batch, Task, check_split


class ToyCopyConfig(ZooConfig):
    type: Literal["toy_copy"] = "toy_copy"
    length: int = Field(3, ge=1, description="tokens after the first one (test: twice as many)")
    symbols: int = Field(4, ge=1, description="alphabet size")
    eval_sequences: int = Field(32, ge=16, description="sequences in each fixed evaluation set")


@component("task", "toy_copy", config=ToyCopyConfig, description="test task: recall the first token")
class ToyCopy(Task):
    def __init__(self, config: ToyCopyConfig, ctx=None):
        self.config = config
        self.vocab_size = config.symbols + 1
        self._eval = {}

    def batch(self, split, batch_size, generator):
        check_split(split)
        length = self.config.length * (2 if split == "test" else 1)
        body = torch.randint(0, self.config.symbols, (batch_size, length), generator=generator)
        sep = torch.full((batch_size, 1), self.config.symbols)
        tokens = torch.cat([body, sep], dim=1)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, -1] = body[:, 0]
        return Batch(tokens, targets)

    def eval_batches(self, split):
        check_split(split)
        if split not in self._eval:
            g = torch.Generator().manual_seed(1234 + len(split))
            n = self.config.eval_sequences
            self._eval[split] = [self.batch(split, 16, g) for _ in range(max(1, n // 16))]
        return [Batch(b.tokens.clone(), b.targets.clone()) for b in self._eval[split]]  # callers can't alter it


def register():
    if "toy_copy" not in registry.names("task"):
        registry.register(ToyCopy, source="tests")


def recipe(**train) -> dict:
    """A small LSTM on the toy task, as a recipe dict."""
    return {
        "name": "toy",
        "model": {"type": "causal_lm", "vocab_size": 8, "dim": 16,
                  "stack": {"type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}},
                            "post_norm": {"type": "none"}}},
        "task": {"type": "toy_copy"},
        "train": {"steps": 30, "batch_size": 16, "lr": 0.03, "warmup_steps": 3, "log_every": 5, **train},
    }


def at_step(monkeypatch, step: int, action=KeyboardInterrupt):
    """Make the trainer meet ``action`` as it reaches ``step`` (before the step runs): raise it (an exception
    class: an interrupt, a kill) or call it. Returns the function that undoes this."""
    from xlstm_zoo.training import trainer  # here: subprocess drivers import this module before the zoo

    plain = trainer._step_generator

    def generator(seed, current):
        if current == step:
            if isinstance(action, type) and issubclass(action, BaseException):
                raise action
            action()
        return plain(seed, current)

    monkeypatch.setattr(trainer, "_step_generator", generator)
    return lambda: monkeypatch.setattr(trainer, "_step_generator", plain)
