"""Gates: bias inits, fixed vs learnable, input dependence, soft-cap, and the paper's gating ablation."""

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.backends.gating import log_gate
from xlstm_zoo.config import BuildContext
from xlstm_zoo.gates import ExponentialGate, ExponentialGateConfig, SigmoidGate, SigmoidGateConfig, bias_values
from xlstm_zoo.gates import LinspaceInit, PowerLawInit

# The rows of ../shared/paper/ablation_gating.csv (xLSTM[1:0], mLSTM gates), transcribed:
# (row, forget input-dependent, forget learnable bias, forget bias init, input input-dependent,
#  input learnable bias, input bias init).
GATING_ROWS = [
    ("No Gates (inf)", False, False, "inf", False, False, "0"),
    ("No Gates", False, False, "3..6", False, False, "0"),
    ("Forget Gate", True, True, "3..6", False, False, "0"),
    ("Input Gate", False, False, "3..6", True, True, "N(0;0.1)"),
    ("Forget Gate Bias", False, True, "3..6", False, False, "0"),
    ("Forget + Input Gate Bias", False, True, "3..6", False, True, "N(0;0.1)"),
    ("Forget Gate + Input Gate Bias", True, True, "3..6", False, True, "N(0;0.1)"),
    ("Forget Gate + Input Gate", True, True, "3..6", True, True, "N(0;0.1)"),
]
INITS = {"inf": {"kind": "constant", "value": float("inf")}, "3..6": {"kind": "linspace", "start": 3, "end": 6},
         "0": {"kind": "constant", "value": 0.0}, "N(0;0.1)": {"kind": "normal", "std": 0.1}}


def gate_config(kind, input_dependent, learnable, init):
    return {"type": kind, "input_dependent": input_dependent, "learnable_bias": learnable, "bias_init": INITS[init]}


@pytest.mark.parametrize("row", GATING_ROWS, ids=[r[0] for r in GATING_ROWS])
def test_every_gating_ablation_row_is_expressible(row):
    name, f_dep, f_learn, f_init, i_dep, i_learn, i_init = row
    overrides = [f"stack.blocks.m.cell.forget_gate={gate_config('sigmoid', f_dep, f_learn, f_init)}",
                 f"stack.blocks.m.cell.input_gate={gate_config('exponential', i_dep, i_learn, i_init)}",
                 "dim=32", "stack.num_blocks=2"]
    model = build(load_recipe("xlstm_1_0", overrides))
    cell = model.stack.blocks[0].cell
    params = {n for n, _ in cell.named_parameters()}
    for gate, dep, learn in ((cell.forget_gate, f_dep, f_learn), (cell.input_gate, i_dep, i_learn)):
        assert (gate.proj is not None) == dep
        assert any(p is gate.bias for p in cell.parameters()) == learn, "learnable_bias decides parameter vs buffer"
    assert ("forget_gate.proj.weight" in params) == f_dep and ("input_gate.bias" in params) == i_learn

    x1, x2 = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    if not f_dep:  # input-independent: same pre-activation whatever the input
        torch.testing.assert_close(cell.forget_gate(x1), cell.forget_gate(x2))
    if f_init == "inf":  # forget gate fixed fully open: log f is exactly 0
        assert torch.equal(log_gate(cell.forget_gate(x1), "sigmoid"), torch.zeros(2, 5, 4))
    else:
        torch.testing.assert_close(cell.forget_gate.bias, torch.tensor([3.0, 4.0, 5.0, 6.0]))
    if i_init == "0":
        assert torch.equal(cell.input_gate.bias, torch.zeros(4))

    logits, _ = model(torch.randint(0, 256, (2, 9)))
    assert torch.isfinite(logits).all(), f"{name}: forward not finite"


def test_bias_inits():
    assert torch.equal(bias_values(LinspaceInit(start=3, end=6), units=8, heads=4),
                       torch.tensor([3.0, 3, 4, 4, 5, 5, 6, 6]))
    first = bias_values(PowerLawInit(), units=4, heads=4, block_index=0, num_blocks=4)
    last = bias_values(PowerLawInit(), units=4, heads=4, block_index=3, num_blocks=4)
    assert first[0] == last[0] == 3.0 and first[-1] == last[-1] == 6.0
    assert (last[1:-1] < first[1:-1]).all(), "exponent grows with depth, so inner heads move towards start"
    torch.manual_seed(0)
    normal = bias_values(ExponentialGateConfig(bias_init={"kind": "normal", "std": 0.1}).bias_init, 4000, 4)
    assert abs(normal.mean()) < 0.01 and abs(normal.std() - 0.1) < 0.01


def test_softcap_and_zero_initial_projection():
    ctx = BuildContext(dim=6, heads=2, units=2)
    gate = SigmoidGate(SigmoidGateConfig(softcap=5.0, bias_init={"kind": "constant", "value": 100.0}), ctx)
    assert torch.equal(gate.proj.weight, torch.zeros(2, 6)), "a gate starts exactly at its bias init"
    out = gate(torch.randn(3, 6))
    assert (out <= 5.0).all() and torch.allclose(out, torch.full_like(out, 5 * torch.tanh(torch.tensor(20.0))))


def test_learnable_infinite_bias_is_a_config_error():
    ctx = BuildContext(dim=6, heads=2, units=2, path="model.cell.forget_gate")
    with pytest.raises(ValueError, match="model.cell.forget_gate.bias_init: a learnable bias needs a finite"):
        ExponentialGate(ExponentialGateConfig(bias_init={"kind": "constant", "value": "inf"}), ctx)


def test_bias_shorthand_and_bad_softcap():
    assert ExponentialGateConfig(bias_init=2.5).bias_init.value == 2.5
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        ExponentialGateConfig(softcap=-1)
