"""Where a trained formal-language cell stops generalising: its accuracy at each input length.

    python tests/fidelity/accuracy_by_length.py CELL_DIR [CELL_DIR ...] [--lengths 20,40,48,64,128,256]

For each grid or claim cell directory, the model of its checkpoint reads 512 fresh inputs of each length
(the train lengths are 3-40, the test lengths 41-256) and the script prints one Markdown row: the whole-answer
accuracy per length (raw, not scaled: guessing is 1/A). A model that fits the train lengths and falls to
guessing just past them has learned something tied to the lengths it saw, not the task. Writes nothing;
not part of the test run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.training.trainer import build_task


def lengths_arg(text: str) -> list[int]:
    try:
        lengths = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths takes comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"--lengths must be positive, got {text!r}")
    return lengths


@torch.no_grad()
def accuracy_by_length(run_dir: str, lengths: list[int]) -> tuple[int | None, list[float]]:
    recipe, model, state = load_checkpoint(run_dir)
    task, model = build_task(recipe), model.eval()
    generator = torch.Generator().manual_seed(0)
    accuracies = []
    for length in lengths:
        batch = task.generate(length, 512, generator)
        logits, _ = model(batch.tokens)
        right, count = task.score(logits, batch)["sequence_accuracy"]
        accuracies.append(right / count)
    return state.get("step"), accuracies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", help="cell directories holding a checkpoint")
    parser.add_argument("--lengths", type=lengths_arg, default=[20, 40, 48, 64, 96, 128, 192, 256],
                        help="comma-separated input lengths (default: 20,40,48,64,96,128,192,256)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| cell | step | " + " | ".join(f"length {n}" for n in args.lengths) + " |")
    print("| --- | --- |" + " --- |" * len(args.lengths))
    for cell in args.cells:
        step, accuracies = accuracy_by_length(cell, args.lengths)
        print(f"| {Path(cell).name} | {step} | " + " | ".join(f"{a:.2f}" for a in accuracies) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
