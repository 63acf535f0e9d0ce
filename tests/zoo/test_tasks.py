"""Tasks: the batch contract for every registered task, answers checked by independent solvers,
metrics, and the byte-level corpus (split, windows, errors).

Contract tests iterate the registry, so a newly registered task is covered the moment it exists.
The solvers below are written from the task docstrings only (the documented vocabularies and
definitions), in plain Python over token lists; they never call task code to compute an answer.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import math
import re
import shutil
import sysconfig
from collections import Counter
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import registry
from xlstm_zoo.tasks import IGNORE, SPLITS, Batch, merge_scores

TASKS = registry.names("task")
FORMAL = ["parity", "even_pairs", "cycle_nav", "majority", "majority_count", "mod_arith_no_brackets",
          "mod_arith_brackets", "solve_equation", "bucket_sort", "missing_duplicate"]


def make(name, **fields):
    entry = registry.get("task", name)
    return entry.builder(entry.config.model_validate({"type": name, **fields}), None)


@functools.lru_cache(maxsize=None)
def default(name):
    return make(name)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_every_paper_task_is_registered():
    # FORMAL holds the task names of the paper's state-tracking table (shared/paper/formal_languages.csv)
    assert set(FORMAL) | {"mqar", "nn_search", "byte_lm"} <= set(TASKS)
    assert all(registry.get("task", name).source == "xlstm-zoo" for name in FORMAL)


# -- the contract, for every registered task ----------------------------------------------------

def check_batch(task, batch: Batch, batch_size: int, split: str):
    tokens, targets = batch.tokens, batch.targets
    assert tokens.dtype == torch.long and targets.dtype == torch.long
    assert tokens.ndim == 2 and tokens.shape == targets.shape and tokens.shape[0] == batch_size
    assert int(tokens.min()) >= 0 and int(tokens.max()) < task.vocab_size, "token outside the vocabulary"
    scored = targets != IGNORE
    assert bool(((targets >= 0) & (targets < task.vocab_size) | ~scored).all()), "target outside the vocabulary"
    assert bool(scored.any(dim=1).all()), "a sequence without a scored position"
    if hasattr(task, "length_range"):
        lo, hi = task.length_range(split)
        assert lo <= tokens.shape[1] <= hi, f"{split}: T={tokens.shape[1]} outside [{lo}, {hi}]"


@pytest.mark.parametrize("name", TASKS)
def test_batches_honour_the_contract(name):
    task = default(name)
    assert isinstance(task.vocab_size, int) and task.vocab_size >= 2
    for split in SPLITS:
        for seed in range(3):
            check_batch(task, task.batch(split, 5, gen(seed)), 5, split)
        total = 0
        for batch in task.eval_batches(split):
            check_batch(task, batch, batch.tokens.shape[0], split)
            total += batch.tokens.shape[0]
        expected = getattr(task.config, "eval_sequences", getattr(task.config, "eval_windows", None))
        assert total == expected, f"{split} eval set holds {total} sequences, config says {expected}"
    with pytest.raises(ValueError, match="unknown split"):
        task.batch("training", 2, gen(0))


@pytest.mark.parametrize("name", TASKS)
def test_generation_is_deterministic(name):
    task = default(name)
    for split in SPLITS:
        a, b = task.batch(split, 6, gen(7)), task.batch(split, 6, gen(7))
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets), "same seed, different batch"
        c = task.batch(split, 6, gen(8))
        assert a.tokens.shape != c.tokens.shape or not torch.equal(a.tokens, c.tokens), "different seeds, same batch"
    first = [(b.tokens, b.targets) for b in task.eval_batches("test")]
    first[0][0].fill_(0)  # editing a returned batch must not change the cached set
    again = [(b.tokens, b.targets) for b in task.eval_batches("test")]
    fresh = [(b.tokens, b.targets) for b in make(name).eval_batches("test")]
    assert len(again) == len(fresh) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                            for x, y in zip(again, fresh)), "eval set differs between calls"
    valid = [b.tokens for b in task.eval_batches("valid")]
    assert not (len(valid) == len(again) and all(v.shape == t.shape and torch.equal(v, t)
                                                 for v, (t, _) in zip(valid, again))), "valid and test sets equal"


@pytest.mark.parametrize("name", TASKS)
def test_train_and_test_lengths(name):
    task = default(name)
    if registry.get("task", name).source != "xlstm-zoo" and not hasattr(task, "length_range"):
        return  # length_range is not part of the Task contract; every built-in task has one
    assert task.length_range("valid") == task.length_range("train"), "valid must use train lengths"
    if name == "mqar":  # same distribution by default (the paper sweeps sizes with grid axes); configurable
        assert task.length_range("test") == task.length_range("train")
        task = make("mqar", test_context_length=128, test_num_kv_pairs=16)
    train, test = task.length_range("train"), task.length_range("test")
    assert test[1] > train[1], f"test lengths {test} are not longer than train lengths {train}"
    seen = {split: {task.batch(split, 2, gen(s)).tokens.shape[1] for s in range(20)} for split in ("train", "test")}
    assert all(train[0] <= t <= train[1] for t in seen["train"]) and all(test[0] <= t <= test[1] for t in seen["test"])
    if name in FORMAL or name == "nn_search":
        assert len(seen["train"]) > 3 and len(seen["test"]) > 3, "lengths should vary within a split"
        assert min(seen["test"]) > max(seen["train"]), "default test lengths are beyond the train lengths"


@pytest.mark.parametrize("name", TASKS)
def test_config_fields_are_documented(name):
    config = registry.get("task", name).config
    missing = [f for f, info in config.model_fields.items() if f != "type" and not info.description]
    assert not missing, f"{name}: fields without a description: {missing}"


DEFAULT_VOCAB = {"parity": 5, "even_pairs": 5, "cycle_nav": 9, "majority": 129, "majority_count": 321,
                 "mod_arith_no_brackets": 14, "mod_arith_brackets": 16, "solve_equation": 17, "bucket_sort": 11,
                 "missing_duplicate": 22, "mqar": 129, "nn_search": 145, "byte_lm": 256}


@pytest.mark.parametrize("name", sorted(DEFAULT_VOCAB))
def test_documented_vocab_sizes(name):
    assert default(name).vocab_size == DEFAULT_VOCAB[name]


# -- independent solvers for the formal languages ---------------------------------------------
# Each returns the answer values (a list) for the input ids, given the documented vocabulary.

def n_inputs(name, cfg):
    """Number of input symbols I (SEP is id I, answer value v is id I + 1 + v), from the docstrings."""
    fixed = {"parity": 2, "even_pairs": 2, "cycle_nav": 3}
    if name in fixed:
        return fixed[name]
    if name in ("mod_arith_no_brackets", "mod_arith_brackets", "solve_equation"):
        return cfg.modulus + {"mod_arith_no_brackets": 3, "mod_arith_brackets": 5, "solve_equation": 6}[name]
    return cfg.num_symbols + (name == "missing_duplicate")  # majority, majority_count, bucket_sort, missing_duplicate


def as_text(x, m, symbols):
    return "".join(str(t) if t < m else symbols[t - m] for t in x)


def solve_parity(x, cfg):
    return [x.count(1) % 2]


def solve_even_pairs(x, cfg):
    s = "".join("ab"[t] for t in x)
    return [(s.count("ab") + s.count("ba")) % 2]


def solve_cycle_nav(x, cfg):
    pos = 0
    for t in x:
        pos = (pos + {0: 0, 1: 1, 2: -1}[t]) % cfg.cycle_length
    return [pos]


def solve_majority(x, cfg):
    counts = Counter(x)
    best = max(counts.values())
    return [min(s for s, c in counts.items() if c == best)]


def solve_majority_count(x, cfg):
    cap = cfg.max_count or max(cfg.train_lengths[1], cfg.test_lengths[1])
    return [min(max(Counter(x).values()), cap) - 1]


def solve_mod_arith_no_brackets(x, cfg):
    m = cfg.modulus
    text = as_text(x, m, "+-*")
    assert len(x) % 2 == 1 and all(t < m for t in x[0::2]) and all(t >= m for t in x[1::2])
    assert {c for c in text[1::2]} <= set(cfg.operators)
    return [eval(text) % m]  # Python's own precedence: * before + and -, left to right


def solve_mod_arith_brackets(x, cfg):
    m = cfg.modulus
    text = as_text(x, m, "+-*()")
    ast.parse(text, mode="eval")  # a well-formed expression
    assert text.count("(") == text.count(")")
    return [eval(text) % m]


def solve_solve_equation(x, cfg):
    m = cfg.modulus
    text = as_text(x, m, "+-()x=")
    lhs, rhs = text.split("=")
    assert lhs.count("x") == 1 and rhs.isdigit() and int(rhs) < m
    solutions = [v for v in range(m) if eval(lhs.replace("x", f"({v})")) % m == int(rhs)]
    assert len(solutions) == 1, f"{text}: solutions {solutions}"
    return solutions


def solve_bucket_sort(x, cfg):
    return sorted(x)


def solve_missing_duplicate(x, cfg):
    k, mask = len(x) // 2, cfg.num_symbols
    first, copy = x[:k], x[k:]
    holes = [i for i, t in enumerate(copy) if t == mask]
    assert len(x) % 2 == 0 and len(holes) == 1 and mask not in first
    assert all(a == b for i, (a, b) in enumerate(zip(first, copy)) if i != holes[0])
    return [first[holes[0]]]


def sample_sequences(task, count=300, batch_size=50):
    """``count`` sequences from every split's batches and the test eval set (short and long)."""
    batches, seed = [], 0
    while sum(b.tokens.shape[0] for b in batches) < count:
        split = ("train", "test")[seed % 2]
        batches.append(task.batch(split, batch_size, gen(100 + seed)))
        seed += 1
    batches.append(next(iter(task.eval_batches("test"))))
    return [(b.tokens[i].tolist(), b.targets[i].tolist()) for b in batches for i in range(b.tokens.shape[0])]


