import re

import pytest
import torch

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
