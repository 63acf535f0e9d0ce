"""Zoo models through transformers: Auto classes, generate() on the recurrent state, the tokenizer in the
transformers layout, the model card, bad directories; lm-evaluation-harness and trust_remote_code (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

import xlstm_zoo  # noqa: E402  (registers model_type xlstm_zoo)
from xlstm_zoo.checkpoint import save_checkpoint  # noqa: E402
from xlstm_zoo.errors import ConfigError  # noqa: E402
from xlstm_zoo.model_files.files import model_files  # noqa: E402
from xlstm_zoo.training.trainer import cli_command  # noqa: E402
from xlstm_zoo.tasks.tokenizer import BPETokenizer, BPETokenizerConfig, BytesTokenizer, saved_tokenizer  # noqa: E402

AutoConfig, AutoModelForCausalLM, AutoTokenizer = (transformers.AutoConfig, transformers.AutoModelForCausalLM,
                                                   transformers.AutoTokenizer)
# xLSTM[1:1] with a Llama attention block: recurrent states and an attention cache in one state tuple
HYBRID = ["model.vocab_size=257", "model.dim=16", "model.stack.pattern=msa", "model.stack.blocks.a.cell.max_cache=256"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: a second thread only adds synchronisation (10x slower per op on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny hybrid saved with save_pretrained(layout="zoo") and the bytes tokenizer."""
    torch.manual_seed(0)
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_attention_hybrid", HYBRID)).eval()
    directory = tmp_path_factory.mktemp("hf") / "model"
    xlstm_zoo.save_pretrained(model, directory, tokenizer=BytesTokenizer(), license="apache-2.0")
    return model, directory


def prompts(n=2, length=7, vocab=256):
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))


def test_auto_classes_give_the_zoo_models_logits(saved, tmp_path):
    model, directory = saved
    config = AutoConfig.from_pretrained(directory)
    assert type(config).__name__ == "XlstmZooConfig" and config.max_position_embeddings == 256
    hf = AutoModelForCausalLM.from_pretrained(directory)
    ids = prompts()
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, model(ids)[0])
    # a training checkpoint (what the trainer writes: optimiser, state, the transformers files) loads too
    recipe = xlstm_zoo.load_recipe("xlstm_attention_hybrid", HYBRID)
    save_checkpoint(tmp_path / "checkpoint", recipe, model, optimizer={}, step=3,
                    files=model_files(recipe, model, BytesTokenizer()))
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")(ids).logits, model(ids)[0])


def test_generate_equals_the_zoos_and_steps_once_per_new_token(saved, monkeypatch):
    model, directory = saved
    hf = AutoModelForCausalLM.from_pretrained(directory)
    ids, new = prompts(), 8
    assert torch.equal(hf.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None),
                       model.generate(ids, new, greedy=True))
    torch.manual_seed(5)
    sampled = hf.generate(ids, max_new_tokens=new, do_sample=True, temperature=0.7, top_k=20, eos_token_id=None)
    torch.manual_seed(5)
    assert torch.equal(sampled, model.generate(ids, new, temperature=0.7, top_k=20))
    calls = []
    zoo = hf.zoo
    monkeypatch.setattr(zoo, "forward", lambda tokens, *a, **k: calls.append(tokens.shape[1]) or
                        type(zoo).forward(zoo, tokens, *a, **k))
    monkeypatch.setattr(zoo, "step", lambda token, *a, **k: calls.append("step") or type(zoo).step(zoo, token, *a, **k))
    hf.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None)
    assert calls == [ids.shape[1]] + ["step"] * (new - 1), "the prompt is read once, then one step per token"


def test_beam_search_reorders_the_state_rows(saved):
    _, directory = saved
    hf = AutoModelForCausalLM.from_pretrained(directory)
    ids = prompts()
    cached = hf.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False, eos_token_id=None)
    reread = hf.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False, eos_token_id=None, use_cache=False)
    assert torch.equal(cached, reread), "beam search on the reordered state = re-reading every beam's prefix"


