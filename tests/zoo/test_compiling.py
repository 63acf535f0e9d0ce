"""Opt-in torch.compile (xlstm_zoo.compiling): compiled results match eager; a compiler failure
falls back to eager with one CompileWarning; the caller's own errors are raised as they are."""

from __future__ import annotations

import warnings

import pytest
import torch

from xlstm_zoo.compiling import CompileWarning, compile_or_eager
from xlstm_zoo.recipe_loader import build, load_recipe


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("this compiler backend always fails")


def _double_plus_one(x):
    return x * 2 + 1


def test_a_failing_compiler_falls_back_to_eager_and_warns_once():
    run = compile_or_eager(_double_plus_one, what="the test function", backend=_failing_backend)
    x = torch.arange(4.0)
    with pytest.warns(CompileWarning, match="the test function.*always fails"):
        assert torch.equal(run(x), x * 2 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and eager from now on
        assert torch.equal(run(x + 1), (x + 1) * 2 + 1)


def test_the_callers_own_error_is_raised_not_swallowed():
    def needs_matching_shapes(a, b):
        return a + b

    run = compile_or_eager(needs_matching_shapes, what="add", backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        with pytest.raises(RuntimeError, match="size of tensor"):
            run(torch.ones(3), torch.ones(4))
        assert torch.equal(run(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))  # still compiled


@pytest.mark.slow  # torch.compile with inductor (30 s)
def test_compiled_generation_step_matches_eager():
    """The real thing (inductor, C++ wrapper) on a tiny mLSTM + sLSTM model: same logits and state
    per step, same greedy tokens. A CompileWarning here means compiling failed, which fails the test."""
    torch.manual_seed(0)
    model = build(load_recipe("xlstm_1_1", ["dim=16", "vocab_size=11", "stack.num_blocks=2"])).eval()
    prompt = torch.randint(0, 11, (2, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        compiled = model.generate(prompt, 6, greedy=True, compile=True)
        with torch.no_grad():
            _, state = model(prompt)
            token = prompt[:, -1]
            logits_c, state_c = model.compiled_step()(token, state)
            logits_e, state_e = model.step(token, state)
    assert torch.equal(compiled, model.generate(prompt, 6, greedy=True))
    torch.testing.assert_close(logits_c, logits_e, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.utils._pytree.tree_leaves(state_c), torch.utils._pytree.tree_leaves(state_e)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