@pytest.mark.parametrize("name", FORMAL)
@pytest.mark.parametrize("variant", ["default", "small"])
def test_formal_answers_match_a_brute_force_solver(name, variant):
    alt = {"cycle_nav": dict(cycle_length=3), "majority": dict(num_symbols=3),
           "majority_count": dict(num_symbols=2, max_count=6),  # clipped counts
           "mod_arith_no_brackets": dict(modulus=7, operators=["*", "-"]),
           "mod_arith_brackets": dict(modulus=3, operators=["*"]),
           "solve_equation": dict(modulus=11),  # two-digit numbers in the text
           "bucket_sort": dict(num_symbols=3), "missing_duplicate": dict(num_symbols=2)}
    overrides = dict(train_lengths=(1, 12), test_lengths=(13, 60), **alt.get(name, {})) if variant == "small" else {}
    if name == "missing_duplicate" and variant == "small":
        overrides.update(train_lengths=(2, 12))
    task = make(name, **overrides)
    cfg = task.config
    sep = n_inputs(name, cfg)
    solver = globals()[f"solve_{name}"]
    answers = Counter()
    for tokens, targets in sample_sequences(task):
        assert tokens.count(sep) == 1, "exactly one separator"
        at = tokens.index(sep)
        inputs = tokens[:at]
        assert all(t < sep for t in inputs), "input ids are below the separator"
        assert all(t == IGNORE for t in targets[:at]), "nothing is scored before the separator"
        expected = solver(inputs, cfg)
        got = [t - sep - 1 for t in targets[at:]]
        assert got == expected, f"{name}: {task.decode(tokens)} -> {got}, solver says {expected}"
        assert tokens[at + 1:] == targets[at:-1], "answer tokens are fed back (teacher forcing)"
        assert task.vocab_size > max(targets), "answer id inside the vocabulary"
        answers.update(expected)
    assert len(answers) >= 2, f"{name}: the answers never vary ({answers})"


