"""Zoo models in the tools researchers already run: transformers' Auto classes and ``generate()``,
lm-evaluation-harness, model cards (docs/transformers.md).

- :mod:`.hf`: the transformers classes (imports transformers), reading the files of :mod:`xlstm_zoo.model_files`;
- ``lm_eval_tasks/``: a small offline lm-evaluation-harness task.

``import xlstm_zoo`` calls :func:`install`: it registers the classes with transformers' Auto classes
as soon as transformers is imported, without importing it itself (that takes seconds).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

_TRIGGER = "transformers"


def install() -> None:
    """Register with transformers now if it is imported, else right after it is (nothing if it is not installed)."""
    if sys.modules.get(_TRIGGER) is not None:
        _register()
    elif _TRIGGER not in sys.modules and importlib.util.find_spec(_TRIGGER) is not None \
            and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())  # (sys.modules[_TRIGGER] None: blocked on purpose, left alone)


def _register() -> None:
    try:
        from xlstm_zoo.interop import hf  # imports transformers: only once the user has
        hf.register()
    except Exception as err:  # noqa: BLE001 - a transformers we cannot work with must not break its import
        warnings.warn(f"xlstm-zoo could not register its models with transformers ({type(err).__name__}: {err}); "
                      "AutoModelForCausalLM will not know model_type xlstm_zoo", stacklevel=2)


class _AfterImport:
    """A one-shot import hook: lets transformers import as usual, then registers (see :func:`install`)."""

    def find_spec(self, name, path=None, target=None):
        if name != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _register()
        spec.loader.exec_module = exec_module  # this spec's own loader instance: nothing else is changed
        return spec
