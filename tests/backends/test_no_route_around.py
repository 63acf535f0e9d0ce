"""Every backend choice goes through the dispatcher (docs/backends.md): no model file reads the backend
environment variable or chooses a path by a config's ``backend`` field. Forwarding the field to an op
(``backend=self.config.backend``) is how a forced backend reaches the dispatcher, and is allowed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ZOO = Path(__file__).resolve().parents[2] / "zoo"
MODEL_FILES = sorted([*ZOO.glob("cells/*.py"), *ZOO.glob("blocks/*.py"), *ZOO.glob("models/*.py"),
                      ZOO / "stacks.py", ZOO / "layers.py"])
ENV_NAMES = {"ENV_FORCE", "XLSTM_ZOO_BACKEND", "environ", "getenv", "forced"}


def _reads_environment(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id in ENV_NAMES)
            or (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES)
            or (isinstance(node, ast.Constant) and node.value == "XLSTM_ZOO_BACKEND")
            or (isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] in ENV_NAMES))


def _tests(tree: ast.AST):
    """Every expression that chooses a path: conditions of if, while, ternaries, asserts, comprehension filters,
    and the operands of boolean operators and comparisons."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, (ast.BoolOp, ast.Compare)):
            yield node


def route_arounds(source: str) -> list[str]:
    tree = ast.parse(source)
    found = [f"line {n.lineno}: reads the backend environment variable" for n in ast.walk(tree)
             if _reads_environment(n)]
    found += [f"line {n.lineno}: chooses by a backend field" for test in _tests(tree) for n in ast.walk(test)
              if isinstance(n, ast.Attribute) and n.attr == "backend"]
    return sorted(set(found))


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: str(p.relative_to(ZOO)))
def test_model_file_leaves_backend_choice_to_the_dispatcher(path):
    found = route_arounds(path.read_text())
    assert not found, f"{path.relative_to(ZOO)}: {'; '.join(found)}"


def test_the_check_sees_each_kind_of_route_around():
    assert route_arounds("from xlstm_zoo.backends.dispatch import ENV_FORCE")
    assert route_arounds("import os\nx = os.environ.get('XLSTM_ZOO_BACKEND')")
    assert route_arounds("y = a if self.config.backend is None else b")
    assert route_arounds("if c.backend == 'cpp' and x:\n    pass")
    assert route_arounds("ok = x.dim() == 3 and self.config.backend is None")
    assert not route_arounds("h = ops.lstm_step(wx, R, s, backend=self.config.backend)")
