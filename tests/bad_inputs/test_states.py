"""Bad states handed to a model, a stack or a step: each is one InputError naming the block, the entry,
what was given and what is expected; the states a model hands back, and None entries, still work."""

from typing import NamedTuple

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.cells.base import StateSpec
from xlstm_zoo.errors import InputError, ZooError

SMALL = ["dim=32", "vocab_size=17", "stack.num_blocks=2"]  # xlstm_1_1: block 0 pre_up (mLSTM), 1 post_up (sLSTM)


@pytest.fixture(scope="module")
def lm():
    return build(load_recipe("xlstm_1_1", SMALL)).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def state(lm, tokens):
    with torch.no_grad():
        return lm(tokens)[1]


def refused(call, *patterns):
    with pytest.raises(InputError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ZooError), message
    for pattern in patterns:
        assert pattern in message, message
    return message


def both(lm, tokens, state):
    """The model's forward and step, with this state."""
    return [lambda: lm(tokens, state), lambda: lm.step(tokens[:, 0], state)]


def replace(state, block, **entries):
    """``state`` with entries of one block replaced (``cell_C=...`` reaches into the cell's state)."""
    blocks = list(state)
    for name, value in entries.items():
        if name.startswith("cell_"):
            blocks[block] = blocks[block]._replace(cell=blocks[block].cell._replace(**{name[5:]: value}))
        else:
            blocks[block] = blocks[block]._replace(**{name: value})
    return tuple(blocks)


def test_fewer_entries_than_blocks(lm, tokens, state):
    for call in both(lm, tokens, state[:1]):
        refused(call, "1 entry given", "2 blocks")


def test_an_empty_state(lm, tokens):
    for call in both(lm, tokens, []):
        refused(call, "0 entries given", "2 blocks")


def test_more_entries_than_blocks(lm, tokens, state):
    for call in both(lm, tokens, state + state[:1]):
        refused(call, "3 entries given", "2 blocks")


def test_a_state_that_is_not_a_sequence(lm, tokens, state):
    refused(lambda: lm(tokens, state[0].conv), "a Tensor given", "2 blocks")


def test_a_conv_window_of_another_length(lm, tokens, state):
    bad = replace(state, 0, conv=state[0].conv[:, :2])  # kernel 4 keeps 3 inputs
    for call in both(lm, tokens, bad):
        refused(call, "block 0 (pre_up)", "entry conv", "(2, 2, 64) given", "(2, 3, 64) expected")


def test_a_float64_state_in_a_float32_model(lm, tokens, state):
    bad = replace(state, 0, cell_C=state[0].cell.C.double())
    for call in both(lm, tokens, bad):
        refused(call, "block 0 (pre_up)", "entry cell.C", "float64 given", "float32 expected")


def test_a_bfloat16_state(lm, tokens, state):
    bad = replace(state, 1, cell_n=state[1].cell.n.bfloat16())
    for call in both(lm, tokens, bad):
        refused(call, "block 1 (post_up)", "entry cell.n", "bfloat16 given")


def test_a_state_of_another_batch(lm, tokens):
    for call in both(lm, tokens, lm.init_state(3)):
        refused(call, "block 0", "entry cell.C", "(3, 4, 16, 16) given", "(2, 4, 16, 16) expected", "batch is 2")


def test_a_state_with_other_heads(lm, tokens):
    other = build(load_recipe("xlstm_1_1", SMALL + ["stack.blocks.s.cell.num_heads=2"])).init_state(2)
    for call in both(lm, tokens, other):
        refused(call, "block 1 (post_up)", "entry cell.c", "(2, 2, 16) given", "(2, 4, 8) expected")


def test_a_plain_tuple_where_a_named_state_belongs(lm, tokens, state):
    bad = (tuple(state[0]),) + state[1:]
    for call in both(lm, tokens, bad):
        refused(call, "block 0", "a tuple of 2 given", "ConvBlockState(cell, conv) expected")


def test_a_missing_cell_entry(lm, tokens, state):
    bad = replace(state, 0, cell=None)
    refused(lambda: lm.step(tokens[:, 0], bad), "block 0", "entry cell", "None given", "MLSTMState(C, n, m) expected")


def test_one_blocks_state_given_for_another(lm, tokens, state):
    for call in both(lm, tokens, state[::-1]):
        refused(call, "block 0 (pre_up)", "SLSTMState(c, n, m, h) given", "MLSTMState(C, n, m) expected")


