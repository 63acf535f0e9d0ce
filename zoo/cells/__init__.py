"""Cells: the recurrent cores (lstm, slstm, mlstm) and the baselines' mixers (attention, mamba). See :mod:`xlstm_zoo.cells.base` for the contract."""

from xlstm_zoo.cells.attention import AttentionCell, AttentionCellConfig
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.cells.mamba import MambaCell, MambaCellConfig
from xlstm_zoo.cells.mlstm import MLSTMCell, MLSTMCellConfig
from xlstm_zoo.cells.slstm import SLSTMCell, SLSTMCellConfig

__all__ = ["AttentionCell", "AttentionCellConfig", "Cell", "LSTMCell", "LSTMCellConfig", "MambaCell", "MambaCellConfig", "MLSTMCell", "MLSTMCellConfig", "SLSTMCell", "SLSTMCellConfig"]
