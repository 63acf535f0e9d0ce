"""Registry-wide conformance: every registered component builds and honours its contract.

The test cases come from the registry itself, so a newly registered component (a plugin's too)
is tested the moment it is registered.
"""

import pytest
import torch

from xlstm_zoo.config import BuildContext, build
from xlstm_zoo.registry import registry

DIM, B, T = 16, 2, 11  # odd T; T=11 does not divide into the halves evenly either

# Module-level comparisons accumulate a few fp32 roundings per op; 1e-4 is DESIGN's kernel-level bound.
TOL = dict(rtol=1e-4, atol=1e-4)


def assert_tree_close(a, b, what):
    flat_a, flat_b = _leaves(a), _leaves(b)
    assert len(flat_a) == len(flat_b), f"{what}: state structure differs"
    for i, (x, y) in enumerate(zip(flat_a, flat_b)):
        finite = torch.isfinite(x)
        assert torch.equal(finite, torch.isfinite(y)), f"{what}: state leaf {i} has different non-finite entries"
        torch.testing.assert_close(x[finite], y[finite], **TOL, msg=lambda m: f"{what}: state leaf {i}: {m}")


def _leaves(tree):
    if isinstance(tree, torch.Tensor):
        return [tree]
    if tree is None:
        return []
    return [leaf for item in tree for leaf in _leaves(item)]


