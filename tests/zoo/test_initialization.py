"""Initialisation as configuration: schemes, per-role overrides, declared roles."""

import math

import pytest
import torch
import yaml

import xlstm_zoo
from xlstm_zoo.gates import PowerLawInit, bias_values
from xlstm_zoo.initialization import ROLES, parameter_roles
from xlstm_zoo.recipe_loader import shipped_recipes
from xlstm_zoo.training.trainer import param_groups


def build(recipe="xlstm_1_1", *overrides):
    torch.manual_seed(0)
    return xlstm_zoo.build(xlstm_zoo.load_recipe(recipe, ["dim=64", *overrides]))


def weights(model, role):
    return [p for p, r in parameter_roles(model).values() if r == role]


def test_roles_of_the_built_in_components():
    roles = {name: role for name, (_, role) in parameter_roles(build()).items()}
    assert roles["embedding.weight"] == "embedding"
    assert roles["stack.blocks.0.cell.input_gate.proj.weight"] == "gate"      # mLSTM: scalar gates
    assert roles["stack.blocks.1.cell.input_gate.proj.weight"] == "proj"      # sLSTM: like z and o
    assert roles["stack.blocks.1.cell.R"] == "recurrent"
    assert roles["stack.blocks.0.down.weight"] == roles["stack.blocks.1.mlp.down.weight"] == "out_proj"
    assert roles["stack.blocks.0.conv.weight"] == "conv"
    assert roles["stack.blocks.0.cell.input_gate.bias"] == roles["stack.blocks.0.skip"] == "keep"
    assert "head.weight" not in roles  # tied: counted once, as the embedding


@pytest.mark.parametrize("recipe", shipped_recipes())
def test_every_shipped_recipe_builds_under_every_scheme(recipe):
    for scheme in ("zoo", "torch", "xlstm"):
        model = xlstm_zoo.build(xlstm_zoo.load_recipe(recipe, [f"model.init.scheme={scheme}"]))
        assert all(torch.isfinite(p).all() for p in model.parameters() if p.dtype.is_floating_point)


def test_zoo_scheme_embedding_unit_scale_unless_tied():
    untied = build("xlstm_1_1", "tie_weights=false")
    tied = build("xlstm_1_1", "tie_weights=true")
    assert untied.embedding.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert tied.embedding.weight.std().item() == pytest.approx(64 ** -0.5, rel=0.05)


def test_xlstm_scheme_matches_the_official_rules():
    model = build("xlstm_1_1", "init.scheme=xlstm", "tie_weights=false", "stack.num_blocks=4")
    small = math.sqrt(2 / (5 * 64))
    for role in ("embedding", "head", "proj"):
        values = torch.cat([p.flatten() for p in weights(model, role)])
        assert values.std().item() == pytest.approx(small, rel=0.05), role
    out = torch.cat([p.flatten() for p in weights(model, "out_proj")])
    assert out.std().item() == pytest.approx(2 / (4 * math.sqrt(64)), rel=0.05)
    assert all((p == 0).all() for p in weights(model, "gate") + weights(model, "recurrent"))


def test_torch_scheme_uses_fan_in_bounds():
    model = build("xlstm_1_1", "init.scheme=torch", "tie_weights=false")
    for name, (p, role) in parameter_roles(model).items():
        if role in ("proj", "out_proj", "head", "gate"):
            fan_in = p.shape[-1] if p.dim() == 2 else p.shape[-2]
            assert p.abs().max().item() <= fan_in ** -0.5 + 1e-6, name
            assert p.abs().max().item() > 0.5 * fan_in ** -0.5, name  # really drawn, not zeros
    R = model.stack.blocks[1].cell.R
    assert R.abs().max().item() <= R.shape[1] ** -0.5 + 1e-6


