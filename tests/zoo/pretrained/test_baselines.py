"""Hugging Face Llama and Mamba checkpoints in and out (issue 31): random-weight ``LlamaForCausalLM`` and
``MambaForCausalLM`` (transformers, a test dependency) saved with ``save_pretrained``, converted by
``xlstm-zoo convert`` / ``from_pretrained``, compared with transformers on the same tokens: fp32
logits within the ``interop`` bound (1e-5 of their scale), Mamba's final cache states, identical
greedy generation; written back with ``layout="hf"``, transformers loads them and matches. Config
switches we do not implement are refused naming the field.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

from xlstm_zoo.errors import ConfigError  # noqa: E402
from xlstm_zoo.pretrained import from_pretrained, plan, save_pretrained  # noqa: E402
from xlstm_zoo.tolerances import assert_close  # noqa: E402

VOCAB = 97
TOKENS = 24


def _noisy(model):
    """Every parameter perturbed (norm weights start at one, biases at zero: a swapped or missing
    tensor would otherwise go unseen)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def make_llama(directory, **changes):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      **changes)
    model = _noisy(transformers.LlamaForCausalLM(config))
    model.save_pretrained(directory)
    return model


def make_mamba(directory, **changes):
    torch.manual_seed(0)
    logging.getLogger("transformers").setLevel(logging.ERROR)  # "falling back to the reference scan"
    config = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
                                      conv_kernel=4, **changes)
    model = _noisy(transformers.MambaForCausalLM(config))
    model.save_pretrained(directory)
    return model


MAKERS = {"llama": make_llama, "mamba": make_mamba}


@pytest.fixture(scope="module", params=list(MAKERS))
def converted(request, tmp_path_factory):
    """(kind, transformers model, its directory, our model loaded from it)."""
    directory = tmp_path_factory.mktemp(request.param)
    hf = MAKERS[request.param](directory)
    return request.param, hf, directory, from_pretrained(directory)


def tokens(batch=2, length=TOKENS, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_logits_match_transformers(converted):
    kind, hf, _, ours = converted
    ids = tokens()
    with torch.no_grad():
        expected = hf(ids).logits
        got, _ = ours(ids)
    assert_close(got, expected, kind="interop", what=f"{kind} logits vs transformers")
    assert ours.provenance["layout"] == "hf" and ours.provenance["source_config"]["model_type"] == kind


def test_final_states_match_transformers_cache(converted):
    kind, hf, _, ours = converted
    ids = tokens()
    with torch.no_grad():
        out = hf(ids, use_cache=True)
        _, state = ours(ids)
    cache = out.cache_params if kind == "mamba" else out.past_key_values
    for i, block_state in enumerate(state):
        layer = cache.layers[i]
        if kind == "llama":  # both cache rotated keys; ours in the first T of max_cache slots
            assert_close(block_state.k[:, :, :TOKENS], layer.keys, kind="interop", what=f"block {i} keys")
            assert_close(block_state.v[:, :, :TOKENS], layer.values, kind="interop", what=f"block {i} values")
            assert not block_state.k[:, :, TOKENS:].any() and torch.equal(block_state.pos, torch.full((2,), 24.0))
        else:  # HF keeps the last K inputs [B, E, K]; ours the last K - 1 [B, K - 1, E]
            ssm, conv = cache.get_recurrent_state(i, state_idx=0), cache.get_conv_state(i, state_idx=0)
            assert_close(block_state.ssm, ssm, kind="interop", what=f"block {i} ssm state")
            assert_close(block_state.conv, conv[..., 1:].transpose(1, 2), kind="interop",
                         what=f"block {i} conv state")


def test_greedy_generation_is_identical(converted):
    kind, hf, _, ours = converted
    prompt = tokens(batch=2, length=6, seed=2)
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               attention_mask=torch.ones_like(prompt))
    got = ours.generate(prompt, 12, greedy=True)
    assert torch.equal(got, expected), f"{kind}: {got.tolist()} vs {expected.tolist()}"


def test_convert_cli_and_hf_layout_round_trip(converted, tmp_path, run_cli):
    kind, hf, directory, _ = converted
    code, out, err = run_cli("convert", directory, "--out", tmp_path / "zoo")
    assert code == 0, err
    zoo = from_pretrained(tmp_path / "zoo")
    code, out, err = run_cli("convert", tmp_path / "zoo", "--out", tmp_path / "hf", "--to", "hf")
    assert code == 0, err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == kind
    back = getattr(transformers, type(hf).__name__).from_pretrained(tmp_path / "hf").eval()
    ids = tokens(seed=3)
    with torch.no_grad():
        expected = hf(ids).logits
        assert_close(back(ids).logits, expected, kind="interop", what=f"{kind} written back, loaded by transformers")
        assert_close(zoo(ids)[0], expected, kind="interop", what=f"{kind} through the zoo layout")
    save_pretrained(zoo, tmp_path / "again", layout="hf")
    assert {p.name for p in (tmp_path / "again").iterdir()} >= {"config.json", "model.safetensors"}


def test_dry_run_lists_every_tensor(converted, run_cli):
    kind, hf, directory, _ = converted
    code, out, err = run_cli("convert", directory, "--dry-run")
    assert code == 0, err
    stored = {k for k in hf.state_dict() if not (kind == "mamba" and k == "lm_head.weight")}  # tied: saved once
    assert {k for rule in plan(directory).rules for k in rule.sources} == stored
    assert "mapping" in out


@pytest.mark.parametrize("kind, changes, field", [
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_parameters.rope_type"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("mamba", {"use_conv_bias": False}, "use_conv_bias"),
    ("mamba", {"hidden_act": "relu"}, "hidden_act"),
])
def test_unsupported_variants_are_refused_naming_the_field(kind, changes, field, tmp_path, run_cli):
    MAKERS[kind](tmp_path / "src", **changes)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        from_pretrained(tmp_path / "src")
    code, out, err = run_cli("convert", tmp_path / "src", "--out", tmp_path / "out")
    assert code != 0 and field in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_attention_and_mlp_biases_convert_exactly(tmp_path):
    hf = make_llama(tmp_path, attention_bias=True, mlp_bias=True)
    ours = from_pretrained(tmp_path)
    ids = tokens()
    with torch.no_grad():
        assert_close(ours(ids)[0], hf(ids).logits, kind="interop", what="llama with biases")
