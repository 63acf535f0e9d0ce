"""Packaging: the wheel holds the whole product, triton stays optional, pyproject matches the tree.

docs/architecture.md: one import namespace (``xlstm_zoo``) mapped from the folders ``zoo/``,
``backends/``, ``plugins/``, ``export/`` (and the recipe data under ``recipes/``) with setuptools
``package-dir``; an editable install and a wheel install import identically; nothing generic is
installed as a top-level module. Section 5: tests that install into a fresh virtual environment
reuse the installed torch (``--system-site-packages``), so nothing is downloaded.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from venv_helpers import ROOT, make_venv, run, show, under

# Source folder -> import name (docs/architecture.md).
CODE_FOLDERS = {
    "zoo": "xlstm_zoo",
    "backends": "xlstm_zoo.backends",
    "plugins": "xlstm_zoo.plugins",
    "export": "xlstm_zoo.export",
}
DATA_FOLDERS = {"recipes": "xlstm_zoo.recipes"}
# plugins/examples/ holds example third-party plugin *distributions*: not part of the wheel.
NOT_IN_WHEEL = (Path("plugins") / "examples",)
GENERIC_TOP_LEVEL = ("zoo", "backends", "plugins", "export", "recipes")


def _excluded(rel: Path) -> bool:
    return "__pycache__" in rel.parts or any(rel == p or p in rel.parents for p in NOT_IN_WHEEL)


def source_modules() -> list[str]:
    """Every module the source folders hold, under its import name (packages and plain modules)."""
    names = set()
    for folder, prefix in CODE_FOLDERS.items():
        base = ROOT / folder
        assert base.is_dir(), f"source folder {folder}/ is missing"
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT)
            if _excluded(rel):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.add(".".join([prefix, *parts]))
    return sorted(names)


def source_packages() -> dict[str, str]:
    """Import name -> folder (relative to the repo) for every folder holding an ``__init__.py``."""
    found = {}
    for folder, prefix in {**CODE_FOLDERS, **DATA_FOLDERS}.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            if _excluded(rel):
                continue
            parts = init.parent.relative_to(base).parts
            found[".".join([prefix, *parts])] = rel.as_posix()
    return found


def shipped_recipe_names() -> list[str]:
    base = ROOT / "recipes"
    return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))


# -- 1. the wheel, installed into a fresh virtual environment ----------------------------------------

# Run inside the venv: import every module, report where each came from. The editable install of the
# outer environment (if its finder is visible) is switched off first, so that a module missing from
# the wheel cannot be served silently from the repository.
IMPORT_ALL = textwrap.dedent("""
    import importlib, json, sys
    def editable(obj):
        return str(getattr(obj, "__module__", "") or "").startswith("__editable__")
    sys.meta_path[:] = [f for f in sys.meta_path if not editable(f)]
    sys.path_hooks[:] = [h for h in sys.path_hooks if not editable(h)]
    sys.path_importer_cache.clear()
    out = {"modules": {}, "errors": {}}
    for name in json.loads(sys.argv[1]):
        try:
            out["modules"][name] = importlib.import_module(name).__file__
        except Exception as err:
            out["errors"][name] = f"{type(err).__name__}: {err}"
    if not out["errors"]:
        from xlstm_zoo.recipe_loader import shipped_recipes, shipped_recipes_dir
        out["recipes_dir"] = str(shipped_recipes_dir())
        out["recipes"] = shipped_recipes()
    print("RESULT=" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from (a copy of) the repository root, without build isolation.

    The copy (tracked and untracked files, minus build outputs) keeps setuptools' ``build/`` folder
    out of the working tree: a stale ``build/lib`` there can put deleted modules into a wheel.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".benchmarks", ".venv", "runs"))
    out = tmp / "dist"
    proc = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out], cwd=src, timeout=180)
    assert proc.returncode == 0, "python -m build --wheel failed:\n" + show(proc)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel, got {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv that sees the running interpreter's packages (torch) and has the wheel installed."""
    tmp = tmp_path_factory.mktemp("venv")
    made = make_venv(tmp)  # asserts the venv's purelib is inside it; adds the running site-packages
    env_dir, python, bindir, venv_site = made["dir"], made["python"], made["bin"], made["site"]
    # pip comes from the running environment; --ignore-installed because the outer editable install
    # is visible, and pip would otherwise consider xlstm-zoo already installed.
    proc = run([python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index", wheel], cwd=tmp,
                timeout=180)
    assert proc.returncode == 0, "pip install of the wheel into the venv failed:\n" + show(proc)
    return dict(dir=env_dir, python=python, bin=bindir, site=venv_site, tmp=tmp)


@pytest.mark.slow
def test_wheel_installs_and_runs_in_fresh_venv(wheel, venv):
    python, venv_site, tmp = venv["python"], venv["site"], venv["tmp"]
    cwd = tmp  # never the repo root: '' on sys.path would make the source folders importable

    # -- the wheel itself: names, top level, metadata -----------------------------------------
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
    top = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"xlstm_zoo"}, f"wheel top-level entries besides the dist-info: {sorted(top - dist_info)}"
    for rec in shipped_recipe_names():
        assert f"xlstm_zoo/recipes/{rec}.yaml" in names, f"recipe recipes/{rec}.yaml is not in the wheel"

    assert meta["Name"] == "xlstm-zoo", f"distribution name is {meta['Name']!r}"
    assert meta["Requires-Python"] is not None and meta["Requires-Python"].replace(" ", "") == ">=3.11", \
        f"Requires-Python is {meta['Requires-Python']!r}"
    requires = meta.get_all("Requires-Dist") or []
    assert any(re.match(r"torch\b", r) for r in requires), requires
    assert "triton" in (meta.get_all("Provides-Extra") or []), meta.get_all("Provides-Extra")
    # triton and the official parity packages are extras only, never unconditional requirements
    for req in requires:
        if re.match(r"(triton|xlstm|mlstm[-_]kernels)\b", req, re.I):
            assert re.search(r"extra\s*==", req), f"unconditional requirement in the wheel: {req!r}"
    assert any(re.match(r"triton\b", r) and re.search(r"extra\s*==\s*['\"]triton['\"]", r) for r in requires), \
        f"no triton requirement under the 'triton' extra: {requires}"

    # -- installed into the venv, and really the wheel (not the outer editable install) ---------
    proc = run([python, "-c", "import xlstm_zoo; print(xlstm_zoo.__file__)"], cwd=cwd)
    assert proc.returncode == 0, show(proc)
    init_file = Path(proc.stdout.strip().splitlines()[-1])
    assert under(init_file, venv_site), f"xlstm_zoo imported from {init_file}, not from the venv ({venv_site})"
    assert not under(init_file, ROOT), f"xlstm_zoo imported from the repository: {init_file}"

    for name in GENERIC_TOP_LEVEL:
        assert not (venv_site / name).exists() and not (venv_site / f"{name}.py").exists(), \
            f"the wheel installed a generic top-level module {name!r} into {venv_site}"

    # -- every module of the source tree imports from the wheel --------------------------------
    modules = source_modules()
    assert "xlstm_zoo.cli" in modules and "xlstm_zoo.backends" in modules, modules
    proc = run([python, "-c", IMPORT_ALL, json.dumps(modules)], cwd=cwd, timeout=120)
    assert proc.returncode == 0 and "RESULT=" in proc.stdout, show(proc)
    result = json.loads(proc.stdout.rsplit("RESULT=", 1)[1])
    assert not result["errors"], "modules of the source tree that do not import from the wheel " \
                                 "(missing from [tool.setuptools] packages?):\n" + \
                                 "\n".join(f"  {k}: {v}" for k, v in result["errors"].items())
    elsewhere = {m: f for m, f in result["modules"].items() if not under(f, venv_site)}
    assert not elsewhere, f"modules not loaded from the wheel in {venv_site}: {elsewhere}"
    assert under(result["recipes_dir"], venv_site), result["recipes_dir"]
    assert result["recipes"] == shipped_recipe_names(), "shipped recipes in the wheel differ from recipes/"

    # -- the console script from the wheel ----------------------------------------------------
    script = venv["bin"] / ("xlstm-zoo.exe" if os.name == "nt" else "xlstm-zoo")
    assert script.is_file(), f"console script not installed: {script}"
    first = script.read_text(errors="replace").splitlines()[0] if os.name != "nt" else ""
    assert os.name == "nt" or str(venv["dir"]) in first, f"console script does not use the venv python: {first}"

    proc = run([script, "list", "cell"], cwd=cwd)
    assert proc.returncode == 0, show(proc)
    for cell in ("lstm", "slstm", "mlstm"):
        assert re.search(rf"\b{cell}\b", proc.stdout), f"{cell} missing from `xlstm-zoo list cell`:\n{proc.stdout}"

    proc = run([script, "recipes"], cwd=cwd)
    assert proc.returncode == 0, show(proc)
    for rec in shipped_recipe_names():
        assert rec in proc.stdout, f"{rec} missing from `xlstm-zoo recipes` (wheel):\n{proc.stdout}"

    proc = run([script, "build", "xlstm_7_1"], cwd=cwd)
    assert proc.returncode == 0, show(proc)
    assert "xLSTM[7:1]" in proc.stdout and "total" in proc.stdout, proc.stdout
    import xlstm_zoo  # the outer (editable) install: a wheel and an editable install build the same model

    expected = sum(p.numel() for p in xlstm_zoo.build(xlstm_zoo.load_recipe("xlstm_7_1")).parameters())
    total_row = next(line for line in proc.stdout.splitlines() if "total" in line)
    assert f"{expected:,}" in total_row, f"total row {total_row!r} != {expected:,} parameters"
    assert "Traceback" not in proc.stderr, proc.stderr


# -- 2. triton is optional -----------------------------------------------------------------------------

NO_TRITON = textwrap.dedent("""
    import sys
    sys.modules["triton"] = None  # any `import triton` (or triton.language, ...) now raises ImportError
    import importlib, json, pkgutil
    import torch
    import xlstm_zoo
    names = set(json.loads(sys.argv[1]))
    for pkg in ("xlstm_zoo", "xlstm_zoo.backends", "xlstm_zoo.plugins", "xlstm_zoo.export"):
        mod = importlib.import_module(pkg)
        names.update(m.name for m in pkgutil.walk_packages(mod.__path__, pkg + "."))
    # The Triton kernel modules are the one place that imports triton at the top; the triton backend
    # loads them lazily, only once triton and a GPU are there. Everything else must import.
    kernels = {n for n in names if n.startswith("xlstm_zoo.backends.triton.")}
    assert kernels, "no Triton kernel modules found: the walk is broken"
    for name in sorted(names - kernels):
        importlib.import_module(name)
    for name in sorted(kernels):
        try:
            importlib.import_module(name)
        except ImportError as err:
            assert "triton" in str(err), (name, err)
        else:
            raise AssertionError(f"{name} imported without triton: it should not be a kernel module")
    from xlstm_zoo.backends.dispatch import select
    for op in ("mlstm_sequence", "slstm_sequence", "mlstm_step"):
        assert select(op, torch.device("cpu"), torch.float32).name != "triton", op
    recipe = xlstm_zoo.load_recipe("xlstm_1_1", ["stack.num_blocks=2", "dim=32"])
    model = xlstm_zoo.build(recipe).eval()
    assert recipe.model.dim == 32 and len(model.stack.blocks) == 2, (recipe.model.dim, len(model.stack.blocks))
    tokens = torch.randint(0, recipe.model.vocab_size, (2, 7))
    with torch.no_grad():
        logits, _ = model(tokens)
    assert logits.shape == (2, 7, recipe.model.vocab_size), logits.shape
    assert torch.isfinite(logits).all()
    real = [k for k, v in sys.modules.items() if (k == "triton" or k.startswith("triton.")) and v is not None]
    assert not real, f"triton modules loaded despite the block: {real}"
    assert sys.modules.get("triton", "absent") is None, "sys.modules['triton'] was replaced"
    print("OK", len(names), "modules")
""")


def test_triton_is_optional(tmp_path):
    proc = run([sys.executable, "-c", NO_TRITON, json.dumps(source_modules())], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, \
        "xlstm_zoo needs triton to import, build or run a model:\n" + show(proc)


# -- 3. pyproject lists every package of the source tree ----------------------------------------------

def _setuptools_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_pyproject_lists_every_source_package():
    cfg = _setuptools_config()
    package_dir = cfg.get("package-dir", {})
    for folder, name in {**CODE_FOLDERS, **DATA_FOLDERS}.items():
        assert package_dir.get(name) == folder, \
            f"[tool.setuptools] package-dir should map {name!r} to {folder!r}; it has {package_dir.get(name)!r}"
    assert not [k for k in package_dir if k in ("", *GENERIC_TOP_LEVEL)], \
        f"package-dir maps generic top-level names: {package_dir}"

    listed = set(cfg.get("packages", []))
    on_disk = source_packages()
    missing = {name: folder for name, folder in on_disk.items() if name not in listed}
    assert not missing, (
        "folders with an __init__.py that [tool.setuptools] packages in pyproject.toml does not list "
        "(an editable install imports them, a wheel would not ship them): "
        + ", ".join(f"{folder}/ -> add {name!r}" for name, folder in sorted(missing.items())))
    stale = sorted(listed - set(on_disk))
    assert not stale, f"[tool.setuptools] packages lists packages with no folder/__init__.py: {stale}"


def test_pyproject_ships_the_recipe_files():
    data = _setuptools_config().get("package-data", {})
    for yaml_file in (ROOT / "recipes").rglob("*.yaml"):
        rel = yaml_file.parent.relative_to(ROOT / "recipes")
        pkg = ".".join(["xlstm_zoo.recipes", *rel.parts])
        patterns = data.get(pkg, []) + data.get("*", []) + data.get("", [])
        assert any(Path(yaml_file.name).match(p) for p in patterns), \
            f"{yaml_file.relative_to(ROOT)} is not covered by [tool.setuptools.package-data] {pkg!r}"
        assert (yaml_file.parent / "__init__.py").is_file(), \
            f"{rel.as_posix() or '.'}: recipe folder without __init__.py is not a package the wheel ships"
