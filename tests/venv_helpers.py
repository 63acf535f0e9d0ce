"""Fresh virtual environments for tests that install things (the wheel, example plugins).

docs/testing.md: such tests reuse the installed torch (``python -m venv
--system-site-packages``) so nothing is downloaded; a ``.pth`` file adds the running
interpreter's site-packages too (torch may live in a venv, e.g. the Makefile's ``.venv``, which
``--system-site-packages`` does not expose). pip runs with ``--no-index``: nothing is downloaded.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "FORCE_COLOR", "TTY_COMPATIBLE")
           and not k.startswith("XLSTM_ZOO_")}
    env.update(PYTHONNOUSERSITE="1", COLUMNS="200", NO_COLOR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INDEX="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def run(cmd, *, cwd, timeout=120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def running_site_dirs() -> list[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    dirs += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    out = []
    for d in dirs:
        if d and Path(d).is_dir() and d not in out:
            out.append(d)
    return out


def under(path: str | os.PathLike, parent: Path) -> bool:
    return Path(path).resolve().is_relative_to(parent.resolve())


def make_venv(tmp: Path, *, as_site_dirs: bool = False) -> dict:
    """A fresh venv in ``tmp/venv`` that sees the running interpreter's packages (torch).

    ``as_site_dirs=False`` puts those directories on ``sys.path`` as plain paths (their own
    ``.pth`` files, e.g. editable installs, are not run); ``True`` adds them as site directories,
    so the running environment's editable install of xlstm-zoo imports in the venv too.
    Returns ``dict(dir, python, bin, site, tmp)``.
    """
    env_dir = tmp / "venv"
    proc = run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env_dir], cwd=tmp)
    assert proc.returncode == 0, show(proc)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    proc = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp)
    assert proc.returncode == 0, show(proc)
    venv_site = Path(proc.stdout.strip())
    assert under(venv_site, env_dir), f"venv purelib {venv_site} is not inside {env_dir}"
    dirs = [d for d in running_site_dirs() if not under(d, env_dir)]
    if as_site_dirs:  # a .pth line starting with `import` is executed (names it imports are not in scope
        # inside a comprehension there, hence __import__)
        text = f"import site; [__import__('site').addsitedir(d) for d in {dirs!r} if d not in __import__('sys').path]\n"
    else:
        text = "".join(d + "\n" for d in dirs)
    (venv_site / "_xlstm_zoo_test_running_env.pth").write_text(text)
    return dict(dir=env_dir, python=python, bin=bindir, site=venv_site, tmp=tmp)
