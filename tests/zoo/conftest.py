"""Fixtures for the model tests."""

from __future__ import annotations

import pytest

from xlstm_zoo import backends


@pytest.fixture
def lstm_route(monkeypatch):
    """``route(cell, x, **forward_kwargs)``: the backend whose ``lstm.projected`` kernel ran the LSTM cell's forward,
    or "general" where the op's general route did (the projection, then ``lstm_sequence``)."""
    real, chosen = backends.select_whole, []
    monkeypatch.setattr(backends, "select_whole", lambda *a, **kw: chosen.append(real(*a, **kw)) or chosen[-1])

    def route(cell, x, **forward_kwargs) -> str:
        cell(x, **forward_kwargs)
        return "general" if chosen[-1] is None else chosen[-1].name
    return route
