"""Models: generation carries the state (no recomputation) and agrees with full recomputation."""

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.tolerances import assert_close

SMALL = ["dim=32", "vocab_size=17"]


@pytest.mark.parametrize("recipe", ["xlstm_1_1", "lstm", "xlstm_7b_small"])
def test_greedy_generation_equals_recomputing_the_whole_prefix(recipe):
    model = build(load_recipe(recipe, SMALL + (["stack.num_blocks=2"] if recipe == "xlstm_1_1" else []))).eval()
    prompt = torch.randint(0, 17, (3, 5))
    out = model.generate(prompt, 6, greedy=True)
    assert out.shape == (3, 11) and torch.equal(out[:, :5], prompt)
    with torch.no_grad():
        for t in range(5, 11):
            logits, _ = model(out[:, :t])
            assert torch.equal(logits[:, -1].argmax(-1), out[:, t]), f"token {t} differs from full recomputation"


def test_sampling_is_seeded_and_top_k_restricts():
    model = build(load_recipe("xlstm_1_0", SMALL + ["stack.num_blocks=1"])).eval()
    prompt = torch.zeros(2, 1, dtype=torch.long)
    a = model.generate(prompt, 8, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    with torch.no_grad():
        logits, _ = model(prompt)
    top1 = logits[:, -1].argmax(-1)
    first = model.generate(prompt, 1, top_k=1, generator=torch.Generator().manual_seed(2))[:, 1]
    assert torch.equal(first, top1), "top_k=1 sampling must pick the argmax"
    with pytest.raises(ValueError, match="temperature must be > 0"):
        model.generate(prompt, 1, temperature=0)
    with pytest.raises(ValueError, match=r"prompt must be \[batch, T>=1\]"):
        model.generate(torch.zeros(3, dtype=torch.long), 1)


def test_tied_weights():
    tied = build(load_recipe("xlstm_1_0", SMALL))
    untied = build(load_recipe("xlstm_1_0", SMALL + ["tie_weights=false"]))
    assert tied.head.weight is tied.embedding.weight
    assert untied.head.weight is not untied.embedding.weight


@pytest.mark.parametrize("pool, shape", [("last", (2, 3)), ("mean", (2, 3)), ("none", (2, 7, 3))])
def test_classifier_heads(pool, shape):
    recipe = {"model": {"type": "classifier", "input_dim": 5, "dim": 16, "num_classes": 3, "pool": pool,
                        "stack": {"type": "xlstm", "ratio": "1:1", "num_blocks": 2}}}
    model = build(load_recipe(recipe))
    logits, state = model(torch.randn(2, 7, 5))
    assert logits.shape == shape and len(state) == 2
    with pytest.raises(ValueError, match="exactly one of vocab_size"):
        load_recipe({"model": {"type": "classifier", "vocab_size": 4, "input_dim": 5}})


def test_state_is_carried_across_calls_for_any_length():
    model = build(load_recipe("xlstm_1_1", SMALL + ["stack.num_blocks=2"])).eval()
    tokens = torch.randint(0, 17, (2, 150))  # longer than any chunk, no fixed context length
    with torch.no_grad():
        whole, _ = model(tokens)
        state, pieces = None, []
        for piece in tokens.split([1, 64, 7, 78], dim=1):
            logits, state = model(piece, state)
            pieces.append(logits)
    assert_close(torch.cat(pieces, 1), whole, kind="module", what="logits over pieces vs the whole")
