"""Blocks and stacks against the official ``xLSTMBlockStack``: forward, forward+backward and the generation step."""

from __future__ import annotations

from dataclasses import replace

import torch

from xlstm_zoo.bench.case import (GENERATION_SAMPLE_FACTOR, BaselineUnavailable, Case, Prepared, Scale, count, forward,
                                  forward_backward, stack_input)
from xlstm_zoo.bench.official import official_stack, our_model, recipe_overrides


# (case id, title, our recipe, blocks, official slstm_at, official function)
ARCHITECTURES = [
    ("mlstm_block", "mLSTM block", "xlstm_1_0", 1, [], "slstm"),
    ("slstm_block", "sLSTM block", "xlstm_0_1", 1, "all", "slstm"),
    ("lstm_block", "LSTM block", "lstm_up_projection", 1, "all", "lstm"),
    ("xlstm_1_0", "xLSTM[1:0]", "xlstm_1_0", 4, [], "slstm"),
    ("xlstm_0_1", "xLSTM[0:1]", "xlstm_0_1", 4, "all", "slstm"),
    ("xlstm_7_1", "xLSTM[7:1]", "xlstm_7_1", 8, [1], "slstm"),
]


def architecture_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d={scale.dim} heads={scale.heads} fp32"
    for key, title, recipe, blocks, slstm_at, function in ARCHITECTURES:
        nb = 1 if recipe == "lstm_up_projection" else blocks
        for group, wrap, label in (("forward", forward, "fwd"), ("forward+backward", forward_backward, "fwdbwd")):
            def ours(recipe=recipe, nb=nb, wrap=wrap):
                stack = our_model(recipe, scale, None if recipe == "lstm_up_projection" else nb).stack
                return Prepared(wrap(stack, stack_input(scale)), count(stack),
                                note="build(load_recipe(recipe, overrides)).stack (overrides in results.json)")

            def baseline(nb=nb, slstm_at=slstm_at, function=function, wrap=wrap):
                torch.manual_seed(scale.seed)
                stack = official_stack(scale, nb, slstm_at, function=function)
                return Prepared(wrap(stack, stack_input(scale)), count(stack),
                                note="xlstm.xLSTMBlockStack (same layout; its mLSTM layer runs the parallel form, "
                                     "its sLSTM the vanilla backend)")

            cases.append(Case(f"{label}/{key}", group, shapes, ours, baseline,
                              info=dict(title=title, recipe=recipe, overrides=recipe_overrides(recipe, scale, nb))))
    return cases


def _our_step(scale: Scale, p: int, compiled: bool = False) -> Prepared:
    """One generation step of our xLSTM[7:1] model at position ``p`` (prefilled chunkwise); ``compiled``:
    through ``model.compiled_step()`` (torch.compile), compiled here, outside the timed calls."""
    model = our_model("xlstm_7_1", scale).eval()
    g = torch.Generator().manual_seed(scale.seed + 2)
    tokens = torch.randint(0, model.embedding.num_embeddings, (1, p + 1), generator=g)
    with torch.no_grad():
        _, prefilled = model(tokens[:, :p])  # chunkwise prefill to position p
    token = tokens[:, p]
    step = model.compiled_step() if compiled else model.step
    if compiled:
        with torch.no_grad():
            step(token, prefilled)

    def fn():  # every call steps from the same state: the position stays p
        with torch.no_grad():
            step(token, prefilled)
    return Prepared(fn, count(model.stack), note="model.compiled_step() (torch.compile; embedding + stack + head)"
                    if compiled else "model.step (embedding + stack + head)")


def _official_step(scale: Scale, p: int) -> Prepared:
    """One step of the official xLSTM[7:1] stack at position ``p`` (prefilled by official steps)."""
    if p > scale.official_prefill_max:
        raise BaselineUnavailable(f"skipped: the official forward returns no state, reaching position {p} "
                                  f"takes {p} official steps (limit {scale.official_prefill_max}; full run)")
    torch.manual_seed(scale.seed)
    stack = official_stack(scale, 8, [1], context_length=16).eval()
    g = torch.Generator().manual_seed(scale.seed + 3)
    xs = torch.randn(1, p + 1, scale.dim, generator=g)
    state = None
    with torch.no_grad():
        for t in range(p):  # official prefill: one step per token
            _, state = stack.step(xs[:, t:t + 1], state)
    x_t = xs[:, p:p + 1]

    def fn():
        with torch.no_grad():
            stack.step(x_t, dict(state))  # step() writes into the dict it gets
    return Prepared(fn, count(stack), note="xLSTMBlockStack.step (stack only)")


def generation_cases(scale: Scale) -> list[Case]:
    cases = []
    first = scale.positions[0]
    ref_name = f"generate/xlstm_7_1/pos={first}"
    for p in scale.positions:
        cases.append(Case(f"generate/xlstm_7_1/pos={p}", "generation step (B=1)", f"B=1 d={scale.dim} position {p}",
                          lambda p=p: _our_step(scale, p), lambda p=p: _official_step(scale, p), memory=False,
                          ref=ref_name, info=dict(position=p), sample_factor=GENERATION_SAMPLE_FACTOR))
    # The step a user gets from generate(compile=True): eagerly a step is ~1,000 small ops (dispatch-bound).
    cases.append(Case(f"generate/xlstm_7_1_compiled/pos={first}", "generation step (B=1), ours compiled",
                      f"B=1 d={scale.dim} position {first}", lambda: _our_step(scale, first, compiled=True),
                      lambda: _official_step(scale, first), memory=False, info=dict(position=first),
                      sample_factor=GENERATION_SAMPLE_FACTOR))
    # Does a step get slower as the position grows? Our step at p against our step at the first
    # position, interleaved in one case, so a drift in machine speed hits both.
    for p in scale.positions[1:]:
        cases.append(Case(f"generate/position/pos={p}", "step latency vs position", f"B=1 d={scale.dim} position {p} vs {first}",
                          lambda p=p: _our_step(scale, p),
                          lambda: replace(_our_step(scale, first), note=f"the same model.step at position {first}"),
                          baseline_name=f"ours at position {first}", info=dict(position=p),
                          sample_factor=GENERATION_SAMPLE_FACTOR))
    return cases
