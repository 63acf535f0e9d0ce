"""xlstm-zoo plugin: the minGRU cell and the DyT normaliser.

The ``xlstm_zoo`` entry point in pyproject.toml names this module; xlstm-zoo calls its
``register_components`` hook when the registry is first used.
"""

from xlstm_zoo.plugins import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_components(register):
    # Imported here, not at the top: `xlstm-zoo list` loads every plugin, and this keeps that cheap.
    from xlstm_zoo_mingru.cell import MinGRUCell
    from xlstm_zoo_mingru.norm import DyTNorm

    register(MinGRUCell)
    register(DyTNorm)
