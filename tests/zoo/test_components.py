"""Registry-wide conformance: every registered component builds and honours its contract.

The test cases come from the registry itself, so a newly registered component (a plugin's too)
is tested the moment it is registered.
"""

import pytest
import torch

from xlstm_zoo import testing
from xlstm_zoo.registry import registry

# The checks live in xlstm_zoo.testing, shared with plugin authors and with the conformance check
# on a plugin component's first build; these tests run them over the whole registry.
DIM = testing.DIM  # 16; batch 2, T=11 (odd; does not divide into the halves evenly either)


def default(kind, name):
    return registry.get(kind, name).default_config()


@pytest.mark.parametrize("name", registry.names("cell"))
def test_cell_contract(name):
    # without and with a separate value stream (used by conv blocks); the float64 gradcheck is its own test,
    # and tests/export/test_export.py exports every built-in cell (inside blocks and bare)
    testing.check_cell(default("cell", name), dim=DIM, gradcheck=False, export=False)


@pytest.mark.parametrize("block", registry.names("block"))
@pytest.mark.parametrize("cell", registry.names("cell"))
def test_every_cell_in_every_block(block, cell):
    config = registry.get("block", block).config.model_validate(
        {"type": block, "cell": default("cell", cell).model_dump()})
    testing.check_block(config, dim=DIM)


@pytest.mark.parametrize("name", registry.names("stack"))
def test_stack_contract(name):
    data = {"type": name}
    if name == "sequential":
        data["blocks"] = [{"type": "pre_up"}, {"type": "post_up"}]
    else:
        data.update(num_blocks=2, ratio="1:1")
    config = registry.get("stack", name).config.model_validate(data)
    testing.check_stack(config, dim=DIM)


@pytest.mark.parametrize("name", registry.names("model"))
def test_model_contract(name):
    small = {"type": name, "dim": DIM, "stack": {"type": "xlstm", "ratio": "1:1", "num_blocks": 2}}
    if name == "classifier":
        small.update(vocab_size=10, pool="none")
    else:
        small.update(vocab_size=10)
    testing.check_model(registry.get("model", name).config.model_validate(small))


@pytest.mark.parametrize("name", registry.names("norm"))
def test_norm_contract(name):
    testing.check_norm(default("norm", name), dim=DIM, heads=4)


@pytest.mark.parametrize("name", registry.names("gate"))
def test_gate_contract(name):
    testing.check_gate(default("gate", name), dim=DIM, heads=4, units=4)


@pytest.mark.parametrize("name", registry.names("backend"))
def test_backend_contract(name):
    backend = testing.check_backend(name)  # its instance is named `name`
    if backend.unavailable_reason() is None:
        required = {"mlstm_sequence", "mlstm_step", "slstm_sequence", "slstm_step", "lstm_sequence", "lstm_step"}
        if name == "reference":
            assert required <= set(backend.ops), f"reference backend lacks {required - set(backend.ops)}"


@pytest.mark.parametrize("name", registry.names("cell"))
def test_cell_gradcheck_float64(name):
    """Gradients w.r.t. the input, the value stream and a (non-zero) initial state, for every cell."""
    testing.check_cell_gradcheck(default("cell", name), dim=8)


@pytest.mark.parametrize("recipe", ["xlstm_1_1", "lstm", "xlstm_7b_small"])
def test_bf16_model_keeps_fp32_states(recipe):
    from xlstm_zoo import build as build_recipe, load_recipe

    model = build_recipe(load_recipe(recipe, ["dim=32", "stack.num_blocks=2"] if recipe == "xlstm_1_1" else ["dim=32"]))
    model = model.to(torch.bfloat16)
    tokens = torch.randint(0, 256, (2, 9))
    logits, state = model(tokens)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert all(leaf.dtype == torch.float32 for leaf in testing.leaves(state)), "states stay fp32 under bf16 compute"
    logits_t, state = model.step(tokens[:, 0], model.init_state(2))
    assert logits_t.dtype == torch.bfloat16 and all(leaf.dtype == torch.float32 for leaf in testing.leaves(state))