@pytest.mark.parametrize("name", ["parity", "mod_arith_no_brackets", "bucket_sort"])
def test_one_length_per_training_input(name):
    task = make(name, train_lengths=(1, 12), train_length_per="input")
    sep, lengths = n_inputs(name, task.config), set()
    batch = task.batch("train", 64, gen(3))
    again = task.batch("train", 64, gen(3))
    assert torch.equal(batch.tokens, again.tokens) and torch.equal(batch.targets, again.targets), "deterministic"
    for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist()):
        end = max(i for i, t in enumerate(targets) if t != IGNORE) + 1  # the row's last answer token
        at = tokens.index(sep)
        assert globals()[f"solve_{name}"](tokens[:at], task.config) == [t - sep - 1 for t in targets[at:end]]
        assert tokens[at + 1:end] == targets[at:end - 1], "answer tokens are fed back (teacher forcing)"
        assert set(tokens[end:]) <= {sep} and set(targets[end:]) <= {IGNORE}, "padded after the answer, not scored"
        lengths.add(at)
    assert len(lengths) >= 4, f"one length per input: {sorted(lengths)}"
    assert len({b.tokens.shape[1] for b in task.eval_batches("valid")}) > 1, "evaluation: one length per batch"


# -- retrieval ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [{}, dict(num_kv_pairs=5, context_length=17, num_keys=5, num_values=3,
                                             test_num_kv_pairs=2, test_context_length=40)])
