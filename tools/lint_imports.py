"""Run the import contract of ``pyproject.toml`` (import-linter) over the whole package.

import-linter finds a package's modules by walking the folder it is imported from, but
``xlstm_zoo`` is spread over several folders by the ``package-dir`` mapping (``zoo/`` holds
``xlstm_zoo``, ``backends/`` holds ``xlstm_zoo.backends``, ...), so it would see only ``zoo/``.
This script copies the package's modules into one folder laid out as installed (the mapping
:mod:`package_modules` reads) and runs ``lint-imports`` there::

    python tools/lint_imports.py      # exit status 0: the contract holds
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from package_modules import find_modules  # noqa: E402  (a sibling script, not an installed module)

REPO = Path(__file__).resolve().parents[1]


def mirror(repo: Path, target: Path) -> None:
    """Copy every module of the package under ``target`` at its installed path."""
    for name, path in find_modules(repo).items():
        parts = name.split(".")
        dest = target.joinpath(*parts, "__init__.py") if path.name == "__init__.py" else \
            target.joinpath(*parts[:-1], parts[-1] + ".py")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="xlstm-zoo-imports-") as tmp:
        mirror(REPO, Path(tmp))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        lint = Path(sys.executable).with_name("lint-imports")
        # Without the console script (a venv that sees import-linter system-wide): its click command
        # directly (``python -m importlinter.cli`` runs nothing and exits 0).
        command = [str(lint)] if lint.exists() else \
            [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
        return subprocess.run([*command, "--config", str(REPO / "pyproject.toml"), "--no-cache"], env=env,
                              cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
