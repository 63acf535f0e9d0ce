"""The modules of the ``xlstm_zoo`` package, found through the ``package-dir`` mapping, and their imports
inside functions.

The package is spread over several top-level folders by the mapping in ``pyproject.toml`` (``zoo/`` is
``xlstm_zoo``, ``backends/`` is ``xlstm_zoo.backends``, ...), so a tool that walks one folder misses most
of it. :mod:`lint_imports` mirrors these modules for import-linter, which checks the import contracts
(layers, circles); :func:`unexplained_function_imports` is the one rule import-linter has no contract for.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path


def package_dirs(repo: Path) -> dict[str, Path]:
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: repo / folder for name, folder in mapping.items()}


def find_modules(repo: Path) -> dict[str, Path]:
    """Module name -> file, following the package-dir mapping (a longer mapped name wins)."""
    modules: dict[str, Path] = {}
    for package, folder in sorted(package_dirs(repo).items(), key=lambda kv: len(kv[0])):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if "examples" in parts or any(not re.fullmatch(r"\w+", p) for p in parts):
                continue  # example plugin distributions are not part of the package
            if not all((folder.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue
            modules[".".join((package, *parts)).removesuffix(".__init__")] = path
    return modules


def _has_reason(lines: list[str], node: ast.AST) -> bool:
    """A ``#`` comment on the import's own lines or on the line just above it."""
    own = lines[node.lineno - 1: node.end_lineno]
    above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
    return any("#" in line for line in own) or above.startswith("#")


def unexplained_function_imports(path: Path) -> list[int]:
    """Lines of imports inside functions with no comment saying why (optional dependencies are imported
    there, each with its reason; a ``try:`` whose own line has the comment covers the imports it holds)."""
    lines = path.read_text().splitlines()
    found: list[int] = []

    def visit(node: ast.AST, in_function: bool, reasoned: bool) -> None:
        reasoned = reasoned or (isinstance(node, ast.Try) and "#" in lines[node.lineno - 1])
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function and not (reasoned or _has_reason(lines, child)):
                    found.append(child.lineno)
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner, reasoned)

    visit(ast.parse("\n".join(lines), str(path)), False, False)
    return found
