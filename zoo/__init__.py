"""xlstm-zoo: a modular, composable layer zoo for the xLSTM family of recurrent models.

    import xlstm_zoo
    model = xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_1_1", ["stack.num_blocks=4"]))
"""

from xlstm_zoo.version import __version__
from xlstm_zoo.errors import ConfigError, UnknownComponentError, ZooError
from xlstm_zoo.registry import component, register, registry
from xlstm_zoo import wiring  # noqa: F401  (plugin loading and the backend table, connected once)
from xlstm_zoo.recipe_loader import Recipe, build, load_recipe, shipped_recipes
from xlstm_zoo.pretrained import from_pretrained, save_pretrained
from xlstm_zoo import interop

interop.install()  # transformers' Auto classes learn model_type xlstm_zoo once transformers is imported

__all__ = ["ConfigError", "Recipe", "UnknownComponentError", "ZooError", "__version__", "build", "component",
           "from_pretrained", "load_recipe", "register", "registry", "save_pretrained", "shipped_recipes"]
