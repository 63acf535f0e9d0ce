"""The package's import graph: no circles, no arrow up the layers, function-level imports only with a reason.

The graph follows the ``package-dir`` mapping (``tools/import_graph.py``); the same layers are the
import-linter contract in ``pyproject.toml`` that ``make imports`` (and CI) runs.
"""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import import_graph  # noqa: E402  (a script in tools/, not an installed module)


@pytest.fixture(scope="module")
def graph():
    return import_graph.summary(REPO)


def test_every_module_of_the_package_is_in_the_graph(graph):
    modules = graph["_graph"].modules
    for name in ("xlstm_zoo.cli", "xlstm_zoo.backends.dispatch", "xlstm_zoo.plugins.loader", "xlstm_zoo.export.onnx",
                 "xlstm_zoo.recipe.schema", "xlstm_zoo.commands.doctor"):
        assert name in modules, name
    assert graph["arrows"] > 300, graph


def test_no_import_circles(graph):
    assert graph["circles"] == 0, "\n".join(" ".join(c) for c in graph["_circles"])


def test_no_arrow_points_up_the_layers(graph):
    up = import_graph.upward_arrows(graph["_graph"])
    assert not up, up


def test_function_level_imports_say_why(graph):
    """Only optional dependencies (onnx, triton, matplotlib, ...) are imported inside functions,
    each with a comment; everything else is imported at the top of its module."""
    g = graph["_graph"]
    missing = [f"{g.modules[m].relative_to(REPO)}:{line}" for m, line, ok in g.function_imports if not ok]
    assert not missing, missing


def test_the_contract_layers_match_the_tool():
    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    declared = [sorted(part.strip() for part in layer.split(":")) for layer in reversed(contract["layers"])]
    assert declared == [sorted(layer) for layer in import_graph.LAYERS]


@pytest.mark.skipif(importlib.util.find_spec("importlinter") is None, reason="import-linter is not installed")
def test_import_linter_contracts_hold():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "lint_imports.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 kept, 0 broken" in proc.stdout  # the layers, and model code off the backends' kernels
