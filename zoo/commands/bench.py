"""``xlstm-zoo bench``: ours vs the official xLSTM packages on this CPU, same run.

    xlstm-zoo bench --quick                  # a few minutes on 2 idle cores: median of 2, sweep T = 256, 1024, 4096
    xlstm-zoo bench                          # full: 5 repeats, sweep T = 256 ... 16384, generation to 10,000
    xlstm-zoo bench --only 'fwd/*' --only 'op/*' --repeats 9 --threads 1 --out runs/bench-fwd

Ratios are baseline / ours (> 1: ours faster). Results go to results.json and results.md in --out.
The full run takes roughly 15-30 minutes on 2 cores (the official stack reaches generation position
10,000 by stepping 10,000 tokens; its forward returns no state; the 7B layout runs at d=1024).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import torch
from rich.console import Console

from xlstm_zoo.bench.cases import SCALES, make_cases
from xlstm_zoo.bench.runner import header, legend, machine_info, render_table, run_cases, write_results
from xlstm_zoo.errors import ZooError
from xlstm_zoo.registry import Command

REPEATS = {"full": 5, "quick": 2, "smoke": 1}


def _arguments(c) -> None:
    c.add_argument("--quick", action="store_true",
                   help="fewer repeats and sweep points (T=256,1024,4096); official generation only to position 1,000")
    c.add_argument("--smoke", action="store_true", help="tiny shapes: checks that every case runs; the numbers mean nothing")
    c.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="run only cases whose name matches this shell-style wildcard, e.g. 'fwd/*' (repeatable)")
    c.add_argument("--repeats", type=int, metavar="N", help="timed calls per side (median reported; default 5, quick 2)")
    c.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls per side first (default 1)")
    c.add_argument("--threads", type=int, metavar="N",
                   help="torch intra-op threads for both sides (default: torch's choice; 1 is steadier on a shared machine)")
    c.add_argument("--out", help="directory for results.json and results.md (default runs/bench[-quick])")
    c.add_argument("--list", action="store_true", help="list the case names and exit")


def select(cases, patterns: list[str]):
    """Cases matching any pattern (all without patterns); a pattern matching nothing is an error."""
    if not patterns:
        return cases
    names = [c.name for c in cases]
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise ZooError(f"--only {pattern!r} matches no case; cases: {', '.join(names)}")
    return [c for c in cases if any(fnmatch.fnmatch(c.name, p) for p in patterns)]


def cmd_bench(args) -> int:
    if args.quick and args.smoke:
        raise ZooError("--quick and --smoke exclude each other")
    scale = SCALES["smoke" if args.smoke else "quick" if args.quick else "full"]
    repeats = args.repeats if args.repeats is not None else REPEATS[scale.name]
    if repeats < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        raise ZooError("--repeats and --threads must be >= 1, --warmup >= 0")
    cases = select(make_cases(scale), args.only)
    out = Console()
    if args.list:
        for case in cases:
            out.print(f"{case.name}  [dim]({case.group}; {case.shapes})[/]", highlight=False, soft_wrap=True)
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = machine_info(scale, repeats)
    err = Console(stderr=True)
    err.print(header(info), highlight=False)
    rows = run_cases(cases, repeats=repeats, warmup=args.warmup, console=err)
    out.print(render_table(rows, info))
    for line in legend(rows):
        out.print(line, highlight=False, soft_wrap=True)
    out_dir = Path(args.out) if args.out else Path("runs") / ("bench" if scale.name == "full" else f"bench-{scale.name}")
    files = write_results(rows, info, out_dir)
    err.print("wrote " + ", ".join(str(f) for f in files), highlight=False)
    failed = [r.case for r in rows if r.error]
    if failed:
        err.print(f"[red]{len(failed)} case(s) failed on our side:[/] {', '.join(failed)}")
    return 1 if failed else 0


COMMANDS = (
    Command("bench", "benchmark ours vs the official xlstm / mlstm_kernels packages (CPU, same run)", _arguments,
            cmd_bench),
)
