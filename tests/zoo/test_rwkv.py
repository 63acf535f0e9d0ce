"""RWKV-4's WKV recurrence (the ``rwkv_wkv`` op, backends/reference/rwkv.py, backends/cpp/rwkv.py) against
transformers' own CPU loop, the two forms against each other, extreme inputs, the compiled pass; the
cell's route through the op. The cell contract itself runs registry-wide (tests/zoo/test_components.py);
every kernel of the op against the textbook sums: tests/backends/test_kernel_parity.py."""

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp.build import unavailable_reason
from xlstm_zoo.backends.reference.rwkv import rwkv_wkv_sequence
from xlstm_zoo.backends.states import WKVState
from xlstm_zoo.tolerances import assert_close

hf_rwkv = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")
needs_cpp = pytest.mark.skipif(unavailable_reason() is not None,
                               reason=f"C++ kernels unavailable: {unavailable_reason()}")


def _inputs(B=3, T=37, C=8, scale=3.0, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, T, C, generator=g, dtype=dtype) * scale
    v = torch.randn(B, T, C, generator=g, dtype=dtype)
    decay, bonus = torch.randn(C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)
    return decay, bonus, k, v, WKVState.zeros(B, C, dtype=dtype)


def test_recurrent_wkv_equals_transformers_cpu_loop_bit_for_bit():
    decay, bonus, k, v, state = _inputs()
    expected, (num, den, m) = hf_rwkv.rwkv_linear_attention_cpu(decay, bonus, k, v, return_state=True)
    y, (our_num, our_den, our_m) = rwkv_wkv_sequence(k, v, -torch.exp(decay), bonus, state, form="recurrent")
    assert torch.equal(y, expected)
    assert torch.equal(our_num, num) and torch.equal(our_den, den) and torch.equal(our_m, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", [1, 4, 16, 64])  # 37 tokens: full chunks and a rest, or one short chunk
def test_chunkwise_equals_recurrent(dtype, chunk):
    decay, bonus, k, v, state = _inputs(dtype=dtype)
    w = -torch.exp(decay)
    y_rec, s_rec = rwkv_wkv_sequence(k, v, w, bonus, state, form="recurrent")
    y_chunk, s_chunk = rwkv_wkv_sequence(k, v, w, bonus, state, form="chunkwise", chunk_size=chunk)
    assert_close(y_chunk, y_rec, kind="form", what=f"wkv chunk={chunk}")
    # the state's exponent may differ in the last bits; the state's value num * e^m may not
    assert_close(s_chunk.m, s_rec.m, kind="form", what="exponent")
    assert_close(s_chunk.num * torch.exp(s_chunk.m - s_rec.m), s_rec.num, kind="form", what="numerator")
    assert_close(s_chunk.den * torch.exp(s_chunk.m - s_rec.m), s_rec.den, kind="form", what="denominator")
    # and the carried state continues alike
    decay2, bonus2, k2, v2, _ = _inputs(T=9, dtype=dtype, seed=1)
    y2_rec = rwkv_wkv_sequence(k2, v2, w, bonus, s_rec, form="recurrent")[0]
    y2_chunk = rwkv_wkv_sequence(k2, v2, w, bonus, s_chunk, form="chunkwise", chunk_size=chunk)[0]
    assert_close(y2_chunk, y2_rec, kind="form", what="continued")


@pytest.mark.parametrize("form", ["recurrent", "chunkwise"])
def test_extreme_keys_stay_finite_and_pick_the_largest(form):
    """Keys of +-1e4 overflow any unstabilised exponential; the stabilised forms give the value of the
    dominant token (a weighted average of values stays within their range)."""
    decay, bonus, k, v, state = _inputs(T=20, scale=1e4)
    y, (num, den, m) = rwkv_wkv_sequence(k, v, -torch.exp(decay), bonus, state, form=form, chunk_size=8)
    assert torch.isfinite(y).all() and torch.isfinite(num).all() and torch.isfinite(den).all()
    assert (y.abs() <= v.abs().amax(1, keepdim=True) + 1e-5).all()
    expected = hf_rwkv.rwkv_linear_attention_cpu(decay, bonus, k, v)[0]
    assert_close(y, expected, kind="form", what=f"{form} at extreme keys")


@needs_cpp
def test_compiled_pass_equals_the_recurrent_form_and_leaves_the_state_alone():
    from xlstm_zoo.backends.cpp.rwkv import rwkv_wkv_sequence as compiled

    decay, bonus, k, v, state = _inputs(T=50)
    w = -torch.exp(decay)
    _, after = rwkv_wkv_sequence(k[:, :13], v[:, :13], w, bonus, state, form="recurrent")  # a non-empty start
    before = [s.clone() for s in after]
    with torch.no_grad():
        got_y, got_state = compiled(k, v, w, bonus, after)
    want_y, want_state = rwkv_wkv_sequence(k, v, w, bonus, after, form="recurrent")
    for name, g, e in zip(("wkv", "num", "den", "m"), (got_y, *got_state), (want_y, *want_state)):
        assert_close(g, e, kind="kernel", what=f"compiled {name}")
    assert all(torch.equal(a, b) for a, b in zip(after, before))


@needs_cpp
def test_cell_runs_the_compiled_kernel_both_ways_unless_forced(monkeypatch):
    """The dispatcher picks the compiled kernel for the cell's float32 CPU call, with autograd (its forward and
    its own backward) and without; the cell's gradients equal those with the reference backend forced, which
    keeps the compiled kernel away."""
    from xlstm_zoo.backends.cpp.build import library
    from xlstm_zoo.cells.rwkv import RWKVConfig, RWKVTimeMix
    from xlstm_zoo.config import BuildContext

    lib, calls = library(), []
    for way in ("forward", "backward"):
        entry = getattr(lib, f"xlstm_zoo_rwkv_wkv_{way}_f32")
        monkeypatch.setattr(lib, f"xlstm_zoo_rwkv_wkv_{way}_f32",
                            lambda *a, way=way, entry=entry: calls.append(way) or entry(*a))
    cell = RWKVTimeMix(RWKVConfig(), BuildContext(dim=16))
    x = torch.randn(2, 9, 16)

    def gradients():
        cell.zero_grad(set_to_none=True)
        y = cell(x)[0]
        y.pow(2).sum().backward()
        return y, [p.grad for p in cell.parameters()]

    y_grad, compiled = gradients()
    assert calls == ["forward", "backward"]
    with torch.no_grad():
        y = cell(x)[0]
    assert calls == ["forward", "backward", "forward"]
    assert_close(y, y_grad, kind="kernel", what="cell output, without vs with autograd")
    monkeypatch.setenv("XLSTM_ZOO_BACKEND", "reference")
    y_reference, reference = gradients()
    assert len(calls) == 3
    assert_close(y_grad, y_reference, kind="kernel", what="cell output, compiled vs reference")
    for (name, _), a, e in zip(cell.named_parameters(), compiled, reference):
        assert_close(a, e, kind="kernel", what=f"cell gradient of {name}, compiled vs reference")


def test_op_names_bad_input_and_passes_an_empty_sequence():
    decay, bonus, k, v, state = _inputs(T=5)
    w = -torch.exp(decay)
    with pytest.raises(ValueError, match=r"rwkv_wkv_sequence: k \(3, 5, 8\), v \(3, 5, 8\), w \(7,\)"):
        ops.rwkv_wkv_sequence(k, v, w[:7], bonus)
    with pytest.raises(ValueError, match="unknown WKV form 'parallel'; allowed: recurrent, chunkwise"):
        ops.rwkv_wkv_sequence(k, v, w, bonus, form="parallel")
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got 0"):
        ops.rwkv_wkv_sequence(k, v, w, bonus, chunk_size=0)
    _, after = ops.rwkv_wkv_sequence(k, v, w, bonus, state)
    y, passed = ops.rwkv_wkv_sequence(k[:, :0], v[:, :0], w, bonus, after)
    assert y.shape == (3, 0, 8) and all(torch.equal(a, b) and a is not b for a, b in zip(passed, after))
