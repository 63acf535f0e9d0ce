"""The plugin author's own tests: xlstm-zoo's conformance checks, plus what is special to minGRU."""

import pytest
import torch

from xlstm_zoo.config import BuildContext
from xlstm_zoo.export import export_step, missing_toolchain
from xlstm_zoo.testing import check_cell, check_cell_export, check_norm
from xlstm_zoo_mingru.cell import MinGRUCell, MinGRUConfig
from xlstm_zoo_mingru.norm import DyTConfig, DyTNorm


def test_mingru_meets_the_cell_contract():
    check_cell(MinGRUConfig(), dim=16, builder=MinGRUCell)  # exports too, where onnx is installed
    check_cell(MinGRUConfig(chunk_size=4), dim=16, builder=MinGRUCell, export=False)  # T=11 spans several chunks


@pytest.mark.skipif(bool(missing_toolchain()), reason=f"ONNX export needs {', '.join(missing_toolchain())}: "
                                                      "pip install 'xlstm-zoo[onnx]'")
def test_mingru_step_exports_and_matches_pytorch(tmp_path):
    """The cell's step as ONNX: named from what the cell declares, validated by onnxruntime."""
    check_cell_export(MinGRUConfig(), dim=8, builder=MinGRUCell)
    cell = MinGRUCell(MinGRUConfig(), BuildContext(dim=8))
    result = export_step(cell, tmp_path, batch=(1, 2, 4), rollout_steps=100, threads=1)
    assert result.ok, result.report.failures()
    assert result.signature.input_names == ["x", "mingru.h"]
    assert result.signature.output_names == ["y", "next.mingru.h"]
    assert [s.zero for s in result.signature.states] == [0.0]
    assert (tmp_path / "step.onnx").is_file()


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
