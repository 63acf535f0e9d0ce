"""Training speed of formal-language grid cells: steps per second of the trainer's own loop.

    python tools/quick_cell_speed.py                          # every variant on parity, 2 threads
    python tools/quick_cell_speed.py --variant 'xLSTM[0:1]' --task parity --steps 200 --repeats 3
    python tools/quick_cell_speed.py --recipe state_tracking --profile full --variant 'xLSTM[0:1]' --task cycle_nav

Each cell is a recipe's profile (default: `formal_languages`, `quick`) as `xlstm-zoo grid` expands it; it is
trained by `xlstm_zoo.training.trainer.train` (no run directory, so no checkpoints) for `--steps`
steps, `--repeats` times, and the median wall time per training step is reported: (time of a
`--steps` run - time of a 1-step run) / (steps - 1), which leaves out building the model and the
trainer's final evaluation. To compare two checkouts, run
the same command with each on PYTHONPATH (the commands are in docs/performance.md): this script only
uses what the trainer and grid have had since the first release.
"""

import argparse
import statistics
import time

import torch

from xlstm_zoo.grid.expand import expand
from xlstm_zoo.recipe_loader.load import load_recipe
from xlstm_zoo.training.trainer import train


def cell_recipe(variant: str, task: str, steps: int, recipe_name: str = "formal_languages", profile: str = "quick"):
    # No evaluation, so no early stop (it judges evaluations): the loop's steps only.
    overrides = [f"train.steps={steps}", f"train.warmup_steps={min(steps, 40)}", "train.eval_every=0", "train.early_stop=null"]
    recipe = load_recipe(recipe_name, overrides, profile=profile)
    for cell in expand(recipe):
        if cell.labels["variant"] == variant and cell.labels["task.type"] == task:
            return cell.recipe
    raise SystemExit(f"no {profile} cell of {recipe_name} with variant {variant!r} and task {task!r}")


def seconds(recipe) -> float:
    start = time.perf_counter()
    train(recipe)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", help="grid variant (repeatable; default: all four)")
    parser.add_argument("--task", default="parity")
    parser.add_argument("--steps", type=int, default=200, help="at least 2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe", default="formal_languages", help="a shipped recipe name or a recipe file")
    parser.add_argument("--profile", default="quick")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = args.variant or ["LSTM", "xLSTM[0:1]", "xLSTM[1:0]", "xLSTM[1:1]"]
    for variant in variants:
        full, one = (cell_recipe(variant, args.task, n, args.recipe, args.profile) for n in (args.steps, 1))
        seconds(full)  # warm-up: builds, caches, the C++ loops' first compile
        per_step = [(seconds(full) - seconds(one)) / (args.steps - 1) for _ in range(args.repeats)]
        median = statistics.median(per_step)
        print(f"{variant:12s} {args.task}: {1 / median:7.1f} steps/s  ({median * 1e3:.2f} ms/step; runs "
              f"{', '.join(f'{r * 1e3:.2f}' for r in per_step)} ms/step)", flush=True)


if __name__ == "__main__":
    main()