def test_std_override_per_role_beats_the_scheme():
    model = build("xlstm_1_1", "init.scheme=xlstm", "init.std.proj=0", "init.std.embedding=0.5")
    assert all((p == 0).all() for p in weights(model, "proj"))
    assert model.embedding.weight.std().item() == pytest.approx(0.5, rel=0.05)
    assert weights(model, "out_proj")[0].abs().sum() > 0  # other roles untouched by the override


def test_biases_follow_their_gate_settings_under_every_scheme():
    for scheme in ("zoo", "torch", "xlstm"):
        model = build("xlstm_1_1", f"init.scheme={scheme}")
        forget = model.stack.blocks[0].cell.forget_gate.bias
        assert torch.allclose(forget, torch.linspace(3.0, 6.0, forget.numel()))


def test_bad_std_is_a_config_error():
    with pytest.raises(xlstm_zoo.errors.ConfigError, match="init.std.proj"):
        xlstm_zoo.load_recipe("xlstm_1_1", ["init.std.proj=-1"])
    with pytest.raises(xlstm_zoo.errors.ConfigError, match="scheme"):
        xlstm_zoo.load_recipe("xlstm_1_1", ["init.scheme=kaiming"])


def test_a_declared_unknown_role_is_named():
    model = build()
    model.stack.blocks[0].init_roles = {"down.weight": "output"}
    with pytest.raises(ValueError, match="'output'.*roles are embedding"):
        parameter_roles(model)


def test_power_law_over_units_is_the_official_slstm_forget_bias():
    init = PowerLawInit(start=5.0, end=-7.0, over="units")
    for block, blocks in ((0, 1), (1, 3), (2, 3)):
        values = bias_values(init, units=64, heads=4, block_index=block, num_blocks=blocks)
        ratio = block / (blocks - 1) if blocks > 1 else 0.0
        official = -(-5.0 + 12.0 * (torch.arange(16) / 15) ** (0.3 + 1.3 * ratio))
        assert torch.allclose(values, official.repeat(4), atol=1e-5)  # the official formula, up to fp32 rounding


def test_headwise_gate_projection_is_block_diagonal():
    model = build("xlstm_0_1", "stack.blocks.s.cell.forget_gate.proj=headwise")
    gate = model.stack.blocks[0].cell.forget_gate
    assert gate.proj.weight.shape == (4, 16, 16)
    out, _ = model(torch.randint(0, 256, (2, 5)))
    out.sum().backward()
    assert gate.proj.weight.grad is not None


def test_no_weight_decay_roles_leave_the_decay_group():
    model = build("xlstm_1_1", "tie_weights=false")
    decay, rest = param_groups(model, 0.1, ["embedding", "recurrent"])
    decayed = {id(p) for p in decay["params"]}
    assert id(model.embedding.weight) not in decayed and id(model.stack.blocks[1].cell.R) not in decayed
    assert id(model.head.weight) in decayed
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_build_dump_shows_the_init_section(run_cli):
    code, out, err = run_cli("build", "xlstm_1_1", "--set", "init.scheme=xlstm", "--dump")
    dumped = yaml.safe_load(out)["model"]["init"]
    assert code == 0 and dumped["scheme"] == "xlstm" and set(dumped["std"]) == set(ROLES)
    assert "init (scheme xlstm)" in err and "recurrent zeros" in " ".join(err.split())


def test_lstm_forget_bias_is_one_value_or_a_spread_over_the_units():
    constant = build("lstm", "stack.blocks.l.cell.forget_bias=3")
    spread = build("lstm", "stack.blocks.l.cell.forget_bias={kind: power_law, start: 3, end: 0, exponent_first: 1, "
                           "exponent_last: 1, over: units}")
    for model, expected in ((constant, torch.full((64,), 3.0)), (spread, torch.linspace(3.0, 0.0, 64))):
        for layer in model.stack.blocks:
            bias = layer.cell.if_proj.bias
            assert torch.allclose(bias[64:], expected, atol=1e-6)   # the forget half
            assert not torch.equal(bias[:64], expected)              # the input gate keeps its own init
