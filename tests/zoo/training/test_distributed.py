"""Data-parallel training: 2 gloo ranks under torchrun equal one process accumulating the same two
halves bitwise, match the plain trainer to rounding, write once, resume after a rank dies, and stop
together when the loss diverges."""

import os
import subprocess
import sys
import time

import pytest
import torch
import yaml
from metrics_records import untimed

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.config import digest_dump
from xlstm_zoo.grid.expand import recipe_digest
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import train

pytestmark = pytest.mark.slow  # torchrun process groups (.ci/run runs the slow tier)

RECIPE = {
    "name": "ddp",
    "model": {"type": "causal_lm", "vocab_size": None, "dim": 16,
              "stack": {"type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
    "task": {"type": "parity", "train_lengths": [2, 6], "test_lengths": [7, 8], "eval_sequences": 64},
    "train": {"steps": 40, "batch_size": 16, "lr": 0.01, "warmup_steps": 2, "log_every": 5, "checkpoint_every": 10,
              "eval_every": 20, "eval_splits": ["valid"]},
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# A torchrun entry for fault injection (test-only): patches the trainer, then runs the command line.
DRIVER = """
import os, sys
from pathlib import Path
import torch
from xlstm_zoo.training import trainer
from xlstm_zoo.tasks.base import Task
rank, fault, marker = int(os.environ["RANK"]), os.environ["FAULT"], Path(os.environ["MARKER"])
if fault == "die" and rank == 1 and not marker.exists():
    plain = trainer._step_generator
    def dying(seed, step):
        if step == 25:          # rank 1 dies before its 26th step (checkpoint at 20), once
            marker.touch()
            os._exit(1)
        return plain(seed, step)
    trainer._step_generator = dying
if fault == "nan" and rank == 1:
    calls = [0]
    loss_sum = Task.loss_sum
    def poisoned(self, logits, batch):
        calls[0] += 1
        value = loss_sum(self, logits, batch)
        return value * float("nan") if calls[0] == 5 else value
    Task.loss_sum = poisoned
from xlstm_zoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def torchrun(tmp_path, out, fault="none", timeout=300):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    env = {**ENV, "FAULT": fault, "MARKER": str(tmp_path / "died")}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(driver), "train", str(recipe), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    return proc, time.time() - started


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One uninterrupted 2-rank run through `xlstm-zoo train --nproc 2` (later tests compare to it)."""
    tmp = tmp_path_factory.mktemp("ddp")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "xlstm_zoo", "train", str(recipe), "--nproc", "2", "--out", str(out),
                           "--report-to", "tensorboard"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def in_process(tmp_path, micro_batches):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun rank
    try:
        out = tmp_path / f"mb{micro_batches}"
        train(load_recipe(RECIPE, [f"train.micro_batches={micro_batches}"]), out)
        return out
    finally:
        torch.set_num_threads(threads)


def states(out):
    _, model, extra = load_checkpoint(out / "checkpoint")
    return model.state_dict(), extra


def test_two_ranks_equal_one_process_accumulating_two_micro_batches_bitwise(ddp_run, tmp_path):
    out, _ = ddp_run
    single = in_process(tmp_path, 2)
    (ddp_weights, ddp_extra), (acc_weights, acc_extra) = states(out), states(single)
    assert all(torch.equal(ddp_weights[k], acc_weights[k]) for k in acc_weights)
    for a, b in zip(ddp_extra["optimizer"]["state"].values(), acc_extra["optimizer"]["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert untimed(out / "metrics.jsonl") == untimed(single / "metrics.jsonl"), \
        "losses and (split across ranks) evaluations written identically"


def test_two_ranks_match_the_plain_trainer_to_rounding(ddp_run, tmp_path):
    out, _ = ddp_run
    plain = in_process(tmp_path, 1)
    ours, theirs = read_metrics(out / "metrics.jsonl"), read_metrics(plain / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in ours] == [(r["step"], r["split"]) for r in theirs]
    for a, b in zip(ours, theirs):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]), (a, b)
        if a["split"] == "valid":
            assert a["accuracy"] == b["accuracy"]
    weights, reference = states(out)[0], states(plain)[0]
    assert not all(torch.equal(weights[k], reference[k]) for k in weights), \
        "a different summation order: equal to rounding, not bitwise (else this test compares nothing)"


def test_only_rank_zero_writes(ddp_run):
    out, proc = ddp_run
    records = read_metrics(out / "metrics.jsonl")
    keys = [(r["step"], r.get("split")) for r in records]
    assert len(keys) == len(set(keys)) and [r["step"] for r in records if r["split"] == "train"] == list(range(5, 41, 5))
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "metrics.jsonl", "tensorboard"], \
        "no temporaries, one of each"
    assert proc.stdout.count('"world_size": 2') == 1, "the result is printed once"
    (events,) = (out / "tensorboard").iterdir()  # one logger run: rank 0's
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the test extra's

    scalars = EventAccumulator(str(events.parent))
    scalars.Reload()
    assert [(e.step, e.value) for e in scalars.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in records if r["split"] == "train"]


def test_resume_after_a_rank_dies_is_exact(ddp_run, tmp_path):
    out = tmp_path / "run"
    proc, seconds = torchrun(tmp_path, out, fault="die")
    assert proc.returncode != 0 and (tmp_path / "died").exists()
    assert seconds < 120, "the surviving rank does not hang"
    # Rank 1 dies after 25 steps both ranks took. Which of two right checkpoints rank 0 leaves is a race:
    # gloo's broken-connection error first keeps the periodic one (step 20); torchrun's SIGTERM first
    # makes rank 0 save the 25 steps it took (an "interrupted" event). Either way the resume is exact.
    saved = load_checkpoint(out / "checkpoint")[2]["step"]
    interrupted = [{"step": 25, "event": "interrupted"}] if saved == 25 else []
    assert saved in (20, 25), saved
    proc, _ = torchrun(tmp_path, out, fault="die")
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event")]
    assert events == [*interrupted, {"step": saved, "event": "resumed", "world_size": 2}]
    resumed, uninterrupted = states(out)[0], states(ddp_run[0])[0]
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_divergence_on_one_rank_stops_every_rank(tmp_path):
    out = tmp_path / "run"
    proc, seconds = torchrun(tmp_path, out, fault="nan")
    assert proc.returncode != 0
    assert seconds < 120, "no rank waits for a collective the other never joins"
    assert proc.stderr.count("training diverged at step 5") == 2, proc.stderr[-3000:]
    assert [r for r in read_metrics(out / "metrics.jsonl") if r.get("event")] == \
        [{"step": 5, "event": "diverged", "loss": "nan"}]


def test_batch_must_split_over_processes_and_micro_batches(monkeypatch, run_cli):
    with pytest.raises(ConfigError, match=r"batch_size=16 does not split into 1 process\(es\) x 3 micro-batch"):
        train(load_recipe(RECIPE, ["train.micro_batches=3"]))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"batch_size=16 does not split into 3 process\(es\) x 1 .*multiple of 3"):
        train(load_recipe(RECIPE))
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    code, _, err = run_cli("train", "formal_languages", "--set", "train.batch_size=10", "--nproc", "3")
    assert code == 2 and "batch_size=10 does not split into 3 process(es)" in err


def test_micro_batches_at_its_default_keeps_cell_ids():
    """micro_batches came after the first grids: at its default it is not in the digest (cell ids of
    earlier run directories stay), set to anything else it is (a different training run)."""
    recipe = load_recipe(RECIPE)
    assert "micro_batches" in recipe.model_dump()["train"]
    assert "micro_batches" not in digest_dump(recipe)["train"]
    two = load_recipe(RECIPE, ["train.micro_batches=2"])
    assert digest_dump(two)["train"]["micro_batches"] == 2
    assert recipe_digest(two) != recipe_digest(recipe)
