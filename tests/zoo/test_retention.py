"""RetNet retention (zoo/cells/retention.py) against references written without it: flash-linear-attention's
naive retention (fla, a test-only dependency) for the decayed sum, and a float64 transcription of the
RetNet paper's recurrent form (absolute positions, complex rotations, GroupNorm, swish gate) for the
whole cell. The three forms against each other. The cell contract runs registry-wide."""

import pytest
import torch
import torch.nn.functional as F

from xlstm_zoo.cells.retention import RetentionCell, RetentionConfig, head_decays, retention_chunk
from xlstm_zoo.config import BuildContext
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tolerances import assert_close


def _cell(form="chunkwise", chunk_size=4, dim=16, heads=2, seed=0, **extra):
    torch.manual_seed(seed)
    cell = RetentionCell(RetentionConfig(num_heads=heads, form=form, chunk_size=chunk_size, **extra), BuildContext(dim=dim))
    with torch.no_grad():  # a norm with a non-trivial affine map
        for p in cell.norm.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return cell


def test_decayed_sum_equals_fla_naive_retention():
    naive = pytest.importorskip("fla.ops.retention.naive").naive_retention
    g = torch.Generator().manual_seed(0)
    B, H, T, dk, dv = 2, 4, 23, 8, 16
    q, k = torch.randn(B, H, T, dk, generator=g), torch.randn(B, H, T, dk, generator=g)
    v = torch.randn(B, H, T, dv, generator=g)
    expected = naive(q, k, v)                      # fla scales q by dk^-1/2; no rotation (angles 0)
    log_gamma = torch.log(head_decays(H)).float()
    o, _ = retention_chunk(q, k * dk ** -0.5, v, torch.zeros(B, H, dk, dv), log_gamma, torch.zeros(dk))
    assert_close(o, expected, kind="form", what="retention vs fla naive_retention")


def paper_recurrent(cell: RetentionCell, x: torch.Tensor) -> torch.Tensor:
    """The RetNet paper's recurrent retention in float64, from the cell's weights only: rotations as complex
    numbers e^{i n theta} at absolute positions n = 0, 1, ..., S_n = gamma S_{n-1} + K_n^T V_n, O_n = Q_n S_n."""
    W = {name: p.detach().double() for name, p in cell.named_parameters()}
    x = x.double()
    B, T, D = x.shape
    H, dk = cell.num_heads, D // cell.num_heads
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    theta = 1.0 / 10000 ** torch.linspace(0, 1, dk // 2, dtype=torch.float64)

    def heads(t):
        return t.reshape(B, T, H, -1)

    def turn(t, n):  # consecutive feature pairs as complex numbers, times e^{i n theta}
        z = torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2).contiguous()) * torch.exp(1j * n * theta)
        return torch.view_as_real(z).flatten(-2)

    q, k, v = heads(x @ W["q.weight"].T), heads(x @ W["k.weight"].T) / dk ** 0.5, heads(x @ W["v.weight"].T)
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=torch.complex128)
    outs = []
    for n in range(T):
        qn, kn = turn(q[:, n], n), turn(k[:, n], n)
        S = gamma[:, None, None] * S + kn[..., :, None] * v[:, n, :, None, :]
        outs.append((qn[..., None, :].to(S.dtype) @ S)[..., 0, :].real)
    o = torch.stack(outs, 1)                                                        # [B, T, H, dv]
    normed = F.group_norm(o.reshape(B * T, -1), H, W["norm.weight"], W.get("norm.bias"), cell.norm.eps).reshape(B, T, -1)
    return (F.silu(x @ W["gate.weight"].T) * normed) @ W["out.weight"].T


@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunkwise"])
def test_cell_equals_paper_recurrence_in_float64(form):
    cell = _cell(form).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    y, _ = cell(x)
    assert_close(y, paper_recurrent(cell, x), kind="form", what=f"{form} vs the paper's recurrence")


def test_paper_transcription_has_teeth():
    """Without rotation the cell is another model: the reference must tell them apart."""
    cell, flat = _cell().double(), _cell(rotary=False).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    assert (flat(x)[0] - paper_recurrent(cell, x)).abs().max() > 1e-3


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_forms_agree_with_a_carried_state(chunk):
    x1, x2 = torch.randn(2, 9, 16), torch.randn(2, 14, 16)
    outputs = {}
    for form in ("recurrent", "parallel", "chunkwise"):
        cell = _cell(form, chunk_size=chunk)
        y1, s = cell(x1)
        y2, s = cell(x2, s)
        outputs[form] = (torch.cat([y1, y2], 1), s.S)
    for form in ("parallel", "chunkwise"):
        assert_close(outputs[form][0], outputs["recurrent"][0], kind="form", what=f"{form} output")
        assert_close(outputs[form][1], outputs["recurrent"][1], kind="form", what=f"{form} state")


def test_odd_head_size_with_rotary_is_refused():
    with pytest.raises(ConfigError, match="rotary"):
        RetentionCell(RetentionConfig(num_heads=2), BuildContext(dim=6))
