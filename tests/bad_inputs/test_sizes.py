"""Sizes refused before anything is allocated: a model whose weights, or a training step whose weights,
optimiser state and activations, exceed the memory free is one line naming the estimate and what is free."""

import pytest
import torch
import yaml

from xlstm_zoo import build, load_recipe
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader import sizes
from xlstm_zoo.training.trainer import train

TRAINABLE = {"model": {"type": "causal_lm", "vocab_size": None, "dim": 16, "stack": {"type": "xlstm", "num_blocks": 1}},
             "task": {"type": "parity"},
             "train": {"steps": 1, "batch_size": 4, "warmup_steps": 0, "eval_splits": []}}


@pytest.fixture
def free_memory(monkeypatch):
    """Pretend this many bytes are free on every device."""
    monkeypatch.delenv(sizes.SKIP, raising=False)

    def pretend(nbytes):
        monkeypatch.setattr(sizes, "available_memory", lambda device: nbytes)
    return pretend


def test_the_estimate_is_the_built_models_bytes():
    config = load_recipe("xlstm_1_1", ["dim=48", "stack.num_blocks=2"]).model
    assert sizes.model_size(config).weight_bytes == sizes.model_bytes(build(config))


def test_a_dimension_too_large_to_describe(run_cli):
    code, out, err = run_cli("build", "xlstm_1_1", "--set", "model.dim=1000000000")
    assert code == 2 and "too large to allocate" in err and "model.dim=1000000000" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_model_larger_than_memory(run_cli):
    """2 TB of weights on any machine these tests run on: refused from the meta count, nothing allocated."""
    code, out, err = run_cli("build", "xlstm_1_1", "--set", "model.dim=100000")
    assert code == 2 and "the model's weights need about 2,011.8 GiB" in err and "are free on cpu" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_model_just_over_what_is_free(free_memory):
    config = load_recipe("xlstm_1_1", ["dim=32", "stack.num_blocks=2"]).model
    need = sizes.model_size(config).weight_bytes
    free_memory(need - 1)
    with pytest.raises(ConfigError, match=r"weights need about .* MiB but .* MiB are free on cpu"):
        build(config)
    free_memory(need)
    assert sizes.model_bytes(build(config)) == need


def test_the_skip_variable_builds_anyway(free_memory, monkeypatch):
    free_memory(1)
    monkeypatch.setenv(sizes.SKIP, "1")
    build(load_recipe("xlstm_1_1", ["dim=32", "stack.num_blocks=2"]))


def test_a_batch_larger_than_memory():
    recipe = load_recipe(TRAINABLE, ["train.batch_size=1000000000"])
    with pytest.raises(ConfigError) as info:
        train(recipe)
    message = str(info.value)
    assert "train.batch_size" in message and "1,000,000,000 rows of" in message and "are free on cpu" in message, message
    assert "\n" not in message


def small_lm():
    return load_recipe("xlstm_1_1", ["dim=32", "vocab_size=17", "stack.num_blocks=2"]).model


def test_rows_beyond_what_fits(free_memory):
    """The step's floor: 4 float32 copies of the weights, and per token each block's output, the embedding's
    and the logits (4 bytes each)."""
    config = small_lm()
    size = sizes.model_size(config)
    assert (size.width, size.blocks, size.outputs) == (32, 2, 17)
    per_row = 10 * 4 * (32 * 3 + 17)  # 10 tokens
    free_memory(sizes.TRAINING_COPIES * size.weight_bytes + 8 * per_row)
    sizes.check_training_fits(config, 8, 10, "cpu")
    with pytest.raises(ConfigError, match=r"train.batch_size: .* at most 8 rows per micro-batch fit"):
        sizes.check_training_fits(config, 9, 10, "cpu")


def test_weights_and_optimiser_state_that_do_not_fit(free_memory):
    config = small_lm()
    free_memory(sizes.model_size(config).weight_bytes * 3)
    with pytest.raises(ConfigError, match=r"^model: a training step .* the weights and optimiser state alone do not fit"):
        sizes.check_training_fits(config, 1, 10, "cpu")


def test_train_command_refuses_a_huge_batch(run_cli, tmp_path):
    path = tmp_path / "parity.yaml"
    path.write_text(yaml.safe_dump(TRAINABLE))
    code, out, err = run_cli("train", path, "--set", "train.batch_size=1000000000")
    assert code == 2 and "a training step needs about" in err and "lower train.batch_size" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_free_memory_is_read():
    free = sizes.available_memory("cpu")
    assert free is not None and 0 < free


def test_a_conformance_check_started_by_the_meta_count_runs_on_the_cpu():
    """A plugin component's first build may now be the meta count: its conformance check must not inherit
    meta (where it computed nothing and failed every plugin cell)."""
    from xlstm_zoo.plugins.guard import run_check
    from xlstm_zoo.registry import registry
    entry = registry.get("cell", "lstm")
    with torch.device("meta"):
        assert run_check(entry, entry.builder, full=False) == "passed"


def test_the_size_count_leaves_a_seeded_build_reproducible():
    """The meta count runs at a config's first build only: it must not move the random generator, or the
    first seeded build of a config would differ from every later one."""
    recipe = load_recipe("xlstm_0_1", ["stack.num_blocks=2", "dim=24"])
    sizes._SIZES.clear()
    torch.manual_seed(0)
    first = build(recipe)   # counted on meta first
    torch.manual_seed(0)
    second = build(recipe)  # the count remembered
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
