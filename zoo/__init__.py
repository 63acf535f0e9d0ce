"""xlstm-zoo: a modular, composable layer zoo for the xLSTM family of recurrent models.

    import xlstm_zoo
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_1_1", ["stack.num_blocks=4"]))
"""

__version__ = "0.1.0"

from xlstm_zoo.errors import ConfigError, UnknownComponentError, ZooError  # noqa: E402
from xlstm_zoo.registry import component, register, registry  # noqa: E402

__all__ = ["ConfigError", "Recipe", "UnknownComponentError", "ZooError", "build", "component", "load_recipe",
           "register", "registry", "shipped_recipes"]


def __getattr__(name):
    # Recipes pull in torch modules; keep `import xlstm_zoo` (and the backends' imports of the
    # registry) light and free of import cycles.
    if name in ("Recipe", "build", "load_recipe", "shipped_recipes"):
        from xlstm_zoo import recipe

        return getattr(recipe, name)
    raise AttributeError(f"module 'xlstm_zoo' has no attribute {name!r}")
