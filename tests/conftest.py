import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# Test helpers (gate_inputs, venv_helpers, toy_task, dying_task) live in tests/; tests in sub-folders import them too.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Triton kernels run on CPU tensors through Triton's interpreter when no GPU is visible. The flag is
# read when a kernel is decorated, so it must be set before any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Token caches (text_lm) go to a folder of this test session, never the user's ~/.cache.
os.environ.setdefault("XLSTM_ZOO_CACHE", tempfile.mkdtemp(prefix="xlstm-zoo-test-cache-"))

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """``run_cli(*argv) -> (exit code, stdout, stderr)``, in-process through ``cli.main``, colour codes stripped."""
    from xlstm_zoo import cli

    monkeypatch.setattr(cli.console, "width", 200)  # tables: no wrapping of names

    def _run(*argv):
        capsys.readouterr()
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, ANSI.sub("", out), ANSI.sub("", err)

    return _run
