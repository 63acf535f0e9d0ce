"""One cell of the shipped state-tracking grid, changed by overrides: the experiments behind its settings.

    python tests/fidelity/claim_cell.py EXPERIMENT PROFILE VARIANT SEED [path=value ...]

trains the parity cell of ``state_tracking --profile PROFILE`` for VARIANT and SEED, with the overrides
applied to that cell (after its variant, unlike ``--set``, which applies before a variant could
change the same field), on one thread, into ``runs/claim/EXPERIMENT/cells/<variant>__<overrides>__seed=N-<digest>``
with ``metrics.jsonl`` and ``result.json`` (steps, early stop, CPU seconds) as a grid cell has them.
``tests/fidelity/claim_runs.py runs/claim/*`` then tabulates and plots them. Not part of the test run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
from pathlib import Path

import torch

from xlstm_zoo.grid.expand import expand
from xlstm_zoo.recipe_loader.load import load_recipe
from xlstm_zoo.training.distributed import DistContext
from xlstm_zoo.training.trainer import _Run, train


def cell_recipe(profile: str, variant: str, seed: int, overrides: list[str]):
    """The parity cell of ``state_tracking --profile PROFILE`` for VARIANT and SEED, with the overrides
    applied to the cell. Any seed, not only the profile's: more seeds show how often a setting fails."""
    grid = load_recipe("state_tracking", ["grid.axes={task.type: [parity]}", f"grid.seeds=[{seed}]"], profile=profile)
    cells = [c for c in expand(grid) if c.labels["variant"] == variant and c.labels["seed"] == seed]
    if len(cells) != 1:
        raise SystemExit(f"no variant {variant!r} in profile {profile!r}")
    return load_recipe(cells[0].recipe, overrides) if overrides else cells[0].recipe


def add_cell_arguments(parser: argparse.ArgumentParser) -> None:
    """PROFILE VARIANT SEED [path=value ...]: which cell, and the overrides for :func:`cell_recipe`."""
    parser.add_argument("profile")
    parser.add_argument("variant")
    parser.add_argument("seed", type=int)
    parser.add_argument("overrides", nargs="*", help="path=value, applied to the cell")


def traced_run(description: str, argv=None):
    """``(args, run)`` for the tracing scripts (plateau_by_length.py, head_collapse.py): PROFILE VARIANT SEED
    [path=value ...] [--every N] [--until STEP] parsed, and the cell's training prepared (the trainer's
    ``_Run``: model, optimiser, task) with its early-stop rule off, on one thread, writing nothing."""
    parser = argparse.ArgumentParser(description=description)
    add_cell_arguments(parser)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--until", type=int, default=None, help="stop after this step (default: train.steps)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    recipe = cell_recipe(args.profile, args.variant, args.seed, [*args.overrides, "train.early_stop=null"])
    run = _Run.prepare(recipe, recipe.train, DistContext.from_env(), recipe.train.batch_size, "cpu", None)
    return args, run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    add_cell_arguments(parser)
    parser.add_argument("--runs", default="runs/claim")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    recipe = cell_recipe(args.profile, args.variant, args.seed, args.overrides)
    setting = "__".join(o.replace("/", "_") for o in args.overrides) or "base=1"
    digest = hashlib.sha256(repr((args.profile, args.variant, args.seed, args.overrides)).encode()).hexdigest()[:8]
    slug = re.sub(r"[^\w]", "_", args.variant)
    name = f"{slug}__task.type=parity__{setting}__seed={args.seed}-{digest}"
    run_dir = Path(args.runs, args.experiment, "cells", name)
    run_dir.mkdir(parents=True, exist_ok=True)
    wall, cpu = time.perf_counter(), time.process_time()
    result = train(recipe, run_dir)
    result.update(status="finished", seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)
    (run_dir / "result.json").write_text(json.dumps(result, default=str) + "\n")
    test = result["metrics"]["test"]["scaled_accuracy"]
    print(f"{name}: {result['steps']} steps{' (stopped early)' if result.get('stopped_early') else ''}, "
          f"test scaled accuracy {test:.3f}, {result['cpu_seconds']:.0f} CPU s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
