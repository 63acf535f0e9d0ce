"""Checkpoints: model directories (recipe.yaml + model.safetensors), training checkpoints written as
a whole (a kill at any point leaves one complete checkpoint), format-1 .pt files read without
pickle's code execution, and a malicious pickle refused before anything in it runs."""

import os
import shutil

import pytest
import safetensors
import torch

from xlstm_zoo import build, checkpoint, load_recipe
from xlstm_zoo.checkpoint import find_checkpoint, load_checkpoint, read_model_dir, save_checkpoint, write_model_dir
from xlstm_zoo.errors import ConfigError


def small(name="xlstm_1_1"):
    recipe = load_recipe(name, ["dim=32", "stack.num_blocks=2"])
    return recipe, build(recipe)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def trained_optimizer(model, steps=2):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95))
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randint(0, 256, (2, 5)))[0].square().mean().backward()
        opt.step()
    return opt


def assert_same_state(a, b, where="optimizer"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", ["xlstm_1_1", "xlstm_1_0"])  # xlstm_1_0 ties its head to the embedding
def test_model_dir_round_trip(tmp_path, name):
    recipe, model = small(name)
    write_model_dir(tmp_path / "m", recipe, model)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.safetensors", "recipe.yaml"]
    with safetensors.safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        assert f.metadata()["producer"] == "xlstm-zoo"
    recipe2, model2 = read_model_dir(tmp_path / "m")
    assert recipe2 == recipe and not model2.training
    assert_same_weights(model2, model)
    if name == "xlstm_1_0":
        assert model2.head.weight is model2.embedding.weight, "the tie survives (stored once in the file)"
    tokens = torch.randint(0, 256, (2, 5))
    torch.testing.assert_close(model2(tokens)[0], model.eval()(tokens)[0], rtol=0, atol=0)
    write_model_dir(tmp_path / "m", recipe.model_dump(), model)  # the recipe as a dict: the same files
    assert read_model_dir(tmp_path / "m")[0] == recipe
    _, half = read_model_dir(tmp_path / "m", dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert torch.equal(half.embedding.weight, model.embedding.weight.bfloat16())


def test_training_checkpoint_round_trip_and_overwrite(tmp_path):
    recipe, model = small()
    opt = trained_optimizer(model)
    save_checkpoint(tmp_path / "ck", recipe, model, optimizer=opt.state_dict(), step=7)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "model.safetensors", "optimizer.pt", "recipe.yaml", "state.json"]
    recipe2, model2, state = load_checkpoint(tmp_path / "ck")
    assert recipe2 == recipe and state.keys() == {"step", "optimizer"} and state["step"] == 7
    assert_same_weights(model2, model)
    assert_same_state(state["optimizer"], opt.state_dict())
    assert torch.load(tmp_path / "ck" / "optimizer.pt", weights_only=True)["param_groups"][0]["betas"] == (0.9, 0.95)

    trained_optimizer(model, steps=1)  # new weights, then the same path again
    save_checkpoint(tmp_path / "ck", recipe, model, step=8)
    _, model3, state = load_checkpoint(tmp_path / "ck")
    assert state == {"step": 8}
    assert_same_weights(model3, model)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"], "no temporaries and no ck.old left behind"
    os.rename(tmp_path / "ck", tmp_path / "checkpoint")
    assert load_checkpoint(tmp_path)[2] == {"step": 8}, "a run directory means its checkpoint/"


def snapshots_of_a_save(tmp_path, monkeypatch, prepare):
    """Save step 2 over what ``prepare(run)`` left, copying the run directory just before every
    rename, replace and tree removal: each copy is what a SIGKILL at that moment leaves (a tree
    removal also leaves a half-removed copy)."""
    run = tmp_path / "run"
    run.mkdir()
    prepare(run)
    shots = []
    real_rename, real_replace, real_rmtree = os.rename, os.replace, shutil.rmtree

    def shoot(half_removed=None):
        shot = tmp_path / f"shot{len(shots)}"
        shutil.copytree(run, shot)
        if half_removed is not None and (shot / half_removed).is_dir():
            (shot / half_removed / "model.safetensors").unlink(missing_ok=True)
        shots.append(shot)

    def rename(src, dst, *a, **k):
        shoot()
        return real_rename(src, dst, *a, **k)

    def replace(src, dst, *a, **k):
        shoot()
        return real_replace(src, dst, *a, **k)

    def rmtree(path, *a, **k):
        shoot()
        shoot(half_removed=os.path.relpath(path, run))
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    recipe, model = small()
    save_checkpoint(run / "checkpoint", recipe, model, step=2)
    monkeypatch.undo()
    shoot()  # after the save
    return shots, model


@pytest.mark.parametrize("before", ["directory", "old directory only", "format-1 file", "nothing"])
def test_a_kill_at_any_point_of_a_save_leaves_one_complete_checkpoint(tmp_path, monkeypatch, before):
    recipe, old_model = small()

    def prepare(run):
        if before == "format-1 file":
            torch.save({"format": 1, "recipe": recipe.model_dump(), "model": old_model.state_dict(), "step": 1},
                       run / "checkpoint.pt")
        elif before != "nothing":
            save_checkpoint(run / "checkpoint", recipe, old_model, step=1)
            if before == "old directory only":  # a run killed between the two renames
                os.rename(run / "checkpoint", run / "checkpoint.old")
        (run / ".checkpoint.abc.tmp").mkdir()  # a writer killed mid-write
        (run / ".checkpoint.abc.tmp" / "recipe.yaml").write_text("torn")

    shots, new_model = snapshots_of_a_save(tmp_path, monkeypatch, prepare)
    assert len(shots) >= 5
    if before == "directory":
        assert any(not (s / "checkpoint").exists() and (s / "checkpoint.old").is_dir() for s in shots), \
            "the window between the two renames was seen"
    for shot in shots:
        found = find_checkpoint(shot / "checkpoint")
        if found is None:
            assert before == "nothing" and shot != shots[-1], shot
            continue
        _, model, state = load_checkpoint(found)
        assert state["step"] in (1, 2), shot
        assert_same_weights(model, new_model if state["step"] == 2 else old_model)
        # the next save from any of these states leaves exactly one checkpoint, the newest
        save_checkpoint(shot / "checkpoint", recipe, new_model, step=3)
        assert sorted(p.name for p in shot.iterdir()) == ["checkpoint"], shot
        assert load_checkpoint(shot / "checkpoint")[2]["step"] == 3
    assert sorted(p.name for p in shots[-1].iterdir()) == ["checkpoint"]


def test_format_1_checkpoint_loads_without_unpickling_code(tmp_path):
    recipe, model = small()
    opt = trained_optimizer(model)
    # exactly what save_checkpoint wrote before the directory layout
    torch.save({"format": 1, "recipe": recipe.model_dump(), "model": model.state_dict(),
                "optimizer": opt.state_dict(), "step": 5}, tmp_path / "checkpoint.pt")
    assert find_checkpoint(tmp_path / "checkpoint") == tmp_path / "checkpoint.pt"
    recipe2, model2, state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert recipe2 == recipe and state.keys() == {"optimizer", "step"} and state["step"] == 5
    assert_same_weights(model2, model)
    assert_same_state(state["optimizer"], opt.state_dict())


class RunsCode:
    """A pickle that creates ``marker`` when unpickled: the shape of every pickle exploit."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path):
    recipe, model = small()
    marker = tmp_path / "code_ran"
    bad = tmp_path / "bad.pt"
    torch.save({"format": 1, "recipe": recipe.model_dump(), "model": model.state_dict(),
                "step": RunsCode(marker)}, bad)
    with pytest.raises(ConfigError, match=r"bad.pt: refused to unpickle \(Unsupported global: GLOBAL exec was not an allowed global by default\).*could run code") as err:
        load_checkpoint(bad)
    assert "\n" not in str(err.value)
    assert not marker.exists(), "code in the pickle ran"

    save_checkpoint(tmp_path / "ck", recipe, model, step=1)  # the same inside a checkpoint directory
    torch.save({"state": {}, "param_groups": [RunsCode(marker)]}, tmp_path / "ck" / "optimizer.pt")
    with pytest.raises(ConfigError, match="refused to unpickle"):
        load_checkpoint(tmp_path / "ck")
    assert not marker.exists(), "code in the pickle ran"

    torch.load(bad, weights_only=False)  # negative control: a plain unpickle of the file does run it
    assert marker.exists()


def test_bad_checkpoints(tmp_path):
    with pytest.raises(ConfigError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="junk.pt: (refused to unpickle|not a readable)"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"hello": 1}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not an xlstm-zoo checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    recipe, _ = small()
    torch.save({"format": 1, "recipe": recipe.model_dump(), "model": build(load_recipe("xlstm_1_0")).state_dict()},
               tmp_path / "mismatch.pt")
    with pytest.raises(ConfigError, match="weights do not match the checkpoint's recipe"):
        load_checkpoint(tmp_path / "mismatch.pt")

    recipe, model = small()
    write_model_dir(tmp_path / "m", recipe, build(load_recipe("xlstm_1_1", ["dim=64", "stack.num_blocks=2"])))
    with pytest.raises(ConfigError, match="weights do not match the checkpoint's recipe"):
        read_model_dir(tmp_path / "m")
    write_model_dir(tmp_path / "m", recipe, model)
    data = (tmp_path / "m" / "model.safetensors").read_bytes()
    (tmp_path / "m" / "model.safetensors").write_bytes(data[: len(data) // 2])  # torn by hand
    with pytest.raises(ConfigError, match="model.safetensors: not a readable safetensors file"):
        read_model_dir(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"not an xlstm-zoo model directory \(missing model.safetensors"):
        read_model_dir(tmp_path / "m")
    write_model_dir(tmp_path / "m", recipe, model)
    with pytest.raises(ConfigError, match="dtype 'int8' is not a floating-point torch dtype"):
        read_model_dir(tmp_path / "m", dtype="int8")
    with pytest.raises(ConfigError, match="not an xlstm-zoo model directory"):
        load_checkpoint(tmp_path)  # neither a model directory nor a run directory with a checkpoint


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_run_directory_files_follow_the_umask(tmp_path, mask):
    """Shared run directories are read by others: every file a grid and its trainer write has the umask's
    permissions (a private temporary file renamed into place would not)."""
    import os
    import stat
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import toy_task
    from xlstm_zoo.grid.runner import run_grid

    toy_task.register()
    data = toy_task.recipe(steps=10, checkpoint_every=5)
    data["grid"] = {"seeds": [0]}
    data["report"] = {"metric": "accuracy", "split": "valid"}
    previous = os.umask(mask)
    try:
        run_grid(load_recipe(data), tmp_path / "run")
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {"grid.json", "result.json", "metrics.jsonl", "model.safetensors", "optimizer.pt", "state.json",
            "recipe.yaml"} <= {p.name for p in files}
    wrong = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if stat.S_IMODE(p.stat().st_mode) != 0o666 & ~mask}
    assert not wrong, wrong
