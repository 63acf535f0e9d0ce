"""CLI commands for the main job: ``train``, ``grid`` and ``report``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

RECIPE_HELP = "a recipe file or a shipped recipe name (see `xlstm-zoo recipes`)"
SET_HELP = "override a field, e.g. --set train.steps=100 (repeatable; applied after --profile)"


def add_commands(sub) -> None:
    c = sub.add_parser("train", help="train a recipe's model on its task (resumes from --out if interrupted)")
    c.add_argument("recipe", help=RECIPE_HELP)
    c.add_argument("--profile", help="a named profile of the recipe, e.g. quick")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE", help=SET_HELP)
    c.add_argument("--out", help="run directory for metrics.jsonl and checkpoint.pt (default: none)")
    c.set_defaults(run=cmd_train)

    c = sub.add_parser("grid", help="run (or --dry-run list) the ablation grid a recipe declares")
    c.add_argument("recipe", help=RECIPE_HELP)
    c.add_argument("--profile", help="a named profile of the recipe, e.g. quick or full")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE", help=SET_HELP)
    c.add_argument("--out", help="run directory (default: runs/<recipe name>[-<profile>])")
    c.add_argument("--dry-run", action="store_true", help="list the cells and their state, run nothing")
    c.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    c.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="train N cells at once in worker processes (default 1; small models: one per core)")
    c.set_defaults(run=cmd_grid)

    c = sub.add_parser("report", help="tabulate a grid run: markdown table, report.csv and report.png")
    c.add_argument("run_dir", help="the grid's run directory")
    c.set_defaults(run=cmd_report)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _load(args):
    from xlstm_zoo.recipe import load_recipe

    return load_recipe(args.recipe, args.overrides, profile=args.profile)


def cmd_train(args) -> int:
    from rich.progress import Progress

    from xlstm_zoo.grid.runner import progress_columns
    from xlstm_zoo.training.trainer import train

    recipe = _load(args)
    with Progress(*progress_columns(), console=Console(stderr=True)) as progress:
        result = train(recipe, args.out, progress=progress, description=recipe.name or "training")
    print(json.dumps(result, indent=2))
    return 0


def default_out(recipe, profile: str | None) -> Path:
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in (recipe.name or "grid"))
    return Path("runs") / (f"{name}-{profile}" if profile else name)


def cmd_grid(args) -> int:
    from xlstm_zoo.grid.expand import expand
    from xlstm_zoo.grid.report import build_report, write_report
    from xlstm_zoo.grid.runner import read_result, run_grid

    recipe = _load(args)
    out = Path(args.out) if args.out else default_out(recipe, args.profile)
    if args.dry_run:
        cells = expand(recipe)
        from rich.table import Table

        table = Table("cell", "overrides", "state", title=f"{len(cells)} cells -> {out}")
        for cell in cells:
            result = read_result(out / "cells" / cell.id)
            state = ("invalid: " + cell.error) if cell.error else (
                result["status"] if result and result.get("digest") == cell.digest else "to run")
            table.add_row(cell.id, ", ".join(f"{p}={v}" for p, v in cell.overrides), state)
        Console().print(table)
        return 0
    counts = run_grid(recipe, out, retry_failed=args.retry_failed, jobs=args.jobs,
                      plugin_modules=tuple(getattr(args, "plugins", ())))
    report = build_report(out)
    files = write_report(report, out)
    sys.stdout.write(report.markdown())
    Console(stderr=True).print(f"{counts['ran']} cells ran, {counts['skipped']} already done, "
                               f"{counts['failed']} failed; wrote {_written(files)}")
    return 1 if counts["failed"] else 0


def cmd_report(args) -> int:
    from xlstm_zoo.grid.report import build_report, write_report

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
