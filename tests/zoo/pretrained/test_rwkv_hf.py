"""RWKV-4 from and to the Hugging Face layout (zoo/pretrained/rwkv.py), against transformers'
``RwkvForCausalLM`` with random weights (vocab 97, hidden 64, 2 layers): fp32 logits, final states and
greedy generation; the CLI conversion; writing the layout back; refusals that name the field."""

import json

import pytest
import torch

import xlstm_zoo
from xlstm_zoo import cli
from xlstm_zoo.errors import ConfigError

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64, intermediate_size=128)


def _perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """HF's init leaves the norms at 1/0 and the time-mix ramps regular: jitter everything so every tensor
    matters (a key mapped to the wrong place changes the logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g) * (1 if "embeddings" not in name else 10))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.RwkvForCausalLM(transformers.RwkvConfig(**SIZES)).float()
    _perturb(model)
    path = tmp_path_factory.mktemp("rwkv_hf")
    model.save_pretrained(path)  # before any eval forward: HF's rescaling would touch the weights
    return path


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.RwkvForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def _scaled_close(ours, theirs, what):
    """Within 1e-5 of the tensor's scale (max |theirs|): fp32 sums in another order, no more."""
    scale = theirs.abs().max()
    worst = (ours - theirs).abs().max()
    assert worst <= 1e-5 * scale, f"{what}: max |difference| {worst:.3g} > 1e-5 * {scale:.3g}"


# "compiled": the WKV loop's C++ pass (no gradient wanted); the two PyTorch forms run with gradients on
@pytest.mark.parametrize("form", ["compiled", "chunkwise", "recurrent"])
def test_logits_states_and_generation_match_transformers(hf_dir, hf_model, form):
    model = xlstm_zoo.from_pretrained(hf_dir)
    for block in model.stack.blocks[::2]:
        block.cell.config = block.cell.config.model_copy(update={"form": "recurrent" if form == "compiled" else form})
        block.cell.decay.requires_grad_(True)
    tokens = torch.randint(0, 97, (3, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = hf_model(tokens, use_cache=True)
    with torch.set_grad_enabled(form != "compiled"):
        logits, state = model(tokens)
    logits, state = logits.detach(), tuple(type(s)(*(t.detach() for t in s)) for s in state)
    _scaled_close(logits, out.logits, f"logits ({form})")
    # HF's state: five [B, hidden, layers] tensors (channel shift, time shift, num, den, max)
    for layer in range(2):
        time, channel = state[2 * layer], state[2 * layer + 1]
        _scaled_close(channel.shift, out.state[0][:, :, layer], f"channel shift {layer} ({form})")
        _scaled_close(time.shift, out.state[1][:, :, layer], f"time shift {layer} ({form})")
        # the WKV state's value is num * e^m (the exponent's representation may differ in the last bits)
        for name, ours, theirs in (("num", time.num, out.state[2]), ("den", time.den, out.state[3])):
            _scaled_close(ours * torch.exp(time.m - out.state[4][:, :, layer]), theirs[:, :, layer],
                          f"wkv {name} {layer} ({form})")
    # stepping on: against HF's whole sequence (HF's own stateful step broadcasts a [B, hidden] shift state
    # against [B, 1, hidden] tokens, which is wrong for B > 1 in transformers 5.23.0: compared at B = 1 below)
    nxt = torch.randint(0, 97, (3,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = hf_model(torch.cat([tokens, nxt[:, None]], 1)).logits[:, -1]
        ours, _ = model.step(nxt, state)
        _scaled_close(ours, theirs, f"step logits ({form})")
        one = hf_model(tokens[:1], use_cache=True)
        theirs = hf_model(nxt[:1, None], state=one.state, use_cache=True).logits[:, 0]
        ours, _ = model.step(nxt[:1], model(tokens[:1])[1])
        _scaled_close(ours, theirs, f"step logits vs HF's step ({form})")
    if form == "compiled":  # generation runs without gradients: the compiled pass whatever the form
        for row in range(2):
            prompt = tokens[row:row + 1, :7]
            ours = model.generate(prompt, 20, greedy=True)
            theirs = hf_model.generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20)
            assert torch.equal(ours, theirs)


def test_mapping_has_teeth(hf_dir, hf_model):
    """Swapping two same-shaped tensors (key and receptance of layer 1's time mixing) breaks the parity."""
    model = xlstm_zoo.from_pretrained(hf_dir)
    cell = model.stack.blocks[2].cell
    with torch.no_grad():
        cell.key.weight, cell.receptance.weight = cell.receptance.weight, cell.key.weight
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        diff = (model(tokens)[0] - hf_model(tokens).logits).abs().max()
    assert diff > 1e-3


def test_cli_convert_and_hf_layout_round_trip(hf_dir, hf_model, tmp_path):
    assert cli.main(["convert", str(hf_dir), "--out", str(tmp_path / "zoo"), "--check", "--tokens", "16"]) == 0
    model = xlstm_zoo.from_pretrained(tmp_path / "zoo")
    assert model.recipe.model.stack.layout() == "tctc"
    xlstm_zoo.save_pretrained(model, tmp_path / "hf", layout="hf")
    back = transformers.RwkvForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    theirs = hf_model.state_dict()
    for key, tensor in back.state_dict().items():
        assert torch.equal(tensor, theirs[key]), key
    tokens = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        assert torch.equal(back(tokens).logits, hf_model(tokens).logits)


def test_rescale_every_that_would_act_is_refused(hf_dir, tmp_path):
    for f in hf_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rescale_every": 2}))
    with pytest.raises(ConfigError, match=r"rescale_every=2 with 2 layers.*allowed: 0, or more than num_hidden_layers"):
        xlstm_zoo.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    with pytest.raises(ConfigError, match="hidden_size=32 but the tensors have the width 64"):
        xlstm_zoo.from_pretrained(tmp_path)


def test_writing_a_model_hf_cannot_express_names_the_field(tmp_path):
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("rwkv", ["dim=32", "stack.pattern=tctc",
                                                            "stack.post_norm.eps=1e-6"]))
    with pytest.raises(ConfigError, match=r"model.stack.post_norm \(must be layernorm, eps 1e-05"):
        xlstm_zoo.save_pretrained(model, tmp_path, layout="hf")
