"""Bad generation arguments and token ids, through ``model.generate`` and ``xlstm-zoo generate``:
each is one line naming what is wrong and what is allowed, before anything is generated."""

import math

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.errors import InputError

VOCAB = 17


@pytest.fixture(scope="module")
def lm():
    return build(load_recipe("xlstm_1_1", ["dim=32", f"vocab_size={VOCAB}", "stack.num_blocks=2"])).eval()


PROMPT = torch.tensor([[1, 2, 3]])


def refused(call, *patterns):
    with pytest.raises(InputError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for pattern in patterns:
        assert pattern in message, message


@pytest.mark.parametrize("temperature", [0, 0.0, -1.0, math.nan, math.inf])
def test_a_temperature_that_is_not_finite_and_positive(lm, temperature):
    refused(lambda: lm.generate(PROMPT, 2, temperature=temperature), "temperature must be > 0 and finite",
            repr(temperature), "greedy")


def test_temperature_is_not_read_when_greedy(lm):
    assert lm.generate(PROMPT, 2, temperature=0, greedy=True).shape == (1, 5)


@pytest.mark.parametrize("top_k", [0, -3, 2.5])
def test_a_top_k_below_one(lm, top_k):
    refused(lambda: lm.generate(PROMPT, 2, top_k=top_k), "top_k must be a whole number >= 1", repr(top_k))


def test_a_negative_number_of_new_tokens(lm):
    refused(lambda: lm.generate(PROMPT, -1), "max_new_tokens must be a whole number >= 0, got -1")


def test_stream_checks_before_the_first_token(lm):
    """``stream`` refuses when called, not at the first ``next`` (the command line prints nothing first)."""
    refused(lambda: lm.stream(PROMPT, 2, temperature=-1), "temperature")


def test_a_prompt_id_beyond_the_vocabulary(lm):
    prompt = torch.tensor([[1, 2, 3], [4, VOCAB + 3, 5]])
    refused(lambda: lm.generate(prompt, 2), f"id {VOCAB + 3} at position (1, 1)", f"vocab_size {VOCAB}")


def test_a_negative_prompt_id(lm):
    refused(lambda: lm.generate(torch.tensor([[1, -1]]), 2), "id -1 at position (0, 1)", f"ids 0..{VOCAB - 1}")


def test_an_id_beyond_the_vocabulary_in_forward(lm):
    refused(lambda: lm(torch.tensor([[0, 1, VOCAB]])), f"id {VOCAB} at position (0, 2)", f"vocab_size {VOCAB}")


def test_an_id_beyond_the_vocabulary_in_step(lm):
    refused(lambda: lm.step(torch.tensor([3, VOCAB]), None), f"id {VOCAB} at position 1")


def test_float_token_ids(lm):
    refused(lambda: lm.generate(PROMPT.float(), 2), "prompt must be an int64 or int32 tensor, got float32")
    refused(lambda: lm(PROMPT.float()), "int64 or int32")


def test_a_prompt_without_a_batch_dimension(lm):
    refused(lambda: lm.generate(torch.tensor([1, 2]), 2), r"prompt must be [batch, T>=1]", "shape (2,)")


# ---- xlstm-zoo generate ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, lm):
    tokenizers = pytest.importorskip("tokenizers")
    from xlstm_zoo.pretrained import save_pretrained
    directory = tmp_path_factory.mktemp("gen")
    save_pretrained(lm, directory)
    write_tokenizer(tokenizers, directory / "tokenizer.json", VOCAB)
    return directory


def write_tokenizer(tokenizers, path, size):
    words = {f"w{i}": i for i in range(size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "0"], "temperature must be > 0 and finite"),
    (["--temperature", "-1"], "temperature must be > 0 and finite"),
    (["--temperature", "nan"], "got nan"),
    (["--top-k", "0"], "top_k must be a whole number >= 1"),
    (["--max-new-tokens", "-2"], "max_new_tokens must be a whole number >= 0"),
])
def test_generate_command_refuses_bad_settings(run_cli, checkpoint, flags, message):
    code, out, err = run_cli("generate", checkpoint, "--prompt", "w1 w2", *flags)
    assert code == 2 and out == "", (out, err)  # nothing written: not even the prompt
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_generate_command_with_a_torn_tokenizer(run_cli, checkpoint, tmp_path):
    torn = tmp_path / "torn"
    torn.mkdir()
    for f in checkpoint.iterdir():
        (torn / f.name).write_bytes(f.read_bytes())
    text = (checkpoint / "tokenizer.json").read_text()
    (torn / "tokenizer.json").write_text(text[: len(text) // 2])
    code, out, err = run_cli("generate", torn, "--prompt", "w1 w2", "--greedy")
    assert code == 2 and out == ""
    assert "tokenizer.json: not a tokenizer" in err and len(err.strip().splitlines()) == 1, err


def test_generate_command_with_a_tokenizer_for_a_larger_vocabulary(run_cli, checkpoint, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    other = tmp_path / "other"
    other.mkdir()
    for f in checkpoint.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    write_tokenizer(tokenizers, other / "tokenizer.json", VOCAB + 5)
    code, out, err = run_cli("generate", other, "--prompt", "w1 w2", "--greedy")
    assert code == 2 and out == ""
    assert f"ids up to {VOCAB + 4}" in err and f"vocabulary is {VOCAB}" in err, err


def test_generate_command_still_generates(run_cli, checkpoint):
    code, out, err = run_cli("generate", checkpoint, "--prompt", "w1 w2", "--max-new-tokens", "3", "--greedy")
    assert code == 0 and out.startswith("w1 w2"), (out, err)
