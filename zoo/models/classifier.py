"""``classifier``: a stack over tokens or feature vectors with a classification head.

``pool: last`` or ``mean`` classifies whole sequences; ``pool: none`` tags every token.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.initialization import InitConfig, count_blocks, initialize
from xlstm_zoo.models.stack_model import StackModel
from xlstm_zoo.models.tokens import embed_tokens
from xlstm_zoo.registry import component
from xlstm_zoo.stacks import XLSTMStackConfig


class ClassifierConfig(ZooConfig):
    type: Literal["classifier"] = "classifier"
    vocab_size: int | None = Field(None, ge=1, description="token inputs: size of the vocabulary")
    input_dim: int | None = Field(None, ge=1, description="feature inputs: size of each input vector")
    dim: int = Field(128, ge=1)
    num_classes: int = Field(2, ge=1)
    pool: Literal["last", "mean", "none"] = Field("last", description="none: one prediction per token (tagging)")
    stack: Spec("stack") = Field(default_factory=XLSTMStackConfig)
    init: InitConfig = Field(default_factory=InitConfig, description="how the weights start (scheme, per-role std)")

    @model_validator(mode="after")
    def _one_input(self):
        if (self.vocab_size is None) == (self.input_dim is None):
            raise ValueError("give exactly one of vocab_size (token inputs) or input_dim (feature inputs)")
        return self


@component("model", "classifier", config=ClassifierConfig, description="sequence classifier (last/mean pooling) or per-token tagger")
class Classifier(StackModel):
    def __init__(self, config: ClassifierConfig, ctx: BuildContext | None = None):
        super().__init__()
        ctx = BuildContext(dim=config.dim, path=ctx.path if ctx else "model")
        self.config = config
        self.embed = (nn.Embedding(config.vocab_size, config.dim) if config.vocab_size
                      else nn.Linear(config.input_dim, config.dim))
        self.stack = build(config.stack, ctx.at("stack"), "stack")
        self.head = nn.Linear(config.dim, config.num_classes)
        initialize(self, config.init, dim=config.dim, num_blocks=count_blocks(self.stack), tied=False)

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: ``("token", vocab_size)`` or ``("features", input_dim)``."""
        if isinstance(self.embed, nn.Embedding):
            return "token", self.embed.num_embeddings
        return "features", self.embed.in_features

    @property
    def init_roles(self) -> dict[str, str]:
        return {"head.weight": "head"}

    def forward(self, x: torch.Tensor, state: tuple | None = None, *, doc_starts: torch.Tensor | None = None,
                cu_seqlens=None):
        """``x [B, T]`` tokens or ``[B, T, input_dim]`` -> ``[B, classes]`` (or ``[B, T, classes]``), state.
        ``doc_starts`` / ``cu_seqlens``: packed documents, as for the causal LM."""
        starts = packed.boundaries(doc_starts, cu_seqlens, *x.shape[:2])
        h, state = self.stack(self._embed(x), state, doc_starts=starts)
        if self.config.pool == "last":
            h = h[:, -1]
        elif self.config.pool == "mean":
            h = h.mean(1)
        return self.head(h), state

    def step(self, x_t: torch.Tensor, state: tuple | None, *, reset: torch.Tensor | None = None):
        """One token (``[B]``) or vector (``[B, input_dim]``) -> per-token logits ``[B, classes]``, state;
        ``reset [B]`` (bool) restarts those rows from the zero state first."""
        h, state = self.stack.step(self._embed(x_t), state, reset=reset)
        return self.head(h), state

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        return embed_tokens(self.embed, x) if isinstance(self.embed, nn.Embedding) else self.embed(x)
