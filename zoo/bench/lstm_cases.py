"""Our LSTM cell against ``torch.nn.LSTM`` (oneDNN on CPU)."""

from __future__ import annotations

import torch

from xlstm_zoo.bench.case import Case, Prepared, Scale, count, forward, forward_backward, stack_input
from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.config import BuildContext



# Interleaved with torch's LSTM, our cell's first 2-4 timed calls after the warm-up grow the heap (3,000-4,000
# page faults, ~3 ms of a 9 ms forward) until the two sides' buffers recycle; with 5 calls the median often
# landed on them (0.88-1.27 against torch.nn.LSTM over runs). The cell is cheap: 20 calls a side.
LSTM_CELL_SAMPLE_FACTOR = 4


def _our_lstm_cell(scale: Scale):
    torch.manual_seed(scale.seed)
    return LSTMCell(LSTMCellConfig(), BuildContext(dim=scale.dim))


def lstm_cases(scale: Scale) -> list[Case]:
    cases = []
    shapes = f"B={scale.batch} T={scale.seq_len} d=hidden={scale.dim} one layer fp32"
    for label, wrap in (("fwd", forward), ("fwdbwd", forward_backward)):
        def ours(wrap=wrap):
            cell = _our_lstm_cell(scale)
            return Prepared(wrap(cell, stack_input(scale)), count(cell), note="LSTMCell (recurrent=full), default dispatch")

        def baseline(wrap=wrap):
            torch.manual_seed(scale.seed)
            lstm = torch.nn.LSTM(scale.dim, scale.dim, batch_first=True)
            return Prepared(wrap(lstm, stack_input(scale)), count(lstm), note="torch.nn.LSTM (oneDNN on CPU)")

        # No roofline column: torch's flop counter sees no matmul inside the fused LSTM kernel (both sides run one).
        cases.append(Case(f"lstm_cell/{label}", "LSTM cell vs torch.nn.LSTM", shapes, ours, baseline,
                          baseline_name="torch.nn.LSTM", sample_factor=LSTM_CELL_SAMPLE_FACTOR))
    return cases
