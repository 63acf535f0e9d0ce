"""`train:` fields out of range and run directories that cannot be one: one line each (exit 2) naming the
field or path and what is allowed, before anything is trained or written."""

import json
from pathlib import Path

import pytest
import torch

import toy_task

toy_task.register()


def _recipe(tmp_path, **train) -> Path:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(toy_task.recipe(steps=4, warmup_steps=0, **train)))
    return path


@pytest.mark.parametrize("field, message", [
    ("train.betas=[0.9,1.5]", "train.betas.1: Input should be less than 1 (got 1.5)"),
    ("train.betas=[-0.1,0.9]", "train.betas.0: Input should be greater than or equal to 0"),
    ("train.seed=99999999999999999999", "train.seed: Input should be less than 18446744073709551616"),
    ("train.device=tpu", "train.device: not a torch device: give a type torch knows"),
    ("train.device=cuda:banana", "train.device: not a torch device"),
])
def test_train_fields_out_of_range(tmp_path, run_cli, field, message):
    code, out, err = run_cli("train", _recipe(tmp_path), "--set", field, "--out", tmp_path / "run")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert not (tmp_path / "run").exists()


def test_a_large_seed_trains(tmp_path, run_cli):
    code, out, err = run_cli("train", _recipe(tmp_path), "--set", f"train.seed={2**64 - 1}")
    assert code == 0, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks(tmp_path, run_cli):
    code, _, err = run_cli("train", _recipe(tmp_path), "--set", "train.device=cuda", "--out", tmp_path / "run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "train.device: device 'cuda' is not available on this machine" in err and "use cpu" in err, err


@pytest.mark.parametrize("command", ["train", "grid"])
def test_a_dangling_out(tmp_path, run_cli, command):
    data = json.loads(_recipe(tmp_path).read_text())
    data["grid"] = {"seeds": [0]}
    (tmp_path / "toy.json").write_text(json.dumps(data))
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    code, _, err = run_cli(command, tmp_path / "toy.json", "--out", link)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{link} is a symbolic link to {tmp_path / 'gone'}, which does not exist" in err, err
    assert link.is_symlink() and not (tmp_path / "gone").exists()


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs /sys, where no one (not even root) creates folders")
@pytest.mark.parametrize("command", ["train", "grid"])
def test_an_out_that_cannot_be_written(tmp_path, run_cli, command):
    data = json.loads(_recipe(tmp_path).read_text())
    data["grid"] = {"seeds": [0]}
    (tmp_path / "toy.json").write_text(json.dumps(data))
    code, _, err = run_cli(command, tmp_path / "toy.json", "--out", "/sys/xlstm_zoo_run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot write the run directory /sys/xlstm_zoo_run (" in err and "you can write to" in err, err
