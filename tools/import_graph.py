"""The import graph of the ``xlstm_zoo`` package, read from the source with ``ast``.

The package is spread over several top-level folders by the ``package-dir`` mapping in
``pyproject.toml`` (``zoo/`` is ``xlstm_zoo``, ``backends/`` is ``xlstm_zoo.backends``, ...), so a
tool that walks one folder misses most of it. This script reads the mapping, finds every module,
and follows every ``xlstm_zoo.*`` import to the module it names::

    python tools/import_graph.py             # the summary: arrows, circles, upward arrows, ...
    python tools/import_graph.py --details   # also list each circle, upward arrow and local import

An arrow is one (importer, imported) pair of modules; ``from xlstm_zoo.a import b`` points at
``xlstm_zoo.a.b`` when that is a module. Imports under ``if TYPE_CHECKING:`` are not arrows
(nothing runs them). Circles are the strongly connected components of the graph of every arrow,
module-level and function-level alike. Upward arrows go from a lower layer to a higher one, with
the layers of ``LAYERS`` (the same order as the import contract in ``pyproject.toml``).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = "xlstm_zoo"

# Lowest layer first; a module belongs to the first entry that is it or one of its parents.
# Modules in no entry (the package root) belong to no layer and are never "upward".
LAYERS = [
    ["xlstm_zoo.errors", "xlstm_zoo.allocator", "xlstm_zoo.compiling", "xlstm_zoo.version", "xlstm_zoo.tolerances",
     "xlstm_zoo.packed"],
    ["xlstm_zoo.backends"],
    ["xlstm_zoo.registry"],
    ["xlstm_zoo.config"],
    ["xlstm_zoo.gates", "xlstm_zoo.norms", "xlstm_zoo.layers", "xlstm_zoo.cells", "xlstm_zoo.blocks",
     "xlstm_zoo.stacks", "xlstm_zoo.tasks", "xlstm_zoo.initialization", "xlstm_zoo.loggers"],
    ["xlstm_zoo.models"],
    ["xlstm_zoo.recipe", "xlstm_zoo.checkpoint"],
    ["xlstm_zoo.export", "xlstm_zoo.pretrained", "xlstm_zoo.interop"],
    ["xlstm_zoo.training", "xlstm_zoo.testing"],
    ["xlstm_zoo.grid", "xlstm_zoo.bench", "xlstm_zoo.plugins"],
    ["xlstm_zoo.commands"],
    ["xlstm_zoo.core_plugin"],
    ["xlstm_zoo.cli", "xlstm_zoo.wiring"],
]


@dataclass
class Graph:
    modules: dict[str, Path]
    arrows: dict[tuple[str, str], str] = field(default_factory=dict)  # (a, b) -> "module" | "function"
    local_imports: list[tuple[str, int, str]] = field(default_factory=list)  # (module, line, imported)
    # every import statement inside a function, any module: (module, line, has a reason comment)
    function_imports: list[tuple[str, int, bool]] = field(default_factory=list)


def package_dirs(repo: Path) -> dict[str, Path]:
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: repo / folder for name, folder in mapping.items()}


def find_modules(repo: Path) -> dict[str, Path]:
    """Module name -> file, following the package-dir mapping (a longer mapped name wins)."""
    dirs = package_dirs(repo)
    modules: dict[str, Path] = {}
    for package, folder in sorted(dirs.items(), key=lambda kv: len(kv[0])):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = rel.parts
            if "examples" in parts or any(not re.fullmatch(r"\w+", p) for p in parts):
                continue  # example plugin distributions are not part of the package
            if not all((folder.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue
            name = ".".join((package, *parts))
            if name.endswith(".__init__"):
                name = name.removesuffix(".__init__")
            modules[name] = path
    return modules


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = []
    for name in names:
        if not (name == ROOT or name.startswith(ROOT + ".")):
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name not in found:
            found.append(name)
    return found


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _has_reason(lines: list[str], node: ast.AST) -> bool:
    """A ``#`` comment on the import's own lines or on the line just above it."""
    own = lines[node.lineno - 1: node.end_lineno]
    above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
    return any("#" in line for line in own) or above.startswith("#")


def build_graph(repo: Path) -> Graph:
    modules = find_modules(repo)
    graph = Graph(modules)

    for module, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source, str(path))
        is_package = path.name == "__init__.py"

        def visit(node, in_function: bool, reasoned: bool = False):
            # ``reasoned``: inside a ``try:`` whose own line carries the comment (several optional imports)
            reasoned = reasoned or (isinstance(node, ast.Try) and "#" in lines[node.lineno - 1])
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for sub in child.orelse:
                        visit_one(sub, in_function, reasoned)
                    continue
                visit_one(child, in_function, reasoned)

        def visit_one(child, in_function, reasoned=False):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    graph.function_imports.append((module, child.lineno, reasoned or _has_reason(lines, child)))
                for target in _targets(child, module, is_package, modules):
                    if target == module:
                        continue
                    kind = "function" if in_function else "module"
                    if graph.arrows.get((module, target)) != "module":
                        graph.arrows[(module, target)] = kind
                    if in_function:
                        graph.local_imports.append((module, child.lineno, target))
                return
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner, reasoned)

        visit(tree, False)
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {m: [] for m in graph.modules}
    for a, b in graph.arrows:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph.modules:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found, key=len, reverse=True)


def layer_of(module: str) -> int | None:
    for level, entries in enumerate(LAYERS):
        if any(module == e or module.startswith(e + ".") for e in entries):
            return level
    return None


def upward_arrows(graph: Graph) -> list[tuple[str, str]]:
    out = []
    for a, b in graph.arrows:
        la, lb = layer_of(a), layer_of(b)
        if la is not None and lb is not None and lb > la:
            out.append((a, b))
    return sorted(out)


def summary(repo: Path) -> dict:
    graph = build_graph(repo)
    found = circles(graph)
    lines = sum(len(p.read_text().splitlines()) for p in graph.modules.values())
    return {
        "modules": len(graph.modules),
        "lines": lines,
        "arrows": len(graph.arrows),
        "module-level arrows": sum(k == "module" for k in graph.arrows.values()),
        "circles": len(found),
        "largest circle": max((len(c) for c in found), default=0),
        "upward arrows": len(upward_arrows(graph)),
        "function-level imports of the package": len(graph.local_imports),
        "function-level import statements (any module)": len(graph.function_imports),
        "  of them without a reason comment": sum(not r for _, _, r in graph.function_imports),
        "  per 1,000 lines": round(1000 * len(graph.function_imports) / max(lines, 1), 1),
        "_graph": graph,
        "_circles": found,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--details", action="store_true", help="list circles, upward arrows, local imports")
    args = parser.parse_args(argv)
    result = summary(Path(args.repo))
    for key, value in result.items():
        if not key.startswith("_"):
            print(f"{key}: {value}")
    if args.details:
        graph = result["_graph"]
        for comp in result["_circles"]:
            print(f"circle of {len(comp)}: {' '.join(comp)}")
        for a, b in upward_arrows(graph):
            print(f"upward: {a} -> {b} ({graph.arrows[(a, b)]}-level)")
        for module, line, target in graph.local_imports:
            print(f"local import: {module}:{line} -> {target}")
        for module, line, reason in graph.function_imports:
            if not reason:
                print(f"function-level import without a reason: {graph.modules[module]}:{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
