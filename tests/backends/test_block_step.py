"""The xLSTM-7B block's compiled generation step (``backends/cpp/block_step.cpp``): equal to the block's
eager step (the modules, everything on the reference backend) to float32 rounding, over several tokens and
block variants; used exactly when it serves the call; clear errors; weights updated in place or replaced
between steps are seen."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.backends import MLSTMState
from xlstm_zoo.backends.block_step import serves
from xlstm_zoo.backends.cpp import build as cpp_build
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(cpp_build.unavailable_reason() is not None, reason="needs the C++ kernels built")

DIM = 64
VARIANTS = {
    "7b": [],
    "biases": ["stack.blocks.m.bias=true", "stack.blocks.m.cell.bias=true", "stack.blocks.m.norm.bias=true",
               "stack.blocks.m.mlp_norm.bias=true", "stack.blocks.m.cell.norm.bias=true", "stack.blocks.m.mlp.bias=true"],
    "no_softcap_gelu": ["stack.blocks.m.cell.input_gate.softcap=null", "stack.blocks.m.cell.forget_gate.softcap=null",
                        "stack.blocks.m.mlp.activation=gelu"],
    "sigmoid_input_exp_forget": ["stack.blocks.m.cell.input_gate.type=sigmoid",
                                 "stack.blocks.m.cell.forget_gate.type=exponential"],
    "qk_full_width": ["stack.blocks.m.cell.qk_dim_factor=1.0", "stack.blocks.m.cell.num_heads=2"],
}


def model(*overrides, seed=0):
    torch.manual_seed(seed)
    m = build(load_recipe("xlstm_7b_small", [f"dim={DIM}", "stack.pattern=mm", *overrides])).eval()
    with torch.no_grad():  # the gates' projections start at zero: make them matter
        for name, p in m.named_parameters():
            if "gate.proj" in name or name.endswith("bias"):
                p.normal_(0.0, 0.3)
    return m


def eager_step(block, x, state, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setenv(ENV_FORCE, "reference")
        assert not serves([block], x, [state])
        return block.step(x, state)


def prefilled_state(m, batch):
    tokens = torch.randint(0, m.config.vocab_size, (batch, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return m(tokens)[1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_block_step_equals_the_eager_step_over_tokens(variant, batch, monkeypatch):
    m = model(*VARIANTS[variant])
    block = m.stack.blocks[1]
    state = prefilled_state(m, batch)[1]
    compiled_state, eager_state = state, state
    with torch.no_grad():
        for t in range(4):
            x = torch.randn(batch, DIM, generator=torch.Generator().manual_seed(10 + t)) * 2
            assert serves([block], x, [compiled_state])
            y, compiled_state = block.step(x, compiled_state)
            y_eager, eager_state = eager_step(block, x, eager_state, monkeypatch)
            assert_close(y, y_eager, kind="kernel", what=f"y at token {t}", dtype=torch.float32)
            for name, a, e in zip("Cnm", compiled_state, eager_state):
                assert_close(a, e, kind="kernel", what=f"{name} at token {t}", dtype=torch.float32)


def test_model_step_from_the_zero_state_equals_the_reference(monkeypatch):
    m = model()
    token = torch.tensor([3, 7])
    with torch.no_grad():
        logits, state = m.step(token, None)
        with monkeypatch.context() as patch:
            patch.setenv(ENV_FORCE, "reference")
            ref_logits, ref_state = m.step(token, None)
    assert_close(logits, ref_logits, kind="kernel", what="logits", dtype=torch.float32)
    for got, want in zip(state, ref_state):
        for a, e in zip(got, want):
            assert_close(a, e, kind="kernel", what="state", dtype=torch.float32)


def kernel_runs(monkeypatch) -> list[int]:
    """The number of blocks in each call of the blocks' compiled entry, from now on."""
    from xlstm_zoo.backends.cpp import block_step
    runs, real = [], block_step.library()

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def xlstm_zoo_mlstm7b_blocks_step_f32(self, args, count):
            runs.append(count)
            return real.xlstm_zoo_mlstm7b_blocks_step_f32(args, count)

    monkeypatch.setattr(block_step, "library", lambda: Counting())
    return runs


