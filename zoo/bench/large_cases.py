"""The xLSTM-7B layout against the official ``xLSTMLarge`` (forward, forward+backward, generation step), and a
step's linear maps (the ``linear_step`` op) against ``F.linear``."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from xlstm_zoo.backends import linear_step
from xlstm_zoo.bench.case import GENERATION_SAMPLE_FACTOR, Case, Prepared, Scale, count, first
from xlstm_zoo.bench.official import large_overrides, official_large, our_large


def _tokens(scale: Scale, batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(scale.seed + 4)
    return torch.randint(0, scale.large_vocab, (batch, length), generator=g)


def _lm_forward(model, tokens) -> Callable[[], None]:
    model.eval()

    def fn():
        with torch.no_grad():
            first(model(tokens))
    return fn


def _lm_forward_backward(model, tokens) -> Callable[[], None]:
    """Sum of the logits, backward to every parameter (gradients reset each call)."""
    model.train()

    def fn():
        model.zero_grad(set_to_none=True)
        first(model(tokens)).sum().backward()
    return fn


def _large_step(model, scale: Scale, batch: int, ours: bool, compiled: bool = False) -> Callable[[], None]:
    """One generation step from a state prefilled over ``large_prefill`` tokens (chunkwise on both sides);
    ``compiled``: our step under torch.compile (compiled here, outside the timed calls)."""
    model.eval()
    tokens = _tokens(scale, batch, scale.large_prefill + 1)
    with torch.no_grad():
        _, state = model(tokens[:, :-1])
    if ours:
        token = tokens[:, -1]
        step = model.compiled_step() if compiled else model.step
        with torch.no_grad():
            step(token, state)

        def fn():
            with torch.no_grad():
                step(token, state)
        return fn
    token = tokens[:, -1:]

    def fn():  # T=1 in inference mode: the official native step kernel
        with torch.no_grad():
            model(token, {k: tuple(v) for k, v in state.items()})
    return fn


def large_cases(scale: Scale) -> list[Case]:
    cases = []
    B, T = scale.large_batch, scale.large_seq_len
    for dim in scale.large_dims:
        shapes = f"B={B} T={T} d={dim} heads={scale.large_heads} blocks={scale.large_blocks} vocab={scale.large_vocab} fp32"
        info = dict(title=f"xLSTM-7B layout d={dim}", recipe="xlstm_7b_small", overrides=large_overrides(scale, dim))
        for label, wrap, mode in (("fwd", _lm_forward, "inference"), ("fwdbwd", _lm_forward_backward, "train")):
            def ours(dim=dim, wrap=wrap):
                model = our_large(scale, dim)
                return Prepared(wrap(model, _tokens(scale, B, T)), count(model),
                                note="build(load_recipe('xlstm_7b_small', overrides)) (embedding + stack + head)")

            def baseline(dim=dim, wrap=wrap, mode=mode):
                model = official_large(scale, dim, mode)
                return Prepared(wrap(model, _tokens(scale, B, T)), count(model),
                                note=f"xlstm.xLSTMLarge, chunkwise--native_autograd, weight_mode=fused, mode={mode}")

            group = "7B layout " + ("forward" if label == "fwd" else "forward+backward")
            cases.append(Case(f"7b/{label}/d={dim}", group, shapes, ours, baseline, info=info,
                              roofline=scale.gemm_size))
        for compiled in (False, True):
            for batch in scale.large_step_batches:
                def ours_step(dim=dim, batch=batch, compiled=compiled):
                    model = our_large(scale, dim)
                    return Prepared(_large_step(model, scale, batch, True, compiled), count(model),
                                    note="model.compiled_step() (torch.compile)" if compiled else "model.step")

                def base_step(dim=dim, batch=batch):
                    model = official_large(scale, dim, "inference")
                    return Prepared(_large_step(model, scale, batch, False), count(model),
                                    note="xlstm.xLSTMLarge, one token in inference mode (native step kernel)")

                name, group = ("step_compiled", "7B layout generation step, ours compiled") if compiled else \
                    ("step", "7B layout generation step")
                cases.append(Case(f"7b/{name}/d={dim}/B={batch}", group, f"B={batch} d={dim} "
                                  f"after {scale.large_prefill} tokens", ours_step, base_step, info=info,
                                  sample_factor=GENERATION_SAMPLE_FACTOR))
        for batch in scale.large_step_batches:
            cases.append(Case(f"7b/step_linears/d={dim}/B={batch}", "7B layout: a step's linear maps vs F.linear",
                              f"B={batch} d={dim}, every linear layer of the model once",
                              lambda dim=dim, batch=batch: _step_linears(scale, dim, batch, ours=True),
                              lambda dim=dim, batch=batch: _step_linears(scale, dim, batch, ours=False),
                              baseline_name="F.linear", sample_factor=GENERATION_SAMPLE_FACTOR))
    return cases


def _step_linears(scale: Scale, dim: int, batch: int, *, ours: bool) -> Prepared:
    """Every linear layer of the 7B layout once on a step's ``[batch, in]`` input, in model order (so each
    weight comes from memory as in a real step): through our layers (the ``linear_step`` op) or ``F.linear``."""
    model = our_large(scale, dim).eval()
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(batch, m.in_features) for m in layers}

    def fn():
        with torch.no_grad():
            for m in layers:
                x = inputs[m.in_features]
                if ours:
                    m(x)
                else:
                    F.linear(x, m.weight, m.bias)
    return Prepared(fn, count(model), note="our Linear layers (linear.step op)" if ours else "torch.nn.functional.linear")


LINEAR_MAPS = 8  # more weight than the caches hold, so each map comes from memory as in a model's step


def _linear_maps(scale: Scale, rows: int, *, ours: bool) -> Prepared:
    g = torch.Generator().manual_seed(scale.seed)
    n = scale.linear_size
    maps = [(torch.randn(n, n, generator=g), torch.randn(n, generator=g)) for _ in range(LINEAR_MAPS)]
    x = torch.randn(rows, n, generator=g)
    run = linear_step if ours else F.linear

    def fn():
        with torch.no_grad():
            for W, b in maps:
                run(x, W, b)
    return Prepared(fn, LINEAR_MAPS * n * (n + 1),
                    note="xlstm_zoo.backends.linear_step (the dispatcher's choice)" if ours else "F.linear")


def linear_step_cases(scale: Scale) -> list[Case]:
    n = scale.linear_size
    return [Case(f"linear_step/B={rows}", "a step's linear maps: the linear_step op vs F.linear",
                 f"B={rows}, {LINEAR_MAPS} maps {n} x {n} fp32",
                 lambda rows=rows: _linear_maps(scale, rows, ours=True),
                 lambda rows=rows: _linear_maps(scale, rows, ours=False),
                 baseline_name="F.linear", sample_factor=GENERATION_SAMPLE_FACTOR) for rows in scale.linear_rows]
