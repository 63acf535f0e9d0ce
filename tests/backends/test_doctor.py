"""``xlstm-zoo doctor``: machine facts, every backend's availability and why, and each op's choice."""

from typing import Literal

import torch

from xlstm_zoo.backends import Backend
from xlstm_zoo.backends.doctor import OPS, PACKED_OPS, op_choices
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.registry import registry


def test_doctor_lists_every_backend_and_op(run_cli):
    code, out, _ = run_cli("doctor")
    assert code == 0
    for name in registry.names("backend"):
        assert name in out
    for op in OPS:
        assert op in out
    assert "Ops on cpu (float32)" in out
    if not torch.cuda.is_available():
        assert "no CUDA GPU is visible" in out  # the Triton backend says why it is unavailable


def test_op_choices_are_the_dispatchers_choices():
    choices = op_choices(torch.device("cpu"), torch.float32)
    rows = {row.op: row for row in choices if not row.packed}
    from xlstm_zoo.backends.cpp.build import unavailable_reason

    compiled = unavailable_reason() is None
    packed = {row.op: row for row in choices if row.packed}  # the choice for packed rows (doc_starts)
    assert set(packed) == set(PACKED_OPS)
    assert packed["slstm_sequence"].uses == ("cpp" if compiled else "fused")
    assert packed["selective_scan"].uses == ("cpp" if compiled else "reference")
    assert packed["mlstm_sequence"].uses == ("cpp" if compiled else "reference")
    assert packed["causal_conv_silu"].uses == ("cpp" if compiled else "reference")
    assert rows["slstm_sequence"].uses == ("cpp" if compiled else "fused")
    assert rows["lstm_sequence"].uses == ("cpp" if compiled else "fused")
    assert rows["lstm_projected"].uses == ("cpp" if compiled else "fused")  # else torch.lstm
    assert packed["lstm_projected"].uses == ("cpp" if compiled else "general route: the projection, then lstm_sequence")
    assert rows["mlstm_sequence"].uses == ("cpp" if compiled else "reference")
    assert rows["mlstm_sequence"].statuses["reference"] == "ok"
    assert rows["rwkv_wkv_sequence"].uses == ("cpp" if compiled else "reference")
    assert rows["rwkv_wkv_step"].uses == "reference"
    assert rows["selective_scan"].uses == ("cpp" if compiled else "reference")
    if not torch.cuda.is_available():
        assert rows["mlstm_sequence"].statuses["triton"].startswith("no CUDA GPU is visible")


class _BrokenConfig(ZooConfig):
    type: Literal["doctor_broken"] = "doctor_broken"


class _Broken(Backend):
    def unavailable_reason(self):
        raise RuntimeError("driver exploded")


def test_a_backend_whose_check_raises_is_reported_not_fatal(run_cli):
    registry.register(kind="backend", name="doctor_broken", config=_BrokenConfig,
                      builder=lambda c: _Broken(name="doctor_broken", priority=99, ops={"mlstm_step": None}),
                      description="test")
    try:
        code, out, _ = run_cli("doctor")
    finally:
        registry.unregister("backend", "doctor_broken")
    assert code == 0
    assert "RuntimeError" in out and "driver exploded" in out


def test_forced_backend_shows(run_cli, monkeypatch):
    monkeypatch.setenv("XLSTM_ZOO_BACKEND", "reference")
    code, out, _ = run_cli("doctor")
    assert code == 0
    rows = {row.op: row.uses for row in op_choices(torch.device("cpu"), torch.float32) if not row.packed}
    assert set(rows.values()) == {"reference"}, "the environment variable forces every op"
    assert "XLSTM_ZOO_BACKEND" in out and "reference" in out
