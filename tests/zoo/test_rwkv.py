"""RWKV-4 cells (zoo/cells/rwkv.py): the WKV recurrence against transformers' own CPU loop, the two
forms against each other, extreme inputs; the cell contract itself runs registry-wide
(tests/zoo/test_components.py)."""

import pytest
import torch

from xlstm_zoo.cells.rwkv import EMPTY_EXPONENT, wkv_chunkwise, wkv_recurrent
from xlstm_zoo.tolerances import assert_close

hf_rwkv = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")


def _inputs(B=3, T=37, C=8, scale=3.0, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, T, C, generator=g, dtype=dtype) * scale
    v = torch.randn(B, T, C, generator=g, dtype=dtype)
    decay, bonus = torch.randn(C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)
    zero = torch.zeros(B, C, dtype=dtype)
    return decay, bonus, k, v, (zero, zero.clone(), torch.full_like(zero, EMPTY_EXPONENT))


def test_recurrent_wkv_equals_transformers_cpu_loop_bit_for_bit():
    decay, bonus, k, v, state = _inputs()
    expected, (num, den, m) = hf_rwkv.rwkv_linear_attention_cpu(decay, bonus, k, v, return_state=True)
    y, our_num, our_den, our_m = wkv_recurrent(-torch.exp(decay), bonus, k, v, *state)
    assert torch.equal(y, expected)
    assert torch.equal(our_num, num) and torch.equal(our_den, den) and torch.equal(our_m, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", [1, 4, 16, 64])  # 37 tokens: full chunks and a rest, or one short chunk
def test_chunkwise_equals_recurrent(dtype, chunk):
    decay, bonus, k, v, state = _inputs(dtype=dtype)
    w = -torch.exp(decay)
    y_rec, *s_rec = wkv_recurrent(w, bonus, k, v, *state)
    y_chunk, *s_chunk = wkv_chunkwise(w, bonus, k, v, *state, chunk=chunk)
    assert_close(y_chunk, y_rec, kind="form", what=f"wkv chunk={chunk}")
    # the state's exponent may differ in the last bits; the state's value num * e^m may not
    num_rec, den_rec, m_rec = s_rec
    num_chunk, den_chunk, m_chunk = s_chunk
    assert_close(m_chunk, m_rec, kind="form", what="exponent")
    assert_close(num_chunk * torch.exp(m_chunk - m_rec), num_rec, kind="form", what="numerator")
    assert_close(den_chunk * torch.exp(m_chunk - m_rec), den_rec, kind="form", what="denominator")
    # and the carried state continues alike
    decay2, bonus2, k2, v2, _ = _inputs(T=9, dtype=dtype, seed=1)
    y2_rec = wkv_recurrent(w, bonus, k2, v2, *s_rec)[0]
    y2_chunk = wkv_chunkwise(w, bonus, k2, v2, *s_chunk, chunk=chunk)[0]
    assert_close(y2_chunk, y2_rec, kind="form", what="continued")


@pytest.mark.parametrize("form", ["recurrent", "chunkwise"])
def test_extreme_keys_stay_finite_and_pick_the_largest(form):
    """Keys of +-1e4 overflow any unstabilised exponential; the stabilised forms give the value of the
    dominant token (a weighted average of values stays within their range)."""
    decay, bonus, k, v, state = _inputs(T=20, scale=1e4)
    w = -torch.exp(decay)
    run = wkv_recurrent if form == "recurrent" else (lambda *a: wkv_chunkwise(*a, chunk=8))
    y, num, den, m = run(w, bonus, k, v, *state)
    assert torch.isfinite(y).all() and torch.isfinite(num).all() and torch.isfinite(den).all()
    assert (y.abs() <= v.abs().amax(1, keepdim=True) + 1e-5).all()
    expected = hf_rwkv.rwkv_linear_attention_cpu(decay, bonus, k, v)[0]
    assert_close(y, expected, kind="form", what=f"{form} at extreme keys")


def test_compiled_forward_equals_the_recurrent_form_and_leaves_the_state_alone():
    from xlstm_zoo.backends.cpp.build import unavailable_reason
    from xlstm_zoo.backends.cpp.rwkv import wkv_forward, wkv_kernel_applies

    if unavailable_reason() is not None:
        pytest.skip(f"C++ kernels unavailable: {unavailable_reason()}")
    decay, bonus, k, v, state = _inputs(T=50)
    w = -torch.exp(decay)
    _, *after = wkv_recurrent(w, bonus, k[:, :13], v[:, :13], *state)  # a non-empty start
    before = [s.clone() for s in after]
    with torch.no_grad():
        assert wkv_kernel_applies(w, bonus, k, v, *after)
        got = wkv_forward(w, bonus, k, v, *after)
    expected = wkv_recurrent(w, bonus, k, v, *after)
    for name, g, e in zip(("wkv", "num", "den", "m"), got, expected):
        assert_close(g, e, kind="kernel", what=f"compiled {name}")
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert not wkv_kernel_applies(w.requires_grad_(), bonus, k, v, *after)  # training stays on autograd


def test_cell_runs_the_compiled_pass_only_without_gradients(monkeypatch):
    from xlstm_zoo.backends.cpp.build import unavailable_reason
    from xlstm_zoo.cells import rwkv as rwkv_cells
    from xlstm_zoo.config import BuildContext

    if unavailable_reason() is not None:
        pytest.skip(f"C++ kernels unavailable: {unavailable_reason()}")
    calls = []
    monkeypatch.setattr(rwkv_cells, "wkv_forward", lambda *a: calls.append(1) or rwkv_cells.wkv_recurrent(*a))
    cell = rwkv_cells.RWKVTimeMix(rwkv_cells.RWKVConfig(), BuildContext(dim=16))
    x = torch.randn(2, 9, 16)
    cell(x)
    assert calls == []
    with torch.no_grad():
        cell(x)
    assert calls == [1]
