"""The core plugin: registers every built-in component through the same hook as third parties.

The plugin loader imports it by name, first (:data:`xlstm_zoo.plugins.loader.CORE_MODULE`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import create_model

from xlstm_zoo import gates, norms, stacks
from xlstm_zoo.backends.catalog import BUILTIN_BACKENDS
from xlstm_zoo.blocks import mlstm_7b, plain, post_up, pre_up, residual
from xlstm_zoo.cells import attention, lstm, mamba, mlstm, slstm
from xlstm_zoo.cells import retention, rwkv  # the RWKV-4 and RetNet baselines
from xlstm_zoo.commands import bench, components, doctor, export, main_job, plugins, pretrained, recipes
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.loggers import mlflow, tensorboard, wandb
from xlstm_zoo.models import classifier, lm
from xlstm_zoo.plugins.contract import PLUGIN_API_VERSION
from xlstm_zoo.plugins.hookspecs import hookimpl
from xlstm_zoo.registry import tagged_components
from xlstm_zoo.tasks import formal_cf, formal_cs, formal_regular, retrieval, text
from xlstm_zoo.tasks import text_lm, tokenizer  # language modelling on text

COMMAND_MODULES = (components, recipes, main_job, bench, plugins, doctor, export, pretrained)
COMPONENT_MODULES = (lstm, slstm, mlstm, attention, mamba, gates, norms, plain, residual, pre_up, post_up, mlstm_7b, stacks,
                     lm, classifier, formal_regular, formal_cf, formal_cs, retrieval, text, tensorboard, mlflow, wandb)
COMPONENT_MODULES += (rwkv, retention)  # the RWKV-4 and RetNet baselines
COMPONENT_MODULES += (tokenizer, text_lm)


def backend_config(name: str) -> type[ZooConfig]:
    """The (field-less) config of a built-in backend: ``type: <name>``."""
    return create_model(f"{name.capitalize()}BackendConfig", __base__=ZooConfig, type=(Literal[name], name))


XLSTM_ZOO_PLUGIN_API = PLUGIN_API_VERSION  # core speaks the host's version


@hookimpl
def register_components(register):
    for module in COMPONENT_MODULES:
        for builder in tagged_components(module):
            register(builder)
    for make in BUILTIN_BACKENDS:
        backend = make()
        register(kind="backend", name=backend.name, config=backend_config(backend.name),
                 builder=lambda config, make=make: make(), description=backend.description)


@hookimpl
def register_commands(add_command):
    for module in COMMAND_MODULES:
        for command in module.COMMANDS:
            add_command(command.name, help=command.help, arguments=command.arguments, run=command.run,
                        description=command.description)
