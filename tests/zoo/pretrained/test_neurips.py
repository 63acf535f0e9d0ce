"""Official NeurIPS ``xLSTMLMModel`` state dicts -> xlstm-zoo: logits, every step and the final
states equal within fp32 tolerance, for both sLSTM internal layouts, tied and untied, with and
without conv / group-norm weight; negative controls for each transform; unsafe pickles refused."""

import pickle

import pytest
import torch

xlstm = pytest.importorskip("xlstm", reason="the official xlstm package (test extra)")
from xlstm.blocks.slstm.cell import sLSTMCell_cuda  # noqa: E402

from xlstm_zoo.errors import ConfigError  # noqa: E402
from xlstm_zoo.pretrained import from_pretrained, plan  # noqa: E402
from xlstm_zoo.pretrained.mapping import convert  # noqa: E402
from xlstm_zoo.pretrained.states import from_neurips, to_neurips  # noqa: E402
from xlstm_zoo.pretrained.tensorfile import write_safetensors  # noqa: E402
from xlstm_zoo.tolerances import assert_close  # noqa: E402

T, VOCAB = 23, 100


def official(slstm_at=(1,), num_blocks=2, tie=False, conv=4, group_norm_weight=True, seed=0):
    torch.manual_seed(seed)
    cfg = xlstm.xLSTMLMModelConfig(
        vocab_size=VOCAB, embedding_dim=64, num_blocks=num_blocks, slstm_at=list(slstm_at), context_length=64,
        tie_weights=tie,
        mlstm_block=xlstm.mLSTMBlockConfig(mlstm=xlstm.mLSTMLayerConfig(num_heads=4, conv1d_kernel_size=4,
                                                                         qkv_proj_blocksize=4)),
        slstm_block=xlstm.sLSTMBlockConfig(
            slstm=xlstm.sLSTMLayerConfig(backend="vanilla", num_heads=4, conv1d_kernel_size=conv,
                                         group_norm_weight=group_norm_weight),
            feedforward=xlstm.FeedForwardConfig(proj_factor=1.3, act_fn="gelu")))
    model = xlstm.xLSTMLMModel(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every tensor away from its init, which would hide layout mistakes (zeros, ones)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name or "_recurrent_kernel_" in name or "learnable_skip" in name:
                p.copy_(0.3 * noise)
            elif name.endswith("_bias_"):
                p.copy_(noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            elif "embedding" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def save(model, path, prefix=""):
    torch.save({prefix + k: v for k, v in model.state_dict().items()}, path)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    model = official()
    return model, from_pretrained(save(model, tmp_path_factory.mktemp("neurips") / "model.pt"))


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


def logits(model, tokens):
    with torch.no_grad():
        out = model(tokens)
    return out[0] if isinstance(out, tuple) else out


def test_logits_steps_and_final_states(pair, tokens):
    theirs, ours = pair
    assert ours.recipe.model.stack.layout() == "ms"
    with torch.no_grad():
        expected = theirs(tokens)
        got, final = ours(tokens)
        assert_close(got, expected, kind="module", what="logits vs xLSTMLMModel")
        state, official_state = None, None
        for t in range(T):
            step_expected, official_state = theirs.step(tokens[:, t:t + 1], official_state)
            step_got, state = ours.step(tokens[:, t], state)
            assert_close(step_got, step_expected[:, 0], kind="module", what=f"step {t}")
    for i, (a, b) in enumerate(zip(from_neurips(official_state, ours), final)):
        assert_close(a.conv, b.conv, kind="module", what=f"block {i} conv state")
        for name, x, y in zip(a.cell._fields, a.cell, b.cell):
            assert_close(x, y, kind="module", what=f"block {i} final {name}")
    # and back: the official step continues from our state exactly as from its own
    with torch.no_grad():
        a, _ = theirs.step(tokens[:, :1], to_neurips(final))
        b, _ = theirs.step(tokens[:, :1], official_state)
    assert_close(a, b, kind="module", what="official step from a converted state")


@pytest.mark.parametrize("variant", [
    dict(tie=True, conv=0, group_norm_weight=False),
    dict(slstm_at=(0, 2), num_blocks=3),
    dict(slstm_at=(), num_blocks=2),
    dict(slstm_at=(0, 1), num_blocks=2),
])
def test_variants(variant, tokens, tmp_path):
    model = official(**variant)
    ours = from_pretrained(save(model, tmp_path / "model.pt"))
    assert_close(logits(ours, tokens), logits(model, tokens), kind="module", what=f"logits {variant}")


def test_cuda_internal_layout_and_safetensors_with_prefix(pair, tokens, tmp_path):
    theirs, ours = pair
    cell = theirs.xlstm_block_stack.blocks[1].xlstm.slstm_cell
    cuda = sLSTMCell_cuda(cell.config, skip_backend_init=True)
    state = {k: v.clone() for k, v in theirs.state_dict().items()}
    key = "xlstm_block_stack.blocks.1.xlstm.slstm_cell."
    state[key + "_recurrent_kernel_"] = cuda._recurrent_kernel_ext2int(cell._recurrent_kernel_int2ext(cell._recurrent_kernel_))
    state[key + "_bias_"] = cuda._bias_ext2int(cell._bias_int2ext(cell._bias_))
    assert state[key + "_recurrent_kernel_"].shape != cell._recurrent_kernel_.shape
    write_safetensors(tmp_path / "cuda.safetensors", {"_orig_mod.module." + k: v.contiguous() for k, v in state.items()})
    converted = from_pretrained(tmp_path / "cuda.safetensors")
    assert_close(logits(converted, tokens), logits(theirs, tokens), kind="module", what="logits, cuda sLSTM layout")


# each transform left out must show: (rule target suffix, wrong transform)
MUTATIONS = {
    "sLSTM i/f weights not swapped": ("cell.input_gate.proj.weight", "igate.weight"),
    "residual LayerNorm without +1": ("norm.norm.weight", None),
    "headwise q not transposed": ("cell.q.weight", None),
    "conv kernel flipped": ("conv.weight", "flip"),
    # (the forget slot: a constant input-gate bias cancels between c and n, so it cannot show)
    "vanilla bias read in the cuda order": ("cell.forget_gate.bias", "cuda"),
}


@pytest.mark.parametrize("what", MUTATIONS)
def test_negative_controls(pair, tokens, tmp_path, what):
    theirs, ours = pair
    p = plan(save(theirs, tmp_path / "model.pt"))
    suffix, how = MUTATIONS[what]
    state = dict(convert(p.rules, p.opened.source, dtype=torch.float32))
    target = next(r for r in p.rules if r.target.endswith(suffix) and ("blocks.1" in r.target or suffix.startswith("cell.q")
                                                                        or suffix == "norm.norm.weight"))
    source = p.opened.source
    if how == "igate.weight":
        state[target.target] = source.load(target.sources[0].replace("fgate", "igate")).transpose(1, 2)
    elif how == "flip":
        state[target.target] = state[target.target].flip(-1)
    elif how == "cuda":
        raw = source.load(target.sources[0])
        state[target.target] = raw.reshape(4, 4, 16)[:, 1].reshape(-1)  # (head, gate, d) read of a (gate, head, d) tensor
    else:
        state[target.target] = source.load(target.sources[0])  # the raw tensor: no +1, no transpose
    wrong = type(ours)(ours.config)
    wrong.load_state_dict(state)
    diff = (logits(wrong, tokens) - logits(theirs, tokens)).abs().max()
    assert diff > 1e-2, f"{what}: only {diff:.2g} apart"


def test_state_dict_with_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"token_embedding.weight": Payload()}, f)
    with pytest.raises(ConfigError, match="refused"):
        from_pretrained(path)
    assert not marker.exists()
