"""Data-parallel training with ``torch.distributed``: who this process is, and the few collectives
the trainer needs.

A process started by ``torchrun`` (or ``xlstm-zoo train --nproc N``, which starts ``torchrun``)
finds ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in its environment. With one process nothing here
touches ``torch.distributed`` and the trainer runs its single-process code path.

The contract (see ``docs/scale-out.md``): ``train.batch_size`` is the *global* batch. Every rank
draws the same global batch from the ``(seed, step)`` generator and keeps its own contiguous rows;
each rank's loss is its rows' summed negative log-likelihood divided by the *global* number of
scored tokens; gradients are summed across ranks (a DDP communication hook that adds and does not
average), so every rank holds the gradient of the global mean loss and takes the same step. Only
rank 0 writes files.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tasks.base import merge_scores


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "DistContext":
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local = int(os.environ.get("LOCAL_RANK", str(rank)))
        except ValueError as err:
            raise ConfigError(f"RANK / WORLD_SIZE / LOCAL_RANK must be whole numbers (set by torchrun): {err}") from None
        return cls(rank, world, local)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: str) -> str:
        """``cuda`` becomes this rank's GPU (``cuda:<local rank>``); other devices are unchanged."""
        if self.distributed and device == "cuda":
            return f"cuda:{self.local_rank}"
        return device

    def init(self, device: str, timeout_s: float = 600.0) -> None:
        """Join the process group (NCCL on CUDA, gloo otherwise); a no-op for one process."""
        if not self.distributed or dist.is_initialized():
            return
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))

    def destroy(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def check_split(batch_size: int, world: int, micro_batches: int, source: str | None = None) -> int:
    """Rows each process takes per micro-batch; the global batch must split evenly."""
    parts = world * micro_batches
    if batch_size % parts:
        raise ConfigError(f"train.batch_size={batch_size} does not split into {world} process(es) x "
                          f"{micro_batches} micro-batch(es); use a multiple of {parts}",
                          path="train.batch_size", file=source)
    return batch_size // parts


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The sum over ranks (the tensor itself for one process)."""
    if ctx.distributed:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def sum_hook(state, bucket):  # no annotations: DDP compares them to its classes, and this module's are strings
    """DDP communication hook: gradients are *summed* across ranks (DDP's default averages)."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def reduce_scores(scores: dict[str, tuple[float, int]], ctx: DistContext) -> dict[str, tuple[float, int]]:
    """Add ``(sum, count)`` score dicts across ranks, in rank order (every rank gets the same result;
    a rank that scored nothing contributes an empty dict)."""
    if not ctx.distributed:
        return scores
    gathered: list = [None] * ctx.world
    dist.all_gather_object(gathered, scores)
    return merge_scores(gathered)


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone`` (a free local port: launches side by side
    don't collide) running ``python -m xlstm_zoo ARGV`` in ``nproc`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "xlstm_zoo", *argv]


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # Linux; resolved before fork, so the child takes no lock
    except (OSError, AttributeError):
        return None


def _die_with_parent(prctl, parent: int) -> None:  # runs in the child between fork and exec
    if prctl is None:
        return
    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def run_torchrun(nproc: int, argv: list[str], *, threads: int | None = None, capture: bool = False):
    """Run :func:`torchrun_command` as a child that cannot outlive this process (killed with it,
    SIGKILL included, on Linux; torchrun then stops its ranks) nor an interrupt of it.
    Returns the ``CompletedProcess`` (stdout and stderr as text when ``capture``)."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads or max(1, (os.cpu_count() or 1) // nproc))
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(torchrun_command(nproc, argv), env=env, stdout=pipe, stderr=pipe, text=True,
                            start_new_session=True, preexec_fn=functools.partial(_die_with_parent, _prctl(), os.getpid()))
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:  # interrupted: Ctrl-C to torchrun and its ranks (rank 0 checkpoints), then make sure
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
