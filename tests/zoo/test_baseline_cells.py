"""The baselines' cells beyond the registry-wide contract: the attention cache's capacity and per-row
positions, and the Mamba scan's chunked form against the sequential reference."""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo.cells.attention import AttentionCellConfig, AttentionState
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.backends.reference.selective_scan import chunked_scan, sequential_scan
from xlstm_zoo.cells.mamba import MambaCellConfig
from xlstm_zoo.config import BuildContext, build
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tolerances import assert_close


def cell(config, dim=16):
    torch.manual_seed(0)
    return build(config, BuildContext(dim=dim, path="cell"), "cell")


def test_attention_past_its_cache_is_an_error_naming_max_cache():
    attention = cell(AttentionCellConfig(max_cache=8))
    x = torch.randn(2, 6, 16)
    _, state = attention(x)
    with pytest.raises(ConfigError, match=r"6 tokens seen \+ 3 new > max_cache=8"):
        attention(x[:, :3], state)
    with pytest.raises(ConfigError, match="max_cache=8"):
        attention(torch.randn(2, 9, 16))
    assert torch.equal(state.pos, torch.full((2,), 6.0))  # the state passed in is unchanged


def test_attention_rows_at_different_positions_continue_like_each_row_alone():
    """A state whose rows have seen different numbers of tokens (a batch assembled from two
    generations): each row's continuation equals that row run alone."""
    attention = cell(AttentionCellConfig(num_heads=4, num_kv_heads=2, max_cache=16))
    first, second = torch.randn(1, 5, 16), torch.randn(1, 2, 16)
    _, s1 = attention(first)
    _, s2 = attention(second)
    joined = AttentionState(*(torch.cat([a, b]) for a, b in zip(s1, s2)))
    more = torch.randn(2, 4, 16)
    y, state = attention(more, joined)
    for row, s in ((0, s1), (1, s2)):
        y_row, state_row = attention(more[row:row + 1], s)
        assert_close(y[row:row + 1], y_row, kind="form", what=f"row {row} output")
        for got, want in zip(state, state_row):
            assert_close(got[row:row + 1], want, kind="form", what=f"row {row} state")


@pytest.mark.parametrize("chunk", [None, 1, 5, 37, 64])
def test_mamba_chunked_scan_equals_the_sequential_one(chunk):
    g = torch.Generator().manual_seed(0)
    B, T, E, N = 2, 37, 8, 4
    u, dt = torch.randn(B, T, E, generator=g, dtype=torch.float64), torch.rand(B, T, E, generator=g, dtype=torch.float64)
    A = -3 * torch.rand(E, N, generator=g, dtype=torch.float64)
    Bm, Cm = (torch.randn(B, T, N, generator=g, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(B, E, N, generator=g, dtype=torch.float64)
    y_ref, h_ref = sequential_scan(u, dt, A, Bm, Cm, h0)
    y, h = chunked_scan(u, dt, A, Bm, Cm, h0, chunk)
    assert_close(y, y_ref, kind="form", what=f"outputs, chunk {chunk}")
    assert_close(h, h_ref, kind="form", what=f"final state, chunk {chunk}")


def test_mamba_forms_agree_as_cells(monkeypatch):
    monkeypatch.setenv(ENV_FORCE, "reference")  # the PyTorch forms themselves (the compiled scan serves both)
    x = torch.randn(2, 29, 16)
    chunked, sequential = cell(MambaCellConfig(form="chunked", chunk_size=4)), cell(MambaCellConfig(form="sequential"))
    (y1, s1), (y2, s2) = chunked(x), sequential(x)
    assert_close(y1, y2, kind="form", what="outputs")
    assert_close(s1.ssm, s2.ssm, kind="form", what="ssm state")
    assert torch.equal(s1.conv, s2.conv)