def test_none_entries_are_those_blocks_zero_states(lm, tokens, state):
    """Not an error: None for one block is its zero state, in forward and in step alike."""
    with torch.no_grad():
        zero = lm.init_state(2)
        for call in ("forward", "step"):
            run = (lambda s: lm(tokens, s)) if call == "forward" else (lambda s: lm.step(tokens[:, 0], s))
            logits, _ = run((None, state[1]))
            expected, _ = run((zero[0], state[1]))
            assert torch.equal(logits, expected), call


def test_a_list_of_block_states_is_the_tuple(lm, tokens, state):
    with torch.no_grad():
        assert torch.equal(lm.step(tokens[:, 0], list(state))[0], lm.step(tokens[:, 0], state)[0])


def test_the_classifier_checks_its_states():
    model = build(load_recipe({"model": {"type": "classifier", "vocab_size": 9, "dim": 16,
                                         "stack": {"type": "xlstm", "ratio": "1:1", "num_blocks": 2}}})).eval()
    x = torch.randint(0, 9, (2, 4))
    refused(lambda: model(x, model.init_state(2)[:1]), "1 entry given", "2 blocks")
    refused(lambda: model.step(x[:, 0], model.init_state(1)), "(1, 4, 8, 8) given", "(2, 4, 8, 8) expected")


def test_the_7b_stack_step_checks_before_its_compiled_run():
    """The 7B blocks step the whole stack in one compiled call: the check comes first all the same."""
    model = build(load_recipe("xlstm_7b_small", ["dim=32", "vocab_size=17"])).eval()
    state = model.init_state(1)
    bad = (state[0]._replace(n=state[0].n[..., :-1]),) + state[1:]
    with torch.no_grad():
        refused(lambda: model.step(torch.zeros(1, dtype=torch.long), bad), "block 0 (mlstm_7b)", "entry n")
        refused(lambda: model.step(torch.zeros(1, dtype=torch.long), state[:-1]), "entries given")


def test_a_stack_called_directly_checks_too(lm, state):
    x = torch.randn(2, 5, 32)
    refused(lambda: lm.stack(x, state[:1]), "1 entry given")
    refused(lambda: lm.stack.step(x[:, 0], replace(state, 0, conv=state[0].conv[:, :1])), "entry conv")


def test_a_float64_model_takes_its_own_float64_states():
    """float64 states are allowed where the computation is float64 (gradchecks run so)."""
    model = build(load_recipe("xlstm_1_1", SMALL)).double().eval()
    tokens = torch.randint(0, 17, (2, 5))
    with torch.no_grad():
        _, state = model(tokens)
        assert state[0].cell.C.dtype == torch.float64
        logits, _ = model(tokens, state)
    assert torch.isfinite(logits).all()


class _PluginState(NamedTuple):
    h: torch.Tensor
    table: torch.Tensor  # no batch dimension: the same for every batch


class _PluginLikeCell(torch.nn.Module):
    def init_state(self, batch, device=None):
        return _PluginState(torch.zeros(batch, 6, device=device), torch.zeros(3, 2, device=device))


def test_a_third_party_state_is_checked_by_the_same_rule():
    spec = StateSpec(_PluginLikeCell().init_state)
    good = _PluginState(torch.zeros(5, 6), torch.zeros(3, 2))
    spec.check(good, batch=5, dtype=torch.float32, what="block 0 (plugin)")
    with pytest.raises(InputError, match=r"entry h: shape \(5, 7\) given, \(5, 6\) expected"):
        spec.check(good._replace(h=torch.zeros(5, 7)), batch=5, dtype=torch.float32, what="block 0 (plugin)")
    with pytest.raises(InputError, match=r"entry table: shape \(5, 3, 2\) given, \(3, 2\) expected"):
        spec.check(good._replace(table=torch.zeros(5, 3, 2)), batch=5, dtype=torch.float32, what="block 0 (plugin)")


def test_the_compiled_step_checks_before_its_graph(lm, tokens, state):
    """The check is left out of the compiled graph and runs before it: refused without compiling anything."""
    step = lm.compiled_step()
    refused(lambda: step(tokens[:, 0], state[:1]), "1 entry given")
    refused(lambda: step(tokens[:, 0], replace(state, 0, conv=state[0].conv[:, :2])), "entry conv")