def test_mqar_answers_match_a_brute_force_solver(fields):
    task = make("mqar", **fields)
    cfg = task.config
    keys, values = cfg.num_keys, cfg.num_values
    blank = keys + values
    pairs_at = {cfg.context_length: cfg.num_kv_pairs}
    pairs_at[cfg.test_context_length or cfg.context_length] = cfg.test_num_kv_pairs or cfg.num_kv_pairs
    for tokens, targets in sample_sequences(task, count=300):
        n_pairs = pairs_at[len(tokens)]
        pairs = tokens[:2 * n_pairs]
        bound = dict(zip(pairs[0::2], pairs[1::2]))
        assert all(k < keys for k in pairs[0::2]) and all(keys <= v < blank for v in pairs[1::2])
        assert len(bound) == n_pairs, "keys in a sequence are distinct"
        assert all(t == IGNORE for t in targets[:2 * n_pairs])
        queried = []
        for t, target in zip(tokens[2 * n_pairs:], targets[2 * n_pairs:]):
            if target == IGNORE:
                assert t == blank, "only query positions hold keys after the pairs"
            else:
                assert target == bound[t], "the target at a query is the value bound to its key"
                queried.append(t)
        assert sorted(queried) == sorted(bound), "every key is queried exactly once"


@pytest.mark.parametrize("fields", [{}, dict(train_pairs=(1, 4), test_pairs=(5, 9), num_keys=9, num_values=3)])
def test_nn_search_answers_match_a_brute_force_solver(fields):
    task = make("nn_search", **fields)
    k, v = task.config.num_keys, task.config.num_values
    ties = 0
    for tokens, targets in sample_sequences(task, count=400):
        assert tokens[-1] == k + v and all(t == IGNORE for t in targets[:-1])
        *pairs, query = tokens[:-1]
        keys, values = pairs[0::2], pairs[1::2]
        assert len(set(keys)) == len(keys) and all(x < k for x in keys + [query])
        assert all(k <= x < k + v for x in values)
        best = min(range(len(keys)), key=lambda i: (abs(keys[i] - query), keys[i]))
        ties += sum(abs(x - query) == abs(keys[best] - query) for x in keys) > 1
        assert targets[-1] == values[best], f"query {query}, keys {keys}: expected the value of key {keys[best]}"
    if fields:
        assert ties > 0, "the small configuration should exercise the tie-break"


# -- metrics -----------------------------------------------------------------------------------

def perfect_logits(batch, vocab):
    return torch.nn.functional.one_hot(batch.targets.clamp(min=0), vocab).float() * 50.0


