"""``causal_lm``: embedding -> stack -> head, with step-wise generation that carries the state."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo import backends as ops
from xlstm_zoo.compiling import compile_or_eager
from xlstm_zoo.config import AddedField, BuildContext, Spec, ZooConfig, build
from xlstm_zoo.errors import InputError
from xlstm_zoo.initialization import InitConfig, count_blocks, initialize
from xlstm_zoo.layers import Linear
from xlstm_zoo.models.stack_model import StackModel
from xlstm_zoo.models.tokens import check_generation, check_token_ids, embed_tokens
from xlstm_zoo.norms import NoNormConfig
from xlstm_zoo.registry import component
from xlstm_zoo.stacks import XLSTMStackConfig


class CausalLMConfig(ZooConfig):
    type: Literal["causal_lm"] = "causal_lm"
    vocab_size: int | None = Field(256, ge=1, description="null: taken from the task when training")
    dim: int = Field(128, ge=1, description="embedding and residual-stream width")
    stack: Spec("stack") = Field(default_factory=XLSTMStackConfig)
    tie_weights: bool = Field(True, description="share the embedding matrix with the output head")
    init: InitConfig = Field(default_factory=InitConfig, description="how the weights start (scheme, per-role std)")
    logit_softcap: float | None = AddedField(None, gt=0, description="soft-cap the logits to (-cap, cap) with "
                                                                    "cap*tanh(logits/cap) (xLSTM-7B: 30)")
    embedding_norm: Spec("norm") = AddedField(NoNormConfig(), description="a norm of the embeddings "
                                              "before the stack (RWKV's ln0: layernorm)")


@component("model", "causal_lm", config=CausalLMConfig, description="causal language model with stateful step-wise generation")
class CausalLM(StackModel):
    def __init__(self, config: CausalLMConfig, ctx: BuildContext | None = None):
        super().__init__()
        ctx = BuildContext(dim=config.dim, path=ctx.path if ctx else "model")
        if config.vocab_size is None:
            raise ctx.error("vocab_size is null: set it, or train on a task (which supplies its vocabulary)",
                            "vocab_size")
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        self.embedding_norm = build(config.embedding_norm, ctx.at("embedding_norm"), "norm")
        self.stack = build(config.stack, ctx.at("stack"), "stack")
        self.head = Linear(config.dim, config.vocab_size, bias=False)
        self._compiled_step = None  # made by compiled_step() on first use
        if config.tie_weights:
            self.head.weight = self.embedding.weight
        initialize(self, config.init, dim=config.dim, num_blocks=count_blocks(self.stack), tied=config.tie_weights)

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: ``("token", vocab_size)`` (ids ``[B]``)."""
        return "token", self.embedding.num_embeddings

    @property
    def init_roles(self) -> dict[str, str]:
        return {"embedding.weight": "embedding", **({} if self.config.tie_weights else {"head.weight": "head"})}

    def forward(self, tokens: torch.Tensor, state: tuple | None = None, *, doc_starts: torch.Tensor | None = None,
                cu_seqlens=None):
        """``tokens [B, T]`` -> ``logits [B, T, vocab]``, final state. Packed rows: ``doc_starts [B, T]``
        (bool, True where a document starts: it starts from the zero state) or flash-linear-attention's
        ``cu_seqlens`` for one row (see xlstm_zoo.packed)."""
        starts = packed.boundaries(doc_starts, cu_seqlens, *tokens.shape[:2])
        h, state = self.stack(self.embedding_norm(embed_tokens(self.embedding, tokens)), state, doc_starts=starts)
        return self._logits(h), state

    def step(self, token: torch.Tensor, state: tuple | None, *, reset: torch.Tensor | None = None):
        """``token [B]`` -> ``logits [B, vocab]``, next state (``state=None``: the zero state); ``reset [B]``
        (bool) restarts those rows from the zero state first."""
        h, state = self.stack.step(self.embedding_norm(embed_tokens(self.embedding, token)), state, reset=reset)
        return self._logits(h), state

    def compiled_step(self):
        """:meth:`step` under ``torch.compile``: same arguments and results, compiled on its first call
        (seconds; a new batch size compiles once more), eager with a :class:`~xlstm_zoo.compiling.CompileWarning`
        if compiling fails. A step issues a few hundred small ops; fused, they cost less than their
        dispatch (see docs/performance.md for what it buys per size)."""
        if self._compiled_step is None:
            # cpp_wrapper: the compiled graph is launched from C++, not Python: faster per step than
            # inductor's Python wrapper (docs/performance.md).
            compiled = compile_or_eager(self.step, what="the generation step (causal_lm.step)",
                                        options={"cpp_wrapper": True})

            def checked_step(token, state):  # the state check, left out of the graph, runs here
                check = getattr(self.stack, "check_state", None)
                if check is not None and state is not None and isinstance(token, torch.Tensor):
                    check(state, token.shape[0], self.embedding.weight.dtype)
                return compiled(token, state)
            self._compiled_step = checked_step
        return self._compiled_step

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits, cap = self.head(h), self.config.logit_softcap
        return logits if cap is None else ops.soft_cap(logits, cap)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, greedy: bool = False, generator: torch.Generator | None = None,
                 compile: bool = False) -> torch.Tensor:
        """Continue ``prompt [B, T>=1]`` by ``max_new_tokens``: one parallel pass over the prompt,
        then one recurrent step per token (constant memory, no recomputation). ``compile=True`` runs
        the steps through :meth:`compiled_step`."""
        new = self.stream(prompt, max_new_tokens, temperature=temperature, top_k=top_k, greedy=greedy,
                          generator=generator, compile=compile)
        return torch.cat([prompt, *(token[:, None] for token in new)], dim=1)

    def stream(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
               top_k: int | None = None, greedy: bool = False, generator: torch.Generator | None = None,
               compile: bool = False):
        """As :meth:`generate`, but yield each new token ``[B]`` as soon as it is chosen. The arguments are
        checked here, before the first token (:class:`~xlstm_zoo.errors.InputError`)."""
        if not isinstance(prompt, torch.Tensor) or prompt.ndim != 2 or prompt.shape[1] < 1:
            raise InputError(f"prompt must be [batch, T>=1] token ids, got "
                             f"{f'shape {tuple(prompt.shape)}' if isinstance(prompt, torch.Tensor) else type(prompt).__name__}")
        check_token_ids(prompt, self.embedding.num_embeddings, "prompt")
        check_generation(max_new_tokens, temperature, top_k, greedy)
        return self._stream(prompt, max_new_tokens, temperature=temperature, top_k=top_k, greedy=greedy,
                            generator=generator, compile=compile)

    @torch.no_grad()
    def _stream(self, prompt, max_new_tokens, *, temperature, top_k, greedy, generator, compile):
        step = self.compiled_step() if compile else self.step
        logits, state = self(prompt)
        logits = logits[:, -1]
        for i in range(max_new_tokens):
            token = pick_token(logits, temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
            yield token
            if i + 1 < max_new_tokens:
                logits, state = step(token, state)


def pick_token(logits, *, temperature=1.0, top_k=None, greedy=False, generator=None) -> torch.Tensor:
    if greedy:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]