def test_left_padded_rows_generate_as_alone(saved):
    model, directory = saved
    hf = AutoModelForCausalLM.from_pretrained(directory)
    short, long = prompts(1, 4)[0], prompts(1, 9)[0]
    batch = torch.stack([torch.cat([torch.zeros(5, dtype=torch.long), short]), long])
    mask = (torch.arange(9) >= torch.tensor([[5], [0]])).long()
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, eos_token_id=None,
                      pad_token_id=0)
    assert torch.equal(out[0, 9:], model.generate(short[None], 5, greedy=True)[0, 4:])
    assert torch.equal(out[1], model.generate(long[None], 5, greedy=True)[0])
    with pytest.raises(xlstm_zoo.errors.InputError, match="pad on the left or on the right only"):
        hf(batch, attention_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9]))


def test_the_tokenizer_travels_in_the_transformers_layout(saved, tmp_path):
    model, directory = saved
    tokenizer = AutoTokenizer.from_pretrained(directory)
    texts = ["plain ascii", "häßliche Grüße 😀 日本", "tab\tnew\nline", ""]
    assert [tokenizer(t)["input_ids"] for t in texts] == [list(t.encode()) for t in texts]
    assert tokenizer.eos_token_id == BytesTokenizer.eod_id and tokenizer.decode(list("Grüße".encode())) == "Grüße"
    assert isinstance(saved_tokenizer(directory, vocab_size=257), BytesTokenizer)
    pytest.importorskip("tokenizers", reason="bpe needs the tokenizers test extra")
    bpe = BPETokenizer(BPETokenizerConfig(vocab_size=300))
    bpe.fit([" ".join(texts * 40)] * 3, tmp_path)
    for name, text in bpe.hf_files().items():
        (tmp_path / name).write_text(text)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert [loaded(t)["input_ids"] for t in texts] == [list(ids) for ids in bpe.encode_batch(texts)]
    assert loaded.eos_token == "<|endoftext|>" and loaded.eos_token_id == bpe.eod_id
    with pytest.raises(ConfigError, match=r"tokenizer\.json: the tokenizer has ids up to 256 but the model.s vocabulary is 100"):
        saved_tokenizer(directory, vocab_size=100)


def test_bad_directories_are_one_line(saved, tmp_path):
    _, directory = saved
    config = json.loads((directory / "config.json").read_text())

    def load_edited(edit):
        target = tmp_path / "edited"
        if not target.exists():
            target.mkdir()
            for f in directory.iterdir():
                (target / f.name).write_bytes(f.read_bytes())
        data = json.loads(json.dumps(config))
        edit(data)
        (target / "config.json").write_text(json.dumps(data))
        with pytest.raises(ConfigError) as err:
            AutoModelForCausalLM.from_pretrained(target)
        assert "\n" not in str(err.value)
        return str(err.value)

    newer = load_edited(lambda d: d["xlstm_zoo"].update(version="9.0.0", format=9))
    assert "written by xlstm-zoo 9.0.0 in checkpoint format 9; this is xlstm-zoo 0.1.0" in newer

    def plugin_cell(d):
        d["recipe"]["model"]["stack"]["blocks"]["m"]["cell"]["type"] = "mingru"
        d["xlstm_zoo"]["plugins"] = {"cell:mingru": "xlstm-zoo-mingru 0.3.0"}
    missing = load_edited(plugin_cell)
    assert "recipe.model.stack.blocks.m.cell.type: cell 'mingru' comes from the plugin xlstm-zoo-mingru 0.3.0" \
        in missing and "pip install xlstm-zoo-mingru" in missing
    invalid = load_edited(lambda d: d["recipe"]["model"].update(dim=-4))
    assert "config.json: recipe.model.dim:" in invalid