@pytest.mark.parametrize("name", TASKS)
def test_perfect_and_random_predictions(name):
    task = default(name)
    batches = list(task.eval_batches("valid"))
    perfect = task.summarize(merge_scores(task.score(perfect_logits(b, task.vocab_size), b) for b in batches))
    assert perfect["accuracy"] == 1.0
    assert perfect.get("sequence_accuracy", 1.0) == 1.0
    assert perfect["loss"] < 1e-6 and perfect["headline"] == perfect[task.headline]
    assert isinstance(task.higher_is_better, bool)
    # constant logits: the loss is exactly ln(vocab); random logits: accuracy is chance, 1/vocab
    flat = task.summarize(merge_scores(task.score(torch.zeros(*b.tokens.shape, task.vocab_size), b) for b in batches))
    assert flat["loss"] == pytest.approx(math.log(task.vocab_size), rel=1e-5)
    g = gen(3)
    parts = [task.score(torch.randn(*b.tokens.shape, task.vocab_size, generator=g), b) for b in batches]
    sums = merge_scores(parts)
    acc, n = sums["accuracy"][0] / sums["accuracy"][1], sums["accuracy"][1]
    p = 1 / task.vocab_size
    assert abs(acc - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9, f"random accuracy {acc:.4f}, chance {p:.4f} (n={n})"
    assert sums["loss"][1] == sum(int((b.targets != IGNORE).sum()) for b in batches), "sums count every scored position"


def test_byte_lm_metrics():
    task = default("byte_lm")
    assert task.headline == "bits_per_byte" and task.higher_is_better is False
    batch = next(iter(task.eval_batches("valid")))
    out = task.summarize(task.score(torch.randn(*batch.tokens.shape, 256, generator=gen(0)) * 3, batch))
    assert out["perplexity"] == pytest.approx(math.exp(out["loss"]), rel=1e-12)
    assert out["bits_per_byte"] == pytest.approx(out["loss"] / math.log(2), rel=1e-12)
    assert out["headline"] == out["bits_per_byte"]
    flat = task.summarize(task.score(torch.zeros(*batch.tokens.shape, 256), batch))
    assert flat["bits_per_byte"] == pytest.approx(8.0, rel=1e-5) and flat["perplexity"] == pytest.approx(256, rel=1e-4)


# -- byte_lm corpus ----------------------------------------------------------------------------

def write_corpus(root: Path, files: int = 30) -> dict[str, bytes]:
    g = torch.Generator().manual_seed(11)
    contents = {}
    for i in range(files):
        rel = f"pkg{i % 3}/mod_{i:02d}.py" if i % 2 else f"mod_{i:02d}.py"
        letters = torch.randint(97, 123, (200 + 7 * i,), generator=g).tolist()
        contents[rel] = f"# file {i}\n".encode() + bytes(letters)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(contents[rel])
    (root / "notes.txt").write_text("not python " * 50)
    (root / "site-packages").mkdir()
    (root / "site-packages" / "vendored.py").write_text("x = 1\n" * 100)
    return contents


def stable_held_out(rel, fraction):
    return int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=8).digest(), "big") / 2**64 < fraction


def test_byte_lm_split_and_windows(tmp_path):
    corpus = tmp_path / "corpus"
    contents = write_corpus(corpus)
    task = make("byte_lm", path=str(corpus), context_length=32, valid_fraction=0.3, eval_windows=40, eval_batch_size=16)
    train, valid = set(task.train_files), set(task.valid_files)
    assert train and valid and not train & valid, "train and held-out files are disjoint and non-empty"
    assert train | valid == set(contents), "every matching file is read; .txt and site-packages are not"
    assert valid == {rel for rel in contents if stable_held_out(rel, 0.3)}, "split by blake2b of the relative path"
    train_text = b"".join(contents[r] for r in sorted(train))
    valid_text = b"".join(contents[r] for r in sorted(valid))
    batch = task.batch("train", 16, gen(0))
    assert batch.tokens.shape == (16, 32) and torch.equal(batch.tokens[:, 1:], batch.targets[:, :-1])
    for row in torch.cat([batch.tokens, batch.targets[:, -1:]], dim=1).tolist():
        assert bytes(row) in train_text
    for split, window in (("valid", 32), ("test", 64)):
        for b in task.eval_batches(split):
            assert b.tokens.shape[1] == window
            for row in torch.cat([b.tokens, b.targets[:, -1:]], dim=1).tolist():
                assert bytes(row) in valid_text and bytes(row) not in train_text
    # relative paths only: the same corpus elsewhere splits and evaluates identically
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(corpus, moved)
    again = make("byte_lm", path=str(moved), context_length=32, valid_fraction=0.3, eval_windows=40, eval_batch_size=16)
    assert (again.train_files, again.valid_files) == (task.train_files, task.valid_files)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(again.eval_batches("test"), task.eval_batches("test")))
    # max_bytes caps what is read, files in sorted order
    capped = make("byte_lm", path=str(corpus), context_length=8, max_bytes=2000, valid_fraction=0.3)
    assert capped._text["train"].numel() + capped._text["held_out"].numel() == 2000
    assert set(capped.train_files) | set(capped.valid_files) == set(sorted(contents)[:len(capped.train_files) +
                                                                                     len(capped.valid_files)])


