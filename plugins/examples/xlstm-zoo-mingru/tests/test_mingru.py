"""The plugin author's own tests: xlstm-zoo's conformance checks, plus what is special to minGRU."""

import torch

from xlstm_zoo.config import BuildContext
from xlstm_zoo.testing import check_cell, check_norm
from xlstm_zoo_mingru.cell import MinGRUCell, MinGRUConfig
from xlstm_zoo_mingru.norm import DyTConfig, DyTNorm


def test_mingru_meets_the_cell_contract():
    check_cell(MinGRUConfig(), dim=16, builder=MinGRUCell)
    check_cell(MinGRUConfig(chunk_size=4), dim=16, builder=MinGRUCell)  # T=11 spans several chunks


def test_dyt_meets_the_norm_contract():
    check_norm(DyTConfig(), dim=16, builder=DyTNorm)


def test_mingru_is_the_recurrence_it_claims():
    cell = MinGRUCell(MinGRUConfig(chunk_size=3), BuildContext(dim=4))
    x, v = torch.randn(2, 7, 4), torch.randn(2, 7, 4)
    y, _ = cell(x, value_input=v)
    h = torch.zeros(2, 4)
    for t in range(7):
        z = torch.sigmoid(cell.gate(x[:, t]))
        h = (1 - z) * h + z * cell.candidate(v[:, t])
        torch.testing.assert_close(y[:, t], h, rtol=1e-5, atol=1e-5)