def check_sequence_module(module, make_input, step_input, *, extra=None):
    """forward == loop of step, halves == whole, fp32 states, gradients reach every parameter."""
    x = make_input()
    extra = extra or {}
    y, state = module(x, None, **extra)
    assert torch.isfinite(y).all(), "forward produced NaN/Inf"

    state0 = module.init_state(B)
    for leaf in _leaves(state0):
        assert leaf.dtype == torch.float32, f"state leaf dtype {leaf.dtype}, states must be fp32"

    step_state, ys = state0, []
    for t in range(T):
        y_t, step_state = module.step(step_input(x, t), step_state, **{k: step_input(v, t) for k, v in extra.items()})
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, **TOL, msg=lambda m: f"loop of step != forward: {m}")
    assert_tree_close(step_state, state, "final state (step loop vs forward)")

    cut = T // 2 - 1
    first = lambda v: v[:, :cut]  # noqa: E731
    second = lambda v: v[:, cut:]  # noqa: E731
    y1, s1 = module(first(x), None, **{k: first(v) for k, v in extra.items()})
    y2, s2 = module(second(x), s1, **{k: second(v) for k, v in extra.items()})
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, **TOL, msg=lambda m: f"two halves != whole: {m}")
    assert_tree_close(s2, state, "final state (halves vs whole)")

    module.zero_grad()
    y.float().pow(2).mean().backward()
    params = dict(module.named_parameters())
    missing = [n for n, p in params.items() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"
    bad = [n for n, p in params.items() if not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad}"
    assert any(p.grad.abs().sum() > 0 for p in params.values()), "all gradients are zero"


def default(kind, name):
    return registry.get(kind, name).default_config()


def features(x, t):
    return x[:, t]


@pytest.mark.parametrize("name", registry.names("cell"))
def test_cell_contract(name):
    cell = build(default("cell", name), BuildContext(dim=DIM), "cell")
    check_sequence_module(cell, lambda: torch.randn(B, T, DIM), features)
    # a separate value stream (used by conv blocks) is honoured by step and forward alike
    v = torch.randn(B, T, DIM)
    check_sequence_module(cell, lambda: torch.randn(B, T, DIM), features, extra={"value_input": v})


@pytest.mark.parametrize("block", registry.names("block"))
@pytest.mark.parametrize("cell", registry.names("cell"))
def test_every_cell_in_every_block(block, cell):
    config = registry.get("block", block).config.model_validate(
        {"type": block, "cell": default("cell", cell).model_dump()})
    module = build(config, BuildContext(dim=DIM), "block")
    check_sequence_module(module, lambda: torch.randn(B, T, DIM), features)


@pytest.mark.parametrize("name", registry.names("stack"))
def test_stack_contract(name):
    data = {"type": name}
    if name == "sequential":
        data["blocks"] = [{"type": "pre_up"}, {"type": "post_up"}]
    else:
        data.update(num_blocks=2, ratio="1:1")
    config = registry.get("stack", name).config.model_validate(data)
    stack = build(config, BuildContext(dim=DIM), "stack")
    check_sequence_module(stack, lambda: torch.randn(B, T, DIM), features)


@pytest.mark.parametrize("name", registry.names("model"))
def test_model_contract(name):
    small = {"type": name, "dim": DIM, "stack": {"type": "xlstm", "ratio": "1:1", "num_blocks": 2}}
    if name == "classifier":
        small.update(vocab_size=10, pool="none")
    else:
        small.update(vocab_size=10)
    model = build(registry.get("model", name).config.model_validate(small), BuildContext(dim=DIM), "model")
    check_sequence_module(model, lambda: torch.randint(0, 10, (B, T)), lambda x, t: x[:, t])


@pytest.mark.parametrize("name", registry.names("norm"))
def test_norm_contract(name):
    norm = build(default("norm", name), BuildContext(dim=DIM, heads=4), "norm")
    x = torch.randn(B, T, DIM) * 3 + 1
    y = norm(x)
    assert y.shape == x.shape and torch.isfinite(y).all()


@pytest.mark.parametrize("name", registry.names("gate"))
def test_gate_contract(name):
    gate = build(default("gate", name), BuildContext(dim=DIM, heads=4, units=4), "gate")
    assert gate.scheme in ("sigmoid", "exponential"), f"gate {name} declares unknown scheme {gate.scheme!r}"
    pre = gate(torch.randn(B, T, DIM))
    assert pre.shape == (B, T, 4) and torch.isfinite(pre).all()


@pytest.mark.parametrize("name", registry.names("backend"))
def test_backend_contract(name):
    backend = registry.instance("backend", name)
    assert backend.name == name
    if backend.unavailable_reason() is None:
        required = {"mlstm_sequence", "mlstm_step", "slstm_sequence", "slstm_step", "lstm_sequence", "lstm_step"}
        if name == "reference":
            assert required <= set(backend.ops), f"reference backend lacks {required - set(backend.ops)}"


@pytest.mark.parametrize("name", registry.names("cell"))
def test_cell_gradcheck_float64(name):
    """Gradients w.r.t. the input, the value stream and a (non-zero) initial state, for every cell."""
    cell = build(default("cell", name), BuildContext(dim=8), "cell").double()
    with torch.no_grad():  # gates start at zero projection; perturb so every path carries signal
        for p in cell.parameters():
            p.add_(0.1 * torch.randn_like(p))
        _, prefix_state = cell(torch.randn(1, 3, 8, dtype=torch.float64))  # a reachable, finite state
    leaves = [leaf.detach().clone().requires_grad_() for leaf in _leaves(prefix_state)]
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)

    def run(x, v, *leaves):
        state = type(prefix_state)(*leaves) if hasattr(prefix_state, "_fields") else tuple(leaves)
        y, final = cell(x, state, value_input=v)
        return (y, *_leaves(final))

    assert torch.autograd.gradcheck(run, (x, v, *leaves), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("recipe", ["xlstm_1_1", "lstm", "xlstm_7b_small"])
def test_bf16_model_keeps_fp32_states(recipe):
    from xlstm_zoo import build as build_recipe, load_recipe

    model = build_recipe(load_recipe(recipe, ["dim=32", "stack.num_blocks=2"] if recipe == "xlstm_1_1" else ["dim=32"]))
    model = model.to(torch.bfloat16)
    tokens = torch.randint(0, 256, (2, 9))
    logits, state = model(tokens)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert all(leaf.dtype == torch.float32 for leaf in _leaves(state)), "states stay fp32 under bf16 compute"
    logits_t, state = model.step(tokens[:, 0], model.init_state(2))
    assert logits_t.dtype == torch.bfloat16 and all(leaf.dtype == torch.float32 for leaf in _leaves(state))
