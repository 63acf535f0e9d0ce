"""The main job's commands: ``train``, ``grid`` and ``report``."""

from __future__ import annotations

import argparse
import contextlib
import json
import functools
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from xlstm_zoo.checkpoint import find_checkpoint, json_text, make_run_dir, saved_step
from xlstm_zoo.commands.output import show, table
from xlstm_zoo.commands.recipes import RECIPE_HELP
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.claims import CellBusy, acquire, describe, read_claim
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.report import build_report, write_report
from xlstm_zoo.grid.select import parse_only, select
from xlstm_zoo.grid.ray_executor import RayExecutor, import_ray
from xlstm_zoo.grid.runner import (LocalExecutor, UnreadableResult, cell_states, read_result, run_grid)
from xlstm_zoo.loggers.base import build_loggers
from xlstm_zoo.plugins import configure
from xlstm_zoo.progress import progress_columns
from xlstm_zoo.recipe_loader import load_recipe
from xlstm_zoo.registry import Command
from xlstm_zoo.training.distributed import DistContext, check_split, run_torchrun
from xlstm_zoo.training.trainer import CHECKPOINT, train

SET_HELP = "override a field, e.g. --set train.steps=100 (repeatable; applied after --profile)"
REPORT_TO_HELP = ("also send the metrics to these loggers, comma-separated: tensorboard, mlflow, wandb or a plugin's "
                  "(`xlstm-zoo list logger`); 'none': metrics.jsonl only; default: the recipe's train.report_to")


def _recipe_arguments(parser, profile_help: str, optional: bool = False) -> None:
    parser.add_argument("recipe", help=RECIPE_HELP, **({"nargs": "?"} if optional else {}))
    parser.add_argument("--profile", help=profile_help)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE", help=SET_HELP)
    parser.add_argument("--report-to", metavar="NAMES", help=REPORT_TO_HELP)


def _train_arguments(parser) -> None:
    _recipe_arguments(parser, "a named profile of the recipe, e.g. quick")
    parser.add_argument("--out", help="run directory for metrics.jsonl and checkpoint/ (default: none)")
    parser.add_argument("--nproc", type=_positive_int, default=1, metavar="N",
                        help="train data-parallel in N processes on this machine (torchrun --standalone; gloo on "
                             "CPU, NCCL on CUDA); train.batch_size stays the global batch")


def _grid_arguments(parser) -> None:
    _recipe_arguments(parser, "a named profile of the recipe, e.g. quick or full", optional=True)
    parser.add_argument("--out", help="run directory (default: runs/<recipe name>[-<profile>])")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and their state, run nothing")
    parser.add_argument("--status", metavar="RUN_DIR",
                        help="show each cell of a run directory: finished / failed / running (attempt, host, step) "
                             "/ to run; needs no recipe")
    parser.add_argument("--no-wait", action="store_true",
                        help="leave cells that another launch on the same --out is training to it, instead of "
                             "waiting for them")
    parser.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    parser.add_argument("--only", action="append", default=[], metavar="LABEL=VALUES",
                        help="run (or --dry-run list) only the cells with these labels, e.g. --only variant=LSTM "
                             "--only task.type=cycle_nav,parity --only seed=0 (repeatable; every one must match): "
                             "a long grid in parts, each launch on the same --out")
    parser.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                        help="train N cells at once in worker processes (default 1; small models: one per core)")
    parser.add_argument("--executor", choices=("local", "ray"),
                        help="where cells run: local (this process, or --jobs workers) or ray (one Ray task per "
                             "cell, resources from launch.*); default: the recipe's launch.executor")
    parser.add_argument("--address", metavar="ADDR",
                        help="ray: the cluster to use ('auto': this machine's; 'ray://host:10001'); default: the "
                             "recipe's launch.address, else a private Ray on this machine")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _report_arguments(parser) -> None:
    parser.add_argument("run_dir", help="the grid's run directory")


def _load(args):
    overrides = list(args.overrides)
    if args.report_to is not None:
        names = [] if args.report_to.strip() == "none" else [n.strip() for n in args.report_to.split(",") if n.strip()]
        overrides.append(f"train.report_to={json.dumps(names)}")
    return load_recipe(args.recipe, overrides, profile=args.profile)


def cmd_train(args) -> int:
    recipe = _load(args)
    with _own_run_dir(args.out):
        return _train(args, recipe)


@contextlib.contextmanager
def _own_run_dir(out: str | None):
    """Hold ``out``'s claim while training there, as a grid holds a cell's: a second ``train`` (or a grid whose
    cell this is) on the same directory is refused instead of deleting the first's files. Ranks under torchrun
    take none: the process that started them (``--nproc``, a grid cell) holds it."""
    if not out or "RANK" in os.environ:
        yield
        return
    try:
        claim = acquire(make_run_dir(out), executor="train")
    except CellBusy as busy:
        raise ConfigError(f"{out} is in use by another run ({busy}): one run directory holds one run at a time; "
                          "wait for it to finish, or give another --out") from None
    with claim:
        yield


def _train(args, recipe) -> int:
    if args.nproc > 1:
        if "RANK" in os.environ:
            raise ConfigError("--nproc starts its own processes: drop it when running under torchrun")
        check_split(recipe.train.batch_size, args.nproc, recipe.train.micro_batches, recipe._source)
        return _launch_torchrun(args.nproc, args.argv)
    rank0 = DistContext.from_env().is_main
    if rank0 and args.out:
        _say_if_finished(Path(args.out), recipe)
    with Progress(*progress_columns(), console=Console(stderr=True), disable=not rank0) as progress:
        result = train(recipe, args.out, progress=progress, description=recipe.name or "training")
    if rank0:
        print(json_text(result))
    return 0