def test_a_stacks_blocks_step_in_one_call_bit_for_bit(monkeypatch):
    """Stack.step hands a run of 7B blocks to MLSTM7BBlock.step_run: one compiled call for all of them, the
    same bits as a call per block. A block the kernel does not serve sends the whole run back to per-block
    steps."""
    m = model("stack.pattern=mmm")
    state = prefilled_state(m, 3)
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(4))
    runs = kernel_runs(monkeypatch)
    with torch.no_grad():
        y, new_state = m.stack.step(x, state)
        assert runs == [3]
        block_by_block, expected_state = x, []
        for block, block_state in zip(m.stack.blocks, state):
            block_by_block, block_state = block.step(block_by_block, block_state)
            expected_state.append(block_state)
        assert torch.equal(y, m.stack.post_norm(block_by_block))
        assert all(torch.equal(a, b) for got, want in zip(new_state, expected_state) for a, b in zip(got, want))

        m.stack.blocks[2].mlp_norm = torch.nn.LayerNorm(DIM)  # a part the kernel does not compute
        runs.clear()
        y_mixed, _ = m.stack.step(x, state)
        assert runs == [1, 1]  # no run of three: blocks 0 and 1 each a call of their own, block 2 eager
        h = x
        for block, block_state in zip(m.stack.blocks, state):  # blocks 0 and 1 through their kernels, 2 eagerly
            h, _ = block.step(h, block_state)
    assert torch.equal(y_mixed, m.stack.post_norm(h))


def test_steps_without_gradients_reuse_a_prepared_run_bit_for_bit(monkeypatch):
    """Without gradients a stack's blocks step through the run prepared at the first such step (no weights
    gathered from the modules): the same bits as the checked path, which a step with gradients enabled
    (and none wanted by the parameters) takes. Weights swapped under it are seen."""
    from xlstm_zoo.backends.cpp.block_step import PreparedRun
    m = model("stack.pattern=mmm").requires_grad_(False)
    state = prefilled_state(m, 2)
    token = torch.tensor([3, 5])
    prepared = []
    real_prepare = PreparedRun.prepare.__func__
    monkeypatch.setattr(PreparedRun, "prepare", classmethod(lambda cls, *a: prepared.append(1) or real_prepare(cls, *a)))
    with torch.no_grad():
        first = m.step(token, state)
        again = m.step(token, state)
    with torch.enable_grad():
        checked = m.step(token, state)
    assert prepared == [1]  # prepared once, reused by the second step
    for got in (again, checked):
        assert torch.equal(got[0], first[0])
        assert all(torch.equal(a, b) for s1, s2 in zip(got[1], first[1]) for a, b in zip(s1, s2))
    block = m.stack.blocks[1]
    with torch.no_grad():
        block.mlp.down.weight.data = block.mlp.down.weight.data * 2.0  # a new storage under the same Parameter
        swapped = m.step(token, state)
        m.double().float()  # every weight through a new storage and back
        round_trip = m.step(token, state)
    with torch.enable_grad():
        checked_swapped = m.step(token, state)
    assert not torch.allclose(swapped[0], first[0])
    assert torch.equal(swapped[0], checked_swapped[0]) and torch.equal(round_trip[0], checked_swapped[0])
    assert len(prepared) == 3


def test_the_checked_path_after_a_prepared_run_uses_its_own_weights():
    """A block's kernel serves both paths: weights W1 on the checked path, W2 through a prepared run, then W1
    again on the checked path must compute with W1 (it once reused the prepared run's arguments)."""
    m = model().requires_grad_(False)
    state = prefilled_state(m, 2)
    token = torch.tensor([3, 5])
    weight = m.stack.blocks[0].mlp.down.weight
    original = weight.data
    with torch.enable_grad():
        first = m.step(token, state)[0]
    with torch.no_grad():
        weight.data = original * 2.0
        doubled = m.step(token, state)[0]
        weight.data = original
    with torch.enable_grad():
        again = m.step(token, state)[0]
    assert not torch.equal(doubled, first)
    assert torch.equal(again, first)


def test_the_state_passed_in_is_not_modified():
    m = model()
    state = prefilled_state(m, 2)[0]
    before = [t.clone() for t in state]
    with torch.no_grad():
        m.stack.blocks[0].step(torch.randn(2, DIM), state)
    assert all(torch.equal(a, b) for a, b in zip(state, before))


def test_in_place_weight_updates_and_replaced_weights_are_seen(monkeypatch):
    m = model()
    block = m.stack.blocks[0]
    state = prefilled_state(m, 2)[0]
    x = torch.randn(2, DIM)
    with torch.no_grad():
        first, _ = block.step(x, state)
        block.mlp.down.weight.mul_(2.0)                                        # same storage
        block.cell.q.weight = torch.nn.Parameter(block.cell.q.weight * 0.5)    # a new tensor
        block.out_proj.weight = torch.nn.Parameter(torch.randn(DIM, 2 * DIM)[:, ::2])  # not contiguous
        second, _ = block.step(x, state)
        expected, _ = eager_step(block, x, state, monkeypatch)
        block.out_proj.weight.mul_(3.0)  # a copy of a strided weight would miss this
        third, _ = block.step(x, state)
        expected_third, _ = eager_step(block, x, state, monkeypatch)
    assert not torch.allclose(first, second)
    assert_close(second, expected, kind="kernel", what="y after the weight changes", dtype=torch.float32)
    assert_close(third, expected_third, kind="kernel", what="y after a strided weight changed", dtype=torch.float32)


