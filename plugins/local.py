"""Importing a plugin named by ``--plugin`` or ``XLSTM_ZOO_PLUGINS`` as a user means it: a file
(``my_cells.py``, ``./plugins/my_cells.py``) is loaded from that path, and a module name that is not
importable from ``sys.path`` is looked for in the working directory (the ``xlstm-zoo`` script's own
folder, not the working directory, heads ``sys.path``). A module whose import takes long is named
after a short wait, so a stalled start-up says what it waits for."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path

from xlstm_zoo.plugins.status import PluginWarning

SLOW_IMPORT_S = 2.0


def import_target(target: str):
    """The object ``module[:attr.path]`` or ``path/to/file.py[:attr.path]`` names."""
    module_name, _, attr = target.partition(":")
    with said_if_slow(module_name):
        obj = _import_file(Path(module_name)) if _is_file_name(module_name) else _import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def _is_file_name(name: str) -> bool:
    return name.endswith(".py") or os.sep in name or (os.altsep is not None and os.altsep in name)


def _import_file(path: Path):
    if not path.is_file():
        raise ModuleNotFoundError(f"no plugin file {path} (from {Path.cwd()}); give a .py file or a module name")
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path.resolve()):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: the module's own `import name` finds it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = name.split(".")[0]
        here = Path.cwd()
        if err.name != top or str(here) in sys.path or not ((here / f"{top}.py").is_file() or
                                                              (here / top / "__init__.py").is_file()):
            raise
    sys.path.append(str(here))  # after everything installed: a local file never shadows a package
    importlib.invalidate_caches()
    return importlib.import_module(name)


@contextlib.contextmanager
def said_if_slow(name: str, after_s: float = SLOW_IMPORT_S):
    """Warn once if the block (an import) is still running after ``after_s`` seconds."""
    done = threading.Event()

    def notice():
        if not done.wait(after_s):
            warnings.warn(PluginWarning(f"xlstm-zoo: still importing plugin module {name} after {after_s:.0f} s "
                                        "(start-up waits for it; XLSTM_ZOO_DISABLE_PLUGINS skips plugins)"))

    thread = threading.Thread(target=notice, name=f"xlstm-zoo slow import {name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
