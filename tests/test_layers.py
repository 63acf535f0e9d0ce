"""The package's import contracts (layers only downward, no circles, model code off the backends' kernels,
all in ``pyproject.toml``, checked by import-linter over every module of the ``package-dir`` mapping), and
function-level imports only with a reason."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import package_modules  # noqa: E402  (a script in tools/, not an installed module)


def test_every_folder_of_the_mapping_is_read():
    modules = package_modules.find_modules(REPO)
    for name in ("xlstm_zoo.cli", "xlstm_zoo.backends.dispatch", "xlstm_zoo.plugins.loader", "xlstm_zoo.export.onnx",
                 "xlstm_zoo.recipe_loader.schema", "xlstm_zoo.commands.doctor"):
        assert name in modules, name
    assert not any(".examples" in name for name in modules)


def test_import_linter_contracts_hold():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "lint_imports.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 kept, 0 broken" in proc.stdout  # layers, circles, and model code off the backends' kernels


def test_function_level_imports_say_why():
    """Only optional dependencies (onnx, triton, matplotlib, ...) are imported inside functions, each with a
    comment; everything else is imported at the top of its module."""
    missing = [f"{path.relative_to(REPO)}:{line}" for path in package_modules.find_modules(REPO).values()
               for line in package_modules.unexplained_function_imports(path)]
    assert not missing, missing


def test_an_unexplained_function_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n\n\ndef g():\n    import onnx  # optional\n")
    assert package_modules.unexplained_function_imports(module) == [2]
