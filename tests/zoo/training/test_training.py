"""The trainer: learning, schedule, metrics, checkpoints, exact resume, divergence, errors."""

import json
import math
import shutil

import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.schedule import lr_factor
from xlstm_zoo.training.trainer import TrainingDiverged, train

import toy_task

toy_task.register()


def test_schedule_warmup_then_cosine():
    f = [lr_factor(s, 100, 10, 0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])), "cosine part is non-increasing"
    assert f[-1] == pytest.approx(0.1, abs=1e-3)


def test_training_learns_and_writes_metrics(tmp_path):
    recipe = load_recipe(toy_task.recipe(steps=150, eval_every=75))
    result = train(recipe, tmp_path)
    records = read_metrics(tmp_path / "metrics.jsonl")
    losses = [r["loss"] for r in records if r.get("split") == "train"]
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall: {losses}"
    assert result["metrics"]["valid"]["accuracy"] > 0.9, result
    assert set(result["metrics"]) == {"valid", "test"}
    assert {r["step"] for r in records if r.get("split") == "valid"} == {75, 150}, "periodic and final evaluation"
    _, _, extra = load_checkpoint(tmp_path / "checkpoint")
    assert extra["step"] == 150 and "optimizer" in extra


class Interrupt(Exception):
    pass


def test_a_resumed_run_counts_every_trained_token(tmp_path, monkeypatch):
    # checkpoints at 5 and 10, logs at 4, 8, 12: the count at the checkpoint's step travels in the checkpoint
    recipe = load_recipe(toy_task.recipe(steps=12, checkpoint_every=5, log_every=4))
    whole = train(recipe, tmp_path / "whole")
    undo = toy_task.at_step(monkeypatch, 7, Interrupt)
    with pytest.raises(Interrupt):
        train(recipe, tmp_path / "split")
    undo()
    resumed = train(recipe, tmp_path / "split")
    logged = [r["tokens"] for r in read_metrics(tmp_path / "whole" / "metrics.jsonl") if r.get("split") == "train"]
    assert logged == [logged[0] * k for k in (1, 2, 3)] and whole["train_tokens"] == logged[-1]
    assert resumed["train_tokens"] == whole["train_tokens"], "tokens of the steps between the last log and the checkpoint"
    logged = [r["tokens"] for r in read_metrics(tmp_path / "split" / "metrics.jsonl") if r.get("split") == "train"]
    assert logged[-1] == whole["train_tokens"]


@pytest.mark.parametrize("written_as", ["directory", "format-1 file"])
def test_resume_is_exact(tmp_path, monkeypatch, written_as):
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    train(recipe, tmp_path / "whole")
    _, whole, _ = load_checkpoint(tmp_path / "whole" / "checkpoint")

    calls = {"n": 0}
    original = toy_task.ToyCopy.batch

    def flaky(self, split, *args):
        if split == "train":
            calls["n"] += 1
            if calls["n"] == 25:  # killed between the checkpoints at 20 and 30
                raise Interrupt()
        return original(self, split, *args)

    monkeypatch.setattr(toy_task.ToyCopy, "batch", flaky)
    with pytest.raises(Interrupt):
        train(recipe, tmp_path / "split")
    monkeypatch.setattr(toy_task.ToyCopy, "batch", original)
    assert load_checkpoint(tmp_path / "split" / "checkpoint")[2]["step"] == 20
    if written_as == "format-1 file":  # a run from before the directory layout resumes too
        saved, model, state = load_checkpoint(tmp_path / "split" / "checkpoint")
        torch.save({"format": 1, "recipe": saved.model_dump(), "model": model.state_dict(), **state},
                   tmp_path / "split" / "checkpoint.pt")
        shutil.rmtree(tmp_path / "split" / "checkpoint")
    train(recipe, tmp_path / "split")
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == ["checkpoint", "metrics.jsonl"]
    _, resumed, _ = load_checkpoint(tmp_path / "split" / "checkpoint")
    # exact: a resumed run replays the same steps bit for bit
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m, name=name: f"{name} differs after resume: {m}")
    records = read_metrics(tmp_path / "split" / "metrics.jsonl")
    steps = [r["step"] for r in records if r.get("split") == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), f"replayed steps logged twice: {steps}"
    assert any(r.get("event") == "resumed" and r["step"] == 20 for r in records)


def test_divergence_stops_with_message_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=4))
    original = toy_task.ToyCopy.loss
    calls = {"n": 0}

    def exploding(self, logits, batch):
        calls["n"] += 1
        loss = original(self, logits, batch)
        return loss * float("nan") if calls["n"] == 7 else loss

    monkeypatch.setattr(toy_task.ToyCopy, "loss", exploding)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 7: loss is nan; the last good checkpoint is \S*/checkpoint \(try"):
        train(recipe, tmp_path)
    _, model, extra = load_checkpoint(tmp_path / "checkpoint")
    assert extra["step"] == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_bf16_autocast_trains(tmp_path):
    result = train(load_recipe(toy_task.recipe(steps=5, precision="bf16")))
    assert math.isfinite(result["final_train_loss"])


def test_clear_errors():
    with pytest.raises(ConfigError, match="vocab_size=3 is smaller than task 'toy_copy'"):
        train(load_recipe(toy_task.recipe() | {"model": toy_task.recipe()["model"] | {"vocab_size": 3}}))
    no_task = toy_task.recipe()
    no_task.pop("task")
    with pytest.raises(ConfigError, match="no `task:` section"):
        train(load_recipe(no_task))
    with pytest.raises(ConfigError, match="warmup_steps=50 exceeds steps=10"):
        load_recipe(toy_task.recipe(steps=10, warmup_steps=50))


def test_cli_train(tmp_path, capsys):
    from xlstm_zoo.cli import main

    (tmp_path / "toy.yaml").write_text(json.dumps(toy_task.recipe(steps=6)))
    assert main(["train", str(tmp_path / "toy.yaml"), "--set", "train.steps=4", "--out", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 4 and (tmp_path / "run" / "checkpoint").exists()


def test_adamw_is_fused_where_the_device_has_the_kernel(monkeypatch):
    from xlstm_zoo.training import trainer

    groups = [{"params": [torch.nn.Parameter(torch.randn(3, 2))], "weight_decay": 0.1}]
    assert trainer.adamw(groups, 1e-3, (0.9, 0.999)).defaults["fused"] is True
    real = torch.optim.AdamW

    def no_fused_kernel(*args, fused=None, **kwargs):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused_kernel)
    fallback = trainer.adamw([{"params": [torch.nn.Parameter(torch.randn(3, 2))]}], 1e-3, (0.9, 0.999))
    assert not fallback.defaults["fused"]
