"""Write what a GPU run ran on (device, driver, torch, Triton, CUDA, nvcc, CPU, command) as JSON.

    python tools/gpu/environment.py OUT.json "COMMAND"
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _run(*cmd: str) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(command: str) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    nvcc = _run("nvcc", "--version")
    smi = _run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    return dict(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command=command,
        # The device tool's copy may carry a stale .git: the caller passes the commit it sent.
        commit=os.environ.get("XLSTM_ZOO_GPU_COMMIT") or _run("git", "rev-parse", "--short", "HEAD"),
        device=torch.cuda.get_device_name() if cuda else "cpu (rehearsal: no CUDA device)",
        compute_capability=".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        nvidia_smi=smi,
        torch=torch.__version__, cuda=torch.version.cuda, triton=_version("triton"),
        nvcc=nvcc.splitlines()[-1] if nvcc else None,
        python=platform.python_version(), cpu=_cpu(),
        xlstm=_version("xlstm"), mlstm_kernels=_version("mlstm_kernels"), xlstm_zoo=_version("xlstm-zoo"),
    )


if __name__ == "__main__":
    env = environment(sys.argv[2] if len(sys.argv) > 2 else "")
    Path(sys.argv[1]).write_text(json.dumps(env, indent=2) + "\n")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("time", "command") and v))
