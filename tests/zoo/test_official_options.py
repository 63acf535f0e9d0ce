"""Component options that make the official xLSTM architectures expressible exactly: logit
soft-cap, exact MLP / inner widths and the official roundings, the mLSTM gate input cat(q, k, v),
optional post_up MLP, bias switches; new fields leave old digests alone; meta-device builds."""

import math

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.config import digest_dump
from xlstm_zoo.grid.expand import recipe_digest
from xlstm_zoo.layers import MLPConfig, mlp_width
from xlstm_zoo.tolerances import assert_close


def _model(name, *overrides):
    torch.manual_seed(0)
    return build(load_recipe(name, list(overrides)))


def test_logit_softcap_bounds_forward_step_and_generate():
    plain = _model("xlstm_7b_small", "model.logit_softcap=null")
    capped = _model("xlstm_7b_small", "model.logit_softcap=0.5")
    capped.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 256, (2, 7))
    raw, _ = plain(tokens)
    logits, _ = capped(tokens)
    assert raw.abs().max() > 0.5  # otherwise the cap would not be visible
    assert_close(logits, 0.5 * torch.tanh(raw / 0.5), kind="form", what="soft-capped forward")
    step_raw, _ = plain.step(tokens[:, 0], None)
    step_capped, _ = capped.step(tokens[:, 0], None)
    assert_close(step_capped, 0.5 * torch.tanh(step_raw / 0.5), kind="form", what="soft-capped step")
    # greedy tokens are unchanged by a monotone cap; the cap is what generate's logits see
    assert torch.equal(capped.generate(tokens, 4, greedy=True), plain.generate(tokens, 4, greedy=True))


@pytest.mark.parametrize("dim, factor, multiple, rounding, width", [
    (4096, 2.667, 64, "xlstm_large", 10944),   # the 7B
    (1536, 2.6667, 64, "xlstm_large", 4096),   # the official formula rounds down here ...
    (1536, 2.6667, 64, "ceil", 4160),          # ... where a ceil rounds up
    (64, 1.3, 64, "ceil", 128),                # NeurIPS feed-forward
    (4096, 2.667, 8, "ceil", 10928),           # the old default rule, unchanged
])
def test_mlp_width_roundings(dim, factor, multiple, rounding, width):
    assert mlp_width(dim, MLPConfig(proj_factor=factor, multiple_of=multiple, rounding=rounding)) == width


def test_exact_widths_and_biases_build_the_asked_shapes():
    model = _model("xlstm_7b_small", "model.stack.blocks.m.mlp.hidden_dim=100", "model.stack.blocks.m.mlp.bias=true",
                   "model.stack.blocks.m.bias=true", "model.stack.blocks.m.cell.bias=true",
                   "model.stack.blocks.m.norm.bias=true", "model.stack.blocks.m.cell.norm.bias=true")
    block = model.stack.blocks[0]
    assert block.mlp.up.weight.shape == (200, 128) and block.mlp.down.weight.shape == (128, 100)
    for layer in (block.mlp.up, block.mlp.down, block.out_proj, block.cell.q, block.cell.o):
        assert layer.bias is not None and not layer.bias.any(), "new biases start at zero"
    assert block.norm.bias is not None and block.cell.norm.bias is not None
    neurips = _model("xlstm_neurips", "model.dim=48", "model.stack.blocks.m.bias=true")
    assert neurips.stack.blocks[0].up.weight.shape == (256, 48)  # ceil(2 * 48 / 64) * 64 = 128 inner
    assert neurips.stack.blocks[0].up.bias is not None
    exact = _model("xlstm_neurips", "model.stack.blocks.m.inner_dim=192")
    assert exact.stack.blocks[0].skip.shape == (192,)


def test_qkv_gate_input_reads_q_k_and_v():
    model = _model("xlstm_neurips")
    cell = model.stack.blocks[0].cell
    inner = model.stack.blocks[0].skip.numel()
    assert cell.input_gate.proj.weight.shape == (4, 3 * inner)
    x, v_in = torch.randn(2, 5, inner), torch.randn(2, 5, inner)
    with torch.no_grad():
        cell.input_gate.proj.weight.normal_(0.0, 0.1)
        before = cell._op_inputs(x, v_in)[3]
        after = cell._op_inputs(x, v_in + 1)[3]
    assert not torch.allclose(before, after), "the input gate must read v (the pre-conv stream)"
    y, state = cell(x, value_input=v_in)
    steps, s = [], None
    for t in range(5):
        out, s = cell.step(x[:, t], s if s is not None else cell.init_state(2), value_input=v_in[:, t])
        steps.append(out)
    assert_close(torch.stack(steps, 1), y, kind="form", what="qkv-gated mLSTM step vs sequence")


def test_post_up_without_mlp():
    model = _model("xlstm_neurips", "model.stack.blocks.s.mlp=null")
    block = model.stack.blocks[1]
    assert block.mlp is None and block.mlp_norm is None
    logits, _ = model(torch.randint(0, 256, (1, 4)))
    assert logits.isfinite().all()


def test_new_fields_at_default_keep_digests():
    recipe = load_recipe("xlstm_1_1")
    dumped = digest_dump(recipe)
    assert "gate_input" not in dumped["model"]["stack"]["blocks"]["m"]["cell"]
    assert "logit_softcap" not in dumped["model"]
    assert "gate_input" in recipe.model_dump()["model"]["stack"]["blocks"]["m"]["cell"]
    changed = load_recipe("xlstm_1_1", ["model.stack.blocks.m.cell.gate_input=qkv"])
    assert recipe_digest(changed) != recipe_digest(recipe)
    assert recipe_digest(load_recipe("xlstm_1_1", ["model.stack.blocks.m.cell.gate_input=x"])) == recipe_digest(recipe)


def test_mlstm_7b_default_is_the_official_per_head_layernorm():
    from xlstm_zoo.blocks.mlstm_7b import MLSTM7BBlockConfig
    norm = MLSTM7BBlockConfig().cell.norm
    assert (norm.type, norm.eps) == ("multihead_layernorm", 1e-6)


def test_seven_billion_shape_builds_on_meta_without_memory():
    recipe = load_recipe("xlstm_7b_small", ["model.dim=4096", "model.vocab_size=50304", "model.stack.pattern=" + "m" * 32,
                                            "model.stack.blocks.m.cell.num_heads=8",
                                            "model.stack.blocks.m.mlp.hidden_dim=10944", "model.init.scheme=xlstm"])
    with torch.device("meta"):
        model = build(recipe)
    tensors = [*model.parameters(), *model.buffers()]
    assert {t.device.type for t in tensors} == {"meta"}
    assert sum(p.numel() for p in model.parameters()) == 6_865_424_896
    assert math.isclose(sum(p.numel() for p in model.parameters()) * 4 / 2**30, 25.58, abs_tol=0.01)
