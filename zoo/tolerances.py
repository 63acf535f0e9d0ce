"""The one tolerance policy for numerical comparisons (docs/testing.md), shared by the test suite
and the conformance kit (:mod:`xlstm_zoo.testing`).

A comparison has a *kind* and a dtype:

- ``form``: two forms of the same maths at equal precision (chunkwise vs recurrent, a step loop vs
  the sequence, two halves vs the whole); only the order of the sums differs.
- ``kernel``: a kernel against the reference (``<op>.<form>--<impl>`` vs ``--reference``):
  another implementation, another rounding. In fp32 judged relative to the tensor's scale
  (``max |expected|``): gradients and states span orders of magnitude, and one element of a sum
  with cancellation (a tiled ``tl.dot``) may carry a larger relative error than the tensor as a
  whole; elementwise in float64 and the half precisions.
- ``module``: a module-level comparison (cells, blocks, models; the conformance kit): a few
  roundings per op accumulate, so the kernel bound in fp32.
- ``interop``: a converted model against the library it came from (Hugging Face Llama, Mamba) in
  fp32, relative to the logits' scale.

``assert_close(actual, expected, kind=..., what=...)`` raises an ``AssertionError`` naming
``what``, how many elements differ, the worst one and the bound. float64 gradient checks use
:data:`GRADCHECK` (``torch.autograd.gradcheck`` keyword arguments).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GRADCHECK", "KINDS", "TOLERANCES", "Tolerance", "assert_close", "tolerance"]


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol * scale + rtol * |expected|`` elementwise, where ``scale`` is
    ``max |expected|`` when ``scaled`` and 1 otherwise."""

    rtol: float
    atol: float
    scaled: bool = False

    def describe(self) -> str:
        atol = f"{self.atol:g} * max|expected|" if self.scaled else f"{self.atol:g}"
        return f"|difference| <= {atol} + {self.rtol:g} * |expected|"


HALF = (torch.bfloat16, torch.float16)
TOLERANCES: dict[tuple[str, torch.dtype], Tolerance] = {
    # Equal-precision forms. float64: pure rounding (measured <= 1e-12 between the mLSTM forms).
    ("form", torch.float64): Tolerance(rtol=1e-9, atol=1e-10),
    ("form", torch.float32): Tolerance(rtol=1e-5, atol=1e-5),
    # Kernels vs the reference. float64: the CPU kernels differ from it by ~1e-14 (measured).
    ("kernel", torch.float64): Tolerance(rtol=1e-12, atol=1e-12),
    ("kernel", torch.float32): Tolerance(rtol=0.0, atol=1e-4, scaled=True),
    **{("kernel", d): Tolerance(rtol=2e-2, atol=2e-2) for d in HALF},
    ("module", torch.float32): Tolerance(rtol=1e-4, atol=1e-4),
    # Another library's model on the same weights (a converted Hugging Face Llama or Mamba): logits within
    # 1e-5 of their scale in fp32 (measured: docs/pretrained.md).
    ("interop", torch.float32): Tolerance(rtol=0.0, atol=1e-5, scaled=True),
}
KINDS = tuple(dict.fromkeys(kind for kind, _ in TOLERANCES))
# float64 gradient checks (torch.autograd.gradcheck keyword arguments): the conformance kit's.
GRADCHECK = dict(eps=1e-6, atol=1e-6, rtol=1e-4)


def tolerance(kind: str, dtype: torch.dtype) -> Tolerance:
    """The bound for a comparison of ``kind`` in ``dtype`` (the lower precision of the two sides)."""
    try:
        return TOLERANCES[(kind, dtype)]
    except KeyError:
        known = ", ".join(f"{k}/{str(d).removeprefix('torch.')}" for k, d in TOLERANCES)
        raise ValueError(f"no tolerance for kind {kind!r} in {dtype}; known: {known}") from None


def _precision(actual: torch.Tensor, expected: torch.Tensor) -> torch.dtype:
    """The lower precision of the two (a bf16 kernel output judged against an fp32 reference is bf16)."""
    order = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    dtypes = [d for d in (actual.dtype, expected.dtype) if d in order]
    return max(dtypes, key=order.index) if dtypes else torch.float64


def assert_close(actual, expected, *, kind: str, what: str, dtype: torch.dtype | None = None,
                 check_dtype: bool = False) -> None:
    """``actual`` equals ``expected`` within the policy's bound for ``kind`` (and ``dtype``, by default
    the lower precision of the two). Shapes must match; NaN fails, equal infinities pass. The message
    names ``what``, the number of differing elements, the worst one and the bound."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        raise AssertionError(f"{what}: expected tensors, got {type(actual).__name__} and {type(expected).__name__}")
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if check_dtype and actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtypes differ: {actual.dtype} vs {expected.dtype}")
    precision = dtype or _precision(actual, expected)
    tol = tolerance(kind, precision)
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    finite = torch.isfinite(e)
    scale = (e[finite].abs().max().item() if finite.any() else 0.0) if tol.scaled else 1.0
    diff = (a - e).abs()
    allowed = tol.atol * scale + tol.rtol * e.abs()
    bad = ~((a == e) | (diff <= allowed))  # a == e: equal infinities; NaN is never equal, never within
    if bad.any():
        excess = torch.where(bad, torch.nan_to_num(diff - allowed, nan=float("inf")), torch.zeros_like(diff))
        index = tuple(int(i) for i in torch.unravel_index(excess.flatten().argmax(), excess.shape))
        scale_note = f", max|expected| = {scale:.6g}" if tol.scaled else ""
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements differ ({kind} tolerance, "
            f"{str(precision).removeprefix('torch.')}); worst at index {index}: "
            f"{a[index].item():.10g} vs {e[index].item():.10g}, difference {diff[index].item():.3g} "
            f"(allowed {tol.describe()}{scale_note})")
