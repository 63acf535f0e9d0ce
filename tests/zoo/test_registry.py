"""The registry: registration rules, lookups with helpful errors, wildcards, late registration."""

from typing import Literal

import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError, RegistryError, UnknownComponentError
from xlstm_zoo.registry import Registry, component, registry


class TinyConfig(ZooConfig):
    type: Literal["tiny"] = "tiny"
    scale: float = 1.0


@component("norm", "tiny", config=TinyConfig, description="multiplies by a constant")
class TinyNorm(torch.nn.Module):
    def __init__(self, config, ctx):
        super().__init__()
        self.scale = config.scale

    def forward(self, x):
        return x * self.scale


@pytest.fixture
def fresh():
    reg = Registry()
    reg._loaded = True  # no plugins: an empty registry
    return reg


def test_duplicate_name_is_an_error_unless_override(fresh):
    fresh.register(TinyNorm, source="first-dist")
    with pytest.raises(RegistryError, match="already registered by first-dist.*override=True"):
        fresh.register(TinyNorm, source="second-dist")
    replaced = fresh.register(TinyNorm, override=True, source="second-dist")
    assert fresh.get("norm", "tiny") is replaced and replaced.source == "second-dist"


@pytest.mark.parametrize("bad, match", [
    (dict(config=dict), "pydantic BaseModel"),
    (dict(description="two\nlines"), "one non-empty line"),
    (dict(name="has space"), "name must be"),
    (dict(kind="not a kind"), "identifier"),
])
def test_invalid_registrations_are_rejected(fresh, bad, match):
    spec = dict(kind="norm", name="tiny", config=TinyConfig, builder=TinyNorm, description="ok")
    spec.update(bad)
    with pytest.raises(RegistryError, match=match):
        fresh.register(**spec)


def test_config_must_name_its_component(fresh):
    with pytest.raises(RegistryError, match="needs a field `type"):
        fresh.register(kind="norm", name="other", config=TinyConfig, builder=TinyNorm, description="x")


def test_unknown_name_error_has_kind_name_path_close_matches_and_full_list():
    with pytest.raises(UnknownComponentError) as info:
        registry.get("cell", "mlstmm", path="model.stack.blocks.m.cell.type")
    message = str(info.value)
    for part in ("unknown cell 'mlstmm'", "did you mean 'mlstm'", "known cells: attention, lstm, mamba, mlstm",
                 "model.stack.blocks.m.cell.type"):
        assert part in message, f"{part!r} missing from: {message}"


def test_find_with_wildcards():
    assert [c.name for c in registry.find("block", "p*")] == ["plain", "post_up", "pre_up"]
    assert {(c.kind, c.name) for c in registry.find(None, "*lstm")} == {
        ("cell", "lstm"), ("cell", "slstm"), ("cell", "mlstm"), ("stack", "xlstm")}
    assert registry.find("cell", "nothing*") == []
    with pytest.raises(UnknownComponentError, match="unknown kind 'cels'.*did you mean 'cell'"):
        registry.find("cels")


def test_builtins_come_through_the_plugin_hook():
    core = [c for c in registry.find() if c.source == "xlstm-zoo"]
    assert core, "core components register through the hook under the core plugin's name"
    assert "xlstm-zoo" in [p.distribution or p.name for p in registry.plugins], "core is listed as a plugin"
    expected = {"cell": {"lstm", "slstm", "mlstm"}, "gate": {"sigmoid", "exponential"},
                "norm": {"layernorm", "rmsnorm", "multihead_layernorm", "none"},
                "block": {"pre_up", "post_up", "residual", "plain", "mlstm_7b"},
                "stack": {"xlstm", "sequential"}, "backend": {"reference"}}
    for kind, names in expected.items():
        mine = {c.name for c in core if c.kind == kind}
        assert names <= mine, f"{kind}: core did not register {names - mine}"


def test_component_registered_later_validates_like_a_builtin():
    recipe = {"model": {"type": "causal_lm", "dim": 8, "vocab_size": 5,
                        "stack": {"type": "xlstm", "pattern": "m", "post_norm": {"type": "tiny", "scale": 2.0}}}}
    with pytest.raises(ConfigError, match="model.stack.post_norm.type: unknown norm 'tiny'"):
        load_recipe(recipe)
    registry.register(TinyNorm, source="test-plugin")
    try:
        model = build(load_recipe(recipe))
        assert isinstance(model.stack.post_norm, TinyNorm) and model.stack.post_norm.scale == 2.0
        with pytest.raises(ConfigError, match="model.stack.post_norm.scale: .*valid number"):
            load_recipe({**recipe, "model": {**recipe["model"], "stack": {
                **recipe["model"]["stack"], "post_norm": {"type": "tiny", "scale": "big"}}}})
        assert "tiny" in str(load_recipe.__globals__["Recipe"].model_json_schema())
    finally:
        registry.unregister("norm", "tiny")
