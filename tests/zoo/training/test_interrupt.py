"""Ctrl-C (or a cancelled Ray task) during training keeps the steps done since the last checkpoint,
and the resumed run ends exactly where an uninterrupted one does."""

import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.training import trainer
from xlstm_zoo.training.metrics import read_metrics

import toy_task

toy_task.register()


def test_interrupt_checkpoints_the_last_whole_step_and_resumes_exactly(tmp_path, monkeypatch):
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    undo = toy_task.at_step(monkeypatch, 13)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(recipe, tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 13, "not only the periodic one at 10"
    undo()
    trainer.train(recipe, tmp_path / "run")
    events = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("event")]
    assert events == [{"step": 13, "event": "interrupted"}, {"step": 13, "event": "resumed"}]
    trainer.train(recipe, tmp_path / "clean")
    resumed = load_checkpoint(tmp_path / "run" / "checkpoint")[1].state_dict()
    clean = load_checkpoint(tmp_path / "clean" / "checkpoint")[1].state_dict()
    assert all(torch.equal(resumed[k], clean[k]) for k in clean)
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("split") == "train"]
    assert steps == [5, 10, 15, 20, 25, 30]


def test_interrupt_while_weights_change_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    calls = {"n": 0}
    step = torch.optim.AdamW.step

    def interrupted_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 14:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(recipe, tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 10


def test_ctrl_c_during_the_optimiser_step_waits_for_the_step(tmp_path, monkeypatch):
    """A real SIGINT arriving while the weights change is held until the step is recorded, then saved."""
    import os
    import signal

    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    # Python's own handler, even where a shell started the tests in the background with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    calls = {"n": 0}
    step = torch.optim.AdamW.step

    def step_with_ctrl_c(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 14:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at its next bytecode, mid-step
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step_with_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train(recipe, tmp_path / "run")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the trainer restores the handler"
    finally:
        signal.signal(signal.SIGINT, previous)
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 14
    events = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("event")]
    assert events == [{"step": 14, "event": "interrupted"}]


def test_a_resumed_run_draws_the_same_random_numbers(tmp_path, monkeypatch):
    """Dropout (in a plugin's model) draws from torch's generator at every step: the checkpoint keeps its state,
    so a resumed run's draws are those of an uninterrupted run."""
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    plain = trainer._step_generator
    draws = {}

    def drawing(stop_at):
        def generator(seed, step):
            if step == stop_at:
                raise KeyboardInterrupt
            draws[step] = torch.rand(3)  # what a dropout layer would take
            return plain(seed, step)
        return generator

    monkeypatch.setattr(trainer, "_step_generator", drawing(None))
    trainer.train(recipe, tmp_path / "clean")
    clean = dict(draws)
    monkeypatch.setattr(trainer, "_step_generator", drawing(13))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(recipe, tmp_path / "run")
    monkeypatch.setattr(trainer, "_step_generator", drawing(None))
    draws.clear()
    trainer.train(recipe, tmp_path / "run")
    resumed = {s: d for s, d in draws.items() if s >= 13}  # step 0's batch is also drawn by the size check
    assert sorted(resumed) == list(range(13, 30))
    assert all(torch.equal(resumed[s], clean[s]) for s in resumed)
