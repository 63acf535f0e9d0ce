"""The tolerance policy (xlstm_zoo.tolerances): its bounds, its scale-relative kernel bound, its messages."""

import pytest
import torch

from xlstm_zoo.tolerances import TOLERANCES, assert_close, tolerance


def test_the_documented_bounds():
    """docs/testing.md: equal-precision forms fp32 1e-5; kernels vs reference fp32 1e-4; bf16 2e-2."""
    assert (tolerance("form", torch.float32).rtol, tolerance("form", torch.float32).atol) == (1e-5, 1e-5)
    fp32_kernel = tolerance("kernel", torch.float32)
    assert fp32_kernel.scaled and fp32_kernel.atol == 1e-4 and fp32_kernel.rtol == 0
    assert all(tolerance("kernel", d).rtol == 2e-2 for d in (torch.bfloat16, torch.float16))
    # float64 is never looser than fp32 for the same kind
    for kind in ("form", "kernel"):
        assert tolerance(kind, torch.float64).atol < tolerance(kind, torch.float32).atol


def test_an_unknown_kind_or_dtype_names_the_known_ones():
    with pytest.raises(ValueError, match=r"no tolerance for kind 'gradient'.*known: form/float64"):
        tolerance("gradient", torch.float32)
    with pytest.raises(ValueError, match="no tolerance for kind 'module' in torch.float16"):
        tolerance("module", torch.float16)
    assert ("module", torch.float32) in TOLERANCES


def test_the_message_names_what_differed_and_the_bound():
    expected = torch.zeros(4)
    actual = torch.tensor([0.0, 0.0, 1e-3, 0.0])
    with pytest.raises(AssertionError) as err:
        assert_close(actual, expected, kind="form", what="final n")
    message = str(err.value)
    assert message.startswith("final n: 1 of 4 elements differ (form tolerance, float32); worst at index (2,)")
    assert "allowed |difference| <= 1e-05 + 1e-05 * |expected|" in message


def test_the_fp32_kernel_bound_is_relative_to_the_tensor_scale():
    expected = torch.tensor([1000.0, 1.0])
    assert_close(expected + torch.tensor([0.0, 0.05]), expected, kind="kernel", what="g")  # 0.05 <= 1e-4 * 1000
    with pytest.raises(AssertionError, match=r"max\|expected\| = 1000"):
        assert_close(expected + torch.tensor([0.0, 0.2]), expected, kind="kernel", what="g")


def test_precision_is_the_lower_of_the_two_and_shapes_nan_and_infinities_are_checked():
    ref = torch.linspace(-1, 1, 9)
    assert_close(ref.bfloat16(), ref, kind="kernel", what="h")  # judged as bf16: within 2e-2
    with pytest.raises(AssertionError, match="bfloat16"):
        assert_close((ref + 0.1).bfloat16(), ref, kind="kernel", what="h")
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close(ref[:3], ref, kind="form", what="h")
    with pytest.raises(AssertionError, match="dtypes differ"):
        assert_close(ref.double(), ref, kind="form", what="h", check_dtype=True)
    with pytest.raises(AssertionError, match="1 of 9 elements differ"):
        assert_close(torch.where(ref > 0.9, float("nan"), ref), ref, kind="form", what="h")
    inf = torch.tensor([float("-inf"), 1.0])
    assert_close(inf.clone(), inf, kind="form", what="m")  # equal infinities pass (the zero sLSTM state)
