"""Local plugin modules as the help describes them: `--plugin my_cells.py` loads that file, and
`--plugin my_cells` / `XLSTM_ZOO_PLUGINS=my_cells` find my_cells.py in the working directory, though the
`xlstm-zoo` script's folder (not the working directory) heads sys.path; a plugin that takes long to import
is named while start-up waits for it."""

import os
import subprocess
import sys
import textwrap

import pytest

PLUGIN = """
from typing import Literal
import torch
import xlstm_zoo
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl
{slow}

class Config(ZooConfig):
    type: Literal["{name}"] = "{name}"

@xlstm_zoo.component("norm", "{name}", config=Config, description="a local plugin's norm")
class Norm(torch.nn.Module):
    def __init__(self, config, ctx):
        super().__init__()

    def forward(self, x):
        return x

@hookimpl
def register_components(register):
    register(Norm)
"""

# What the installed console script does: sys.path[0] is its own folder, never the working directory.
SCRIPT = ("import os, sys; sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]; "
          "from xlstm_zoo.cli import main; sys.exit(main())")


def _zoo(cwd, *args, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLSTM_ZOO_")}
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env={**environ, **env})


@pytest.fixture
def local(tmp_path):
    def make(module, name, slow=""):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN.format(name=name, slow=slow)))
        return tmp_path
    return make


@pytest.mark.parametrize("how", ["file", pytest.param("name", marks=pytest.mark.slow), "env"])
def test_a_local_module_is_found_as_the_help_says(local, how):
    cwd = local("my_cells", "localnorm")
    args = {"file": ["--plugin", "my_cells.py"], "name": ["--plugin", "my_cells"], "env": []}[how]
    proc = _zoo(cwd, *args, "list", "norm", **({"XLSTM_ZOO_PLUGINS": "my_cells"} if how == "env" else {}))
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    assert "localnorm" in proc.stdout, proc.stdout


def test_a_missing_plugin_file_is_one_warning(tmp_path):
    proc = _zoo(tmp_path, "--plugin", "nowhere.py", "list", "norm")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert "failed to import nowhere.py" in lines[0] and f"no plugin file nowhere.py (from {tmp_path})" in lines[0]


def test_a_slow_plugin_is_named_while_start_up_waits(local):
    cwd = local("slow_cells", "slownorm", slow="import time; time.sleep(3.5)")
    proc = _zoo(cwd, "--plugin", "slow_cells", "--help")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: still importing plugin module slow_cells after 2 s"), \
        proc.stderr