def test_byte_lm_keeps_both_splits_non_empty(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.py").write_text(f"# {i}\n" + "abc " * 100)
    low = make("byte_lm", path=str(tmp_path), context_length=16, valid_fraction=1e-9)
    high = make("byte_lm", path=str(tmp_path), context_length=16, valid_fraction=1 - 1e-9)
    for task in (low, high):
        assert len(task.train_files) >= 1 and len(task.valid_files) >= 1
        assert not set(task.train_files) & set(task.valid_files)


def test_byte_lm_single_file(tmp_path):
    text = bytes(range(256)) * 8
    (tmp_path / "one.bin").write_bytes(text)
    task = make("byte_lm", path=str(tmp_path / "one.bin"), context_length=16, valid_fraction=0.25)
    assert task._text["train"].numel() == 1536 and bytes(task._text["held_out"].tolist()) == text[1536:]
    assert task.batch("test", 3, gen(0)).tokens.shape == (3, 32)
    # a folder holding one matching file splits it the same way
    folder = make("byte_lm", path=str(tmp_path), glob="*.bin", context_length=16, valid_fraction=0.25)
    assert torch.equal(folder._text["held_out"], task._text["held_out"]) and folder.valid_files == ["one.bin"]


def test_byte_lm_default_corpus_is_the_stdlib():
    task = default("byte_lm")
    assert task.root == Path(sysconfig.get_paths()["stdlib"])
    assert len(task.train_files) > 10 and len(task.valid_files) > 0
    assert all(f.endswith(".py") and "site-packages" not in f for f in task.train_files + task.valid_files)
    total = task._text["train"].numel() + task._text["held_out"].numel()
    assert total == task.config.max_bytes, "a stdlib tree is larger than the default cap"
    check_batch(task, task.batch("train", 4, gen(0)), 4, "train")


def test_byte_lm_bad_inputs(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="does not exist") as err:
        make("byte_lm", path=str(missing))
    assert str(missing) in str(err.value) and err.value.path == "task.path"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("hello " * 100)
    with pytest.raises(ConfigError, match=r"holds no files matching '\*\.py'") as err:
        make("byte_lm", path=str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(err.value)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "a.py").write_text("x = 1\n")
    (tmp_path / "tiny" / "b.py").write_text("y = 2\n")
    with pytest.raises(ConfigError, match="too small") as err:
        make("byte_lm", path=str(tmp_path / "tiny"), context_length=64)
    assert "needs 65" in str(err.value) and str(tmp_path / "tiny") in str(err.value)
    with pytest.raises(ConfigError, match="too small"):
        make("byte_lm", path=str(tmp_path / "empty" / "readme.txt"), context_length=400)


# -- config validation -------------------------------------------------------------------------

@pytest.mark.parametrize("name, fields, message", [
    ("parity", dict(train_lengths=(5, 3)), "lo <= hi"),
    ("parity", dict(test_lengths=(0, 3)), ">= 1"),
    ("missing_duplicate", dict(train_lengths=(3, 3)), "no even length"),
    ("mod_arith_no_brackets", dict(test_lengths=(4, 4)), "no odd length"),
    ("mod_arith_brackets", dict(operators=["+", "+"]), "must not repeat"),
    ("mod_arith_brackets", dict(operators=["/"]), "'+', '-' or '*'"),
    ("cycle_nav", dict(cycle_length=1), "greater than or equal to 2"),
    ("mqar", dict(num_kv_pairs=30), "too short"),
    ("mqar", dict(test_num_kv_pairs=100, test_context_length=400), "distinct keys"),
    ("nn_search", dict(test_pairs=(10, 200)), "num_keys=128"),
    ("byte_lm", dict(valid_fraction=1.0), "less than 1"),
    ("parity", dict(train_length=(1, 2)), "did you mean 'train_lengths'"),
])
def test_bad_configs_are_rejected_clearly(name, fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        registry.get("task", name).config.model_validate({"type": name, **fields})


@pytest.mark.parametrize("name, answers", [("parity", 2), ("cycle_nav", 5), ("mod_arith_no_brackets", 5)])
def test_scaled_accuracy_is_zero_at_chance_and_one_when_perfect(name, answers):
    from xlstm_zoo.recipe_loader import load_recipe
    from xlstm_zoo.training.trainer import build_task

    task = build_task(load_recipe({"model": {"type": "causal_lm", "vocab_size": None}, "task": {"type": name}}))
    assert len(task.answer_symbols) == answers
    assert task.summarize({"accuracy": (1.0, answers)})["scaled_accuracy"] == pytest.approx(0.0)
    assert task.summarize({"accuracy": (10.0, 10)})["scaled_accuracy"] == pytest.approx(1.0)
    assert task.summarize({"accuracy": (0.0, 10)})["scaled_accuracy"] < 0
