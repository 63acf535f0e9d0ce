"""Backend dispatch: priority, per-call and environment overrides, unavailable backends."""

from typing import Literal

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo import build, load_recipe
from xlstm_zoo.backends.dispatch import ENV_FORCE, Backend, explain, select
from xlstm_zoo.backends.reference import reference_backend
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import BackendError
from xlstm_zoo.registry import registry


class FakeConfig(ZooConfig):
    type: Literal["fake_fast"] = "fake_fast"


class BrokenConfig(ZooConfig):
    type: Literal["fake_broken"] = "fake_broken"


class Recording(Backend):
    """Claims mlstm_step on CPU fp32 only, records calls, computes with the reference."""

    calls: list

    def supports(self, op, device, dtype, **options):
        return op == "mlstm_step" and device.type == "cpu" and dtype == torch.float32


class Unavailable(Backend):
    def unavailable_reason(self):
        return "triton is not installed"


@pytest.fixture
def fake_backends():
    ref = reference_backend().ops["mlstm_step"]
    fast = Recording(name="fake_fast", priority=100, ops={"mlstm_step": None})
    fast.calls = []

    def step(*args, **kwargs):
        fast.calls.append(kwargs)
        return ref(*args, **kwargs)

    fast.ops["mlstm_step"] = step
    registry.register(kind="backend", name="fake_fast", config=FakeConfig, builder=lambda c: fast, description="test")
    registry.register(kind="backend", name="fake_broken", config=BrokenConfig, builder=lambda c: Unavailable(
        name="fake_broken", priority=200, ops=reference_backend().ops), description="test")
    yield fast
    registry.unregister("backend", "fake_fast")
    registry.unregister("backend", "fake_broken")


def step_inputs(dtype=torch.float32):
    B, H, D = 2, 3, 4
    q, k, v = (torch.randn(B, H, D, dtype=dtype) for _ in range(3))
    return q, k, v, torch.randn(B, H, dtype=dtype), torch.randn(B, H, dtype=dtype)


def test_cpu_gets_a_cpu_implementation_by_default():
    # The compiled sLSTM and LSTM loops (where a C++ compiler builds them), else the fused sequence loops,
    # beat the reference on CPU, and the compiled mLSTM chunk core (float32 compute), mLSTM step and a
    # step's linear maps (float32 only) the reference ones; every other op has only the reference there.
    from xlstm_zoo.backends.cpp.build import unavailable_reason

    compiled = unavailable_reason() is None
    loops = "cpp" if compiled else "fused"
    for dtype in (torch.float32, torch.float64):
        chunkwise = "cpp" if compiled and dtype == torch.float32 else "reference"
        expected = {"mlstm_sequence": chunkwise, "mlstm_step": chunkwise, "slstm_sequence": loops,
                    "slstm_step": "reference", "lstm_sequence": loops, "lstm_step": "reference",
                    "linear_step": chunkwise}
        for op, name in expected.items():
            assert select(op, torch.device("cpu"), dtype).name == name, (op, dtype)
    for form in ("parallel", "recurrent"):
        assert select("mlstm_sequence", torch.device("cpu"), torch.float32, form=form).name == "reference"
    # The loop where it beats torch's GEMM: 2 to 8 rows, weights of at least 1M floats.
    for rows, weights, name in ((1, 1 << 22, "reference"), (2, 1 << 20, "cpp"), (8, 1 << 22, "cpp"),
                                (9, 1 << 22, "reference"), (4, (1 << 20) - 1, "reference")):
        name = name if compiled else "reference"
        assert select("linear_step", torch.device("cpu"), torch.float32, rows=rows, weights=weights).name == name, rows


def test_highest_priority_supporting_backend_wins(fake_backends):
    cpu = torch.device("cpu")
    assert select("mlstm_step", cpu, torch.float32).name == "fake_fast"
    assert select("mlstm_step", cpu, torch.float64).name == "reference", "fake does not support fp64"
    assert select("mlstm_sequence", cpu, torch.float64).name == "reference", "fake does not support sequences"
    h, _ = ops.mlstm_step(*step_inputs(), None)
    assert len(fake_backends.calls) == 1 and h.shape == (2, 3, 4)


def test_unavailable_backend_is_skipped_and_explained(fake_backends):
    rows = {name: status for name, _, status in explain("mlstm_step", torch.device("cpu"), torch.float32)}
    fakes = {name: status for name, status in rows.items() if name.startswith("fake") or name == "reference"}
    assert fakes == {"fake_broken": "triton is not installed", "fake_fast": "ok", "reference": "ok"}


def test_forcing(fake_backends, monkeypatch):
    cpu = torch.device("cpu")
    assert select("mlstm_step", cpu, torch.float32, force="reference").name == "reference"
    monkeypatch.setenv(ENV_FORCE, "reference")
    ops.mlstm_step(*step_inputs(), None)
    assert fake_backends.calls == [], "the environment variable forces the reference"
    monkeypatch.delenv(ENV_FORCE)
    with pytest.raises(BackendError, match="backend 'fake_broken' was forced but is unavailable: triton is not installed"):
        select("mlstm_step", cpu, torch.float32, force="fake_broken")
    with pytest.raises(BackendError, match="'fake_fast' was forced but does not support mlstm_sequence"):
        select("mlstm_sequence", cpu, torch.float32, force="fake_fast")
    with pytest.raises(BackendError, match="backend 'nope' is not registered.*registered backends: cpp, cuda, fake_broken, fake_fast, fused, reference, triton"):
        select("mlstm_step", cpu, torch.float32, force="nope")


def test_recipe_field_forces_a_backend_per_cell(fake_backends):
    model = build(load_recipe("xlstm_1_0", ["dim=16", "stack.num_blocks=1", "stack.blocks.m.cell.backend=reference"]))
    state = model.init_state(2)
    model.step(torch.zeros(2, dtype=torch.long), state)
    assert fake_backends.calls == []
    model = build(load_recipe("xlstm_1_0", ["dim=16", "stack.num_blocks=1"]))
    model.step(torch.zeros(2, dtype=torch.long), model.init_state(2))
    assert len(fake_backends.calls) == 1, "without the field the dispatcher picks the highest priority"


class Raising(Backend):
    def supports(self, op, device, dtype, **options):
        raise RuntimeError("driver exploded")


class RaisingConfig(ZooConfig):
    type: Literal["fake_raising"] = "fake_raising"


def test_backend_whose_checks_raise_is_skipped():
    registry.register(kind="backend", name="fake_raising", config=RaisingConfig,
                      builder=lambda c: Raising(name="fake_raising", priority=500, ops={}), description="test")
    try:
        assert select("mlstm_step", torch.device("cpu"), torch.float64).name == "reference"
        rows = {n: s for n, _, s in explain("mlstm_step", torch.device("cpu"), torch.float64)}
        assert rows["fake_raising"] == "its availability check raised RuntimeError: driver exploded"
    finally:
        registry.unregister("backend", "fake_raising")
