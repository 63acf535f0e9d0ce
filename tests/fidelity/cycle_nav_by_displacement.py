"""Where a trained cycle_nav model is right: accuracy by input length and by net displacement.

    python tests/fidelity/cycle_nav_by_displacement.py RUN_DIR [RUN_DIR ...] [--batches 4] [--ceiling]

A cycle_nav answer is the net displacement ``d = #(+1) - #(-1)`` mod 5. A model that tracks the
position on the cycle (a finite-state solution) is right at every ``d`` and length; a model that
counts ``d`` and reads the count out mod 5 is right only for the counts its read-out was trained on,
and those are small: on the train lengths (3-40) ``|d| >= 10`` in about 2% of inputs, ``|d| >= 15``
in 0.05%. The table tells the two apart: accuracy falling with ``|d|`` at a fixed length is counting;
falling with length at a fixed ``|d|`` is a state that drifts. Each row is a length, each column a
band of ``|d|``; every cell is accuracy (inputs in the band), on 256 x ``--batches`` inputs per length.
Not part of the test run.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.training.trainer import build_task

LENGTHS = (20, 40, 80, 160, 256)
BANDS = (0, 5, 10, 15, 20, 25)  # |d| in [band, next band); the last band is open


def band(d: int) -> int:
    return max(b for b in BANDS if d >= b)


def net_displacement(moves: torch.Tensor) -> torch.Tensor:
    """``|#(+1) - #(-1)|`` per row of cycle_nav input ids (0 stay, 1 +1, 2 -1)."""
    return ((moves == 1).sum(1) - (moves == 2).sum(1)).abs()


def load_cycle_nav(run_dir: str):
    """``(task, model in eval mode, step)`` of a run's checkpoint; exits unless its task is cycle_nav."""
    recipe, model, state = load_checkpoint(run_dir)
    if recipe.task.type != "cycle_nav":
        raise SystemExit(f"{run_dir}: task {recipe.task.type!r}, not cycle_nav")
    return build_task(recipe), model.eval(), state.get("step")


@torch.no_grad()
def table(task, model, batches: int) -> str:
    generator = torch.Generator().manual_seed(0)
    right, seen = defaultdict(int), defaultdict(int)
    for length in LENGTHS:
        for _ in range(batches):
            batch = task.generate(length, 256, generator)
            logits, _ = model(batch.tokens)
            correct = logits[:, -1].argmax(-1) == batch.targets[:, -1]
            for d, ok in zip(net_displacement(batch.tokens[:, :length]).tolist(), correct.tolist()):
                right[length, band(d)] += ok
                seen[length, band(d)] += 1
    heads = [f"d = ±{lo}-{hi - 1}" for lo, hi in zip(BANDS, BANDS[1:])] + [f"d = ±{BANDS[-1]} or more"]
    lines = ["| length | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(BANDS)]
    for length in LENGTHS:
        cells = [f"{right[length, b] / seen[length, b]:.2f} ({seen[length, b]})" if seen[length, b] else "-"
                 for b in BANDS]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def counting_ceiling(task, per_length: int = 100) -> str:
    """Scaled test accuracy of a model right exactly when ``|d| < K`` (guessing otherwise), for the
    task's test lengths: the fraction of test inputs with ``|d| < K``."""
    generator = torch.Generator().manual_seed(0)
    displacement = torch.cat([net_displacement(task.sample(length, per_length, generator)[0])
                              for length in task.sizes("test")])
    lo, hi = task.config.test_lengths
    cells = [f"{(displacement < k).float().mean():.3f}" for k in BANDS[1:]]
    return "\n".join([f"right exactly when |d| < K, test lengths {lo}-{hi}: scaled accuracy", "",
                      "| K | " + " | ".join(str(k) for k in BANDS[1:]) + " |", "| --- |" + " --- |" * len(cells),
                      "| scaled accuracy | " + " | ".join(cells) + " |"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run or cell directories holding a checkpoint")
    parser.add_argument("--batches", type=int, default=4, help="batches of 256 inputs per length")
    parser.add_argument("--ceiling", action="store_true",
                        help="also print the scaled accuracy of a count read out right only below |d| = K")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for i, run in enumerate(args.runs):
        task, model, step = load_cycle_nav(run)
        if args.ceiling and i == 0:
            print(counting_ceiling(task), end="\n\n")
        print(f"{run} (step {step})\n\n{table(task, model, args.batches)}", end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