def test_a_model_that_has_stepped_can_be_copied_and_saved(monkeypatch):
    # The kernels' prepared arguments hold raw pointers, which ctypes cannot pickle: copy.deepcopy and
    # torch.save of the whole model failed after its first step. A copy prepares itself at its own first step.
    m = model()
    state = prefilled_state(m, 2)
    token = torch.tensor([3, 5])
    with torch.no_grad():
        first, _ = m.step(token, state)
        twin = copy.deepcopy(m)
        buffer = io.BytesIO()
        torch.save(m, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert torch.equal(twin.step(token, state)[0], first)
        assert torch.equal(loaded.step(token, state)[0], first)
        twin.stack.blocks[0].mlp.down.weight.mul_(2.0)  # the copy steps with its own weights ...
        changed, _ = twin.step(token, state)
        assert torch.equal(m.step(token, state)[0], first)  # ... and the original with its own
        expected = twin.stack.post_norm(eager_step(twin.stack.blocks[1], eager_step(
            twin.stack.blocks[0], twin.embedding(token), state[0], monkeypatch)[0], state[1], monkeypatch)[0])
    assert not torch.allclose(changed, first)
    assert_close(changed, twin._logits(expected), kind="kernel", what="the copy's logits", dtype=torch.float32)


def test_the_eager_path_serves_what_the_kernel_does_not(monkeypatch):
    x = torch.randn(2, DIM)
    block = model().stack.blocks[0]
    state = block.init_state(2)
    with torch.no_grad():
        assert serves([block], x, [state])
        assert not serves([block], x.double(), [state])                        # not float32
        assert not serves([block], x[None], [state])                           # a sequence, not a step
        monkeypatch.setenv(ENV_FORCE, "reference")
        assert not serves([block], x, [state])                                 # a forced backend
        monkeypatch.delenv(ENV_FORCE)
    assert not serves([block], x, [state])                                     # gradients wanted
    for overrides in (["stack.blocks.m.cell.proj=blockdiag"], ["stack.blocks.m.norm.type=layernorm"],
                      ["stack.blocks.m.cell.backend=reference"], ["stack.blocks.m.cell.input_gate.proj=headwise"]):
        other = model(*overrides).stack.blocks[0]
        with torch.no_grad():
            assert not serves([other], x, [other.init_state(2)]), overrides
            y, _ = other.step(x, other.init_state(2))  # and the eager step still runs
        assert y.shape == x.shape


def test_a_bad_state_is_named():
    block = model().stack.blocks[0]
    x = torch.randn(2, DIM)
    C, n, m = block.init_state(2)
    with torch.no_grad(), pytest.raises(ValueError, match=r"mlstm7b_block_step: n is torch.float32 \(2, 3\).*expected"):
        block.step(x, MLSTMState(C, torch.zeros(2, 3), m))


def test_one_thread_and_two_give_the_same_bits():
    # Each output panel and each (batch, head) row is one thread's work: the split changes no sum.
    m = model("stack.blocks.m.mlp.proj_factor=12")  # wide enough to split over threads
    block = m.stack.blocks[0]
    state = prefilled_state(m, 5)[0]
    x = torch.randn(5, DIM, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            one = block.step(x, state)
            torch.set_num_threads(2)
            two = block.step(x, state)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and all(torch.equal(a, b) for a, b in zip(one[1], two[1]))


def test_the_compiled_model_step_runs_the_block_kernel_outside_the_graph(monkeypatch):
    """Under torch.compile (``compiled_step()``) the stack's blocks step through their kernel behind a graph
    break, not a trace of their modules; the result equals the eager step."""
    m = model()
    runs = kernel_runs(monkeypatch)
    state = prefilled_state(m, 2)
    token = torch.tensor([3, 7])
    with torch.no_grad():
        eager_logits, eager_state = m.step(token, state)
        runs.clear()
        compiled_logits, compiled_state = m.compiled_step()(token, state)
    assert runs == [len(m.stack.blocks)]  # every block through the kernel at run time, all in one call
    assert_close(compiled_logits, eager_logits, kind="kernel", what="logits", dtype=torch.float32)
    for got, want in zip(compiled_state, eager_state):
        for a, e in zip(got, want):
            assert_close(a, e, kind="kernel", what="state", dtype=torch.float32)