def test_model_card_says_what_made_the_model(saved, tmp_path, run_cli, monkeypatch):
    model, directory = saved
    card = (directory / "README.md").read_text()
    for expected in ("license: apache-2.0", "library_name: xlstm-zoo", "| parameters |", "| non-embedding parameters |",
                     "| tokenizer | bytes, 257 tokens", "| training data |", "## Recipe", "pattern: msa"):
        assert expected in card, expected
    # a run's checkpoint: the step and command from its state.json, the last evaluation from metrics.jsonl
    monkeypatch.setattr(sys, "argv", ["/venv/bin/xlstm-zoo", "train", "lm.yaml", "--out", "run"])
    recipe = xlstm_zoo.load_recipe("xlstm_attention_hybrid", HYBRID + ["train.steps=40", "train.warmup_steps=1"])
    save_checkpoint(tmp_path / "run" / "checkpoint", recipe, model, step=40, **cli_command())
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"step": 40, "split": "valid", "loss": 1.25,
                                                                "bits_per_byte": 1.8}) + "\n")
    code, _, err = run_cli("convert", tmp_path / "run" / "checkpoint", "--out", tmp_path / "converted",
                           "--license", "mit")
    assert code == 0, err
    card = (tmp_path / "converted" / "README.md").read_text()
    for expected in ("license: mit", "| training | 40 of 40 steps", "`xlstm-zoo train lm.yaml --out run`",
                     "| valid | 1.25 |"):
        assert expected in card, expected
    mine = tmp_path / "mine"  # a card that is not ours (an upstream one) is kept as it is
    mine.mkdir()
    for f in directory.iterdir():
        (mine / f.name).write_bytes(f.read_bytes())
    (mine / "README.md").write_text("upstream card")
    code, _, err = run_cli("convert", mine, "--out", tmp_path / "again")
    assert code == 0, err
    assert (tmp_path / "again" / "README.md").read_text() == "upstream card"
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / "again" / name).is_file(), name


@pytest.mark.slow
def test_trust_remote_code_loads_without_importing_the_zoo(saved, tmp_path):
    model, directory = saved
    ids = prompts()
    script = ("import sys, torch, transformers\n"
              f"m = transformers.AutoModelForCausalLM.from_pretrained({str(directory)!r}, trust_remote_code=True)\n"
              f"print(m(torch.tensor({ids.tolist()})).logits.sum().item())\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    with torch.no_grad():
        assert float(out.stdout.split()[-1]) == pytest.approx(model(ids)[0].sum().item(), abs=1e-4)
    plain = subprocess.run([sys.executable, "-c", "import sys, xlstm_zoo; print('transformers' in sys.modules)"],
                           capture_output=True, text=True, timeout=300)
    assert plain.stdout.strip() == "False", "import xlstm_zoo does not import transformers"
    blocked = subprocess.run([sys.executable, "-W", "error", "-c",
                              "import sys; sys.modules['transformers'] = None; import xlstm_zoo"],
                             capture_output=True, text=True, timeout=300)
    assert blocked.returncode == 0, "the zoo imports without transformers: " + blocked.stderr[-1000:]


@pytest.mark.slow
def test_lm_eval_scores_a_zoo_checkpoint_as_the_zoo_does(saved):
    lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is a test dependency")
    from lm_eval.tasks import TaskManager
    model, directory = saved
    tasks = TaskManager(include_path=str(Path(xlstm_zoo.interop.__file__).parent / "lm_eval_tasks"))
    result = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={directory},backend=causal",
                                     tasks=["xlstm_zoo_lastword"], task_manager=tasks, batch_size=4, device="cpu",
                                     limit=12, bootstrap_iters=0, log_samples=True)
    samples = result["samples"]["xlstm_zoo_lastword"]
    assert len(samples) == 12 and "perplexity,none" in result["results"]["xlstm_zoo_lastword"]
    for sample in samples:
        (context, continuation), = sample["arguments"]
        ids, n = list((context + continuation).encode()), len(continuation.encode())
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0][0, -n - 1:-1]
        zoo = -torch.nn.functional.cross_entropy(logits.float(), torch.tensor(ids[-n:]), reduction="sum").item()
        assert sample["resps"][0][0][0] == pytest.approx(zoo, abs=1e-5), (context, continuation)