def _say_if_finished(out: Path, recipe) -> None:
    """One line on stderr when ``train`` is re-run on a finished run (it prints the result again)."""
    found = find_checkpoint(out / CHECKPOINT) if out.is_dir() else None
    if found is not None and saved_step(found) == recipe.train.steps:
        Console(stderr=True).print(
            f"{out} already finished its {recipe.train.steps} steps: nothing is trained, its result is printed "
            "again; to train longer, start a new run (another --out) with a larger train.steps", highlight=False,
            soft_wrap=True)


def _launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Run this same command line in ``nproc`` processes under torchrun (``python -m xlstm_zoo``)."""
    argv = list(argv)
    for i, arg in enumerate(argv):  # drop --nproc N / --nproc=N
        if arg == "--nproc":
            del argv[i:i + 2]
            break
        if arg.startswith("--nproc="):
            del argv[i]
            break
    return run_torchrun(nproc, argv, threads=int(os.environ["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in os.environ
                        else None).returncode


def default_out(recipe, profile: str | None) -> Path:
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in (recipe.name or "grid"))
    return Path("runs") / (f"{name}-{profile}" if profile else name)


def cmd_grid(args) -> int:
    if args.status:
        if args.recipe:
            raise ConfigError(f"grid --status reads a run directory, not a recipe: drop {args.recipe!r} "
                              f"(use `xlstm-zoo grid --status {args.status}`)")
        return _show_status(Path(args.status))
    if not args.recipe:
        raise ConfigError("grid needs a RECIPE (a name from `xlstm-zoo recipes` or a .yaml file), "
                          "or --status RUN_DIR")
    recipe = _load(args)
    out = Path(args.out) if args.out else default_out(recipe, args.profile)
    only = parse_only(args.only)
    if args.dry_run:
        cells = select(expand(recipe), only)

        rows = table("cell", "overrides", "state", title=f"{len(cells)} cells -> {out}")
        for cell in cells:
            try:
                result = read_result(out / "cells" / cell.id)
            except UnreadableResult as err:
                result = {"status": f"to run ({err})", "digest": cell.digest}
            state = ("invalid: " + cell.error) if cell.error else (
                result["status"] if result and result.get("digest") == cell.digest else "to run")
            claim = read_claim(out / "cells" / cell.id)
            if claim and not claim["stale"]:
                state = f"running ({describe(claim)})"
            rows.add_row(cell.id, ", ".join(f"{p}={v}" for p, v in cell.overrides), state)
        show(rows)
        return 0
    build_loggers(recipe.train.report_to)  # a logger's missing package: one line now, not a failure in every cell
    plugins = list(getattr(args, "plugins", []))  # --plugin modules: workers load them too
    setup = functools.partial(configure, strict=None, modules=plugins) if plugins else None
    counts = run_grid(recipe, out, retry_failed=args.retry_failed, jobs=args.jobs, worker_setup=setup,
                      wait=not args.no_wait, executor=_executor(args, recipe), only=only)
    report = build_report(out)
    files = write_report(report, out)
    sys.stdout.write(report.markdown())
    Console(stderr=True).print(f"{counts['ran']} cells ran, {counts['skipped']} already done, "
                               f"{counts['failed']} failed"
                               + (f", {counts['busy']} left to another launch" if counts["busy"] else "")
                               + f"; wrote {_written(files)}")
    return 1 if counts["failed"] else 0


def _executor(args, recipe):
    kind = args.executor or recipe.launch.executor
    if kind == "local":
        if args.address:
            raise ConfigError("--address is for --executor ray (the local executor runs on this machine)")
        return LocalExecutor(args.jobs)
    if args.jobs > 1:
        raise ConfigError("--jobs is for the local executor; with ray, each cell takes launch.cpus cores "
                          "(e.g. --set launch.cpus=2) and Ray runs as many at once as fit")
    import_ray()  # a missing Ray is one clear line before anything starts
    return RayExecutor(args.address or recipe.launch.address)


def _show_status(run_dir: Path) -> int:
    if not run_dir.is_dir():
        raise ConfigError(f"--status {run_dir}: no such directory (give a grid's run directory, e.g. runs/<name>)")
    states = cell_states(run_dir)
    tally = {}
    for row in states:
        tally[row["state"]] = tally.get(row["state"], 0) + 1
    title = f"{len(states)} cells in {run_dir}: " + ", ".join(f"{n} {state}" for state, n in tally.items())
    rows = table("cell", "state", "detail", title=title)
    for row in states:
        rows.add_row(row["id"], row["state"], row["detail"])
    show(rows)
    return 0


def cmd_report(args) -> int:
    report = build_report(args.run_dir)
    files = write_report(report, args.run_dir)
    sys.stdout.write(report.markdown())
    Console(stderr=True).print(f"wrote {_written(files)}")
    return 0


def _written(files) -> str:
    names = ", ".join(str(f) for f in files)
    if not any(f.suffix == ".png" for f in files):
        names += " (no report.png: matplotlib is not installed; pip install 'xlstm-zoo[plot]')"
    return names


COMMANDS = (
    Command("train", "train a recipe's model on its task (resumes from --out if interrupted)", _train_arguments,
            cmd_train),
    Command("grid", "run (or --dry-run list) the ablation grid a recipe declares", _grid_arguments, cmd_grid),
    Command("report", "tabulate a grid run: markdown table, report.csv, report.png and curves.png", _report_arguments, cmd_report),
)
