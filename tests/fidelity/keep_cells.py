"""Keep a grid's finished cells in the repository, so a grid that runs for days on lent machines loses nothing.

    python tests/fidelity/keep_cells.py RUN_DIR OUT     # e.g. OUT = tests/fidelity/recorded/state_tracking_tuned

copies the grid's manifest ``grid.json`` (so ``xlstm-zoo report OUT`` reads OUT as a run directory) and each
finished cell's ``result.json`` and ``recipe.yaml``, and of its ``metrics.jsonl`` the evaluations and
the last training line (what the report and ``claim_runs.py`` read), into ``OUT/cells/<cell id>/``; checkpoints
stay behind. To go on with the grid elsewhere, copy them into a run directory and launch the grid there: it skips
every cell whose ``result.json`` has the cell's digest and trains the rest, e.g.

    mkdir -p RUN_DIR && cp -r OUT/cells RUN_DIR/
    xlstm-zoo grid state_tracking --profile tuned --out RUN_DIR --only ...

Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def kept_metrics(path: Path) -> str:
    records = [(json.loads(line), line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r[0].get("split") == "train"]
    kept = [r for r in records if r[0].get("split") != "train"] + train[-1:]
    return "".join(line + "\n" for _, line in sorted(kept, key=lambda r: r[0]["step"]))


def keep(run_dir: Path, out: Path) -> list[str]:
    kept = []
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "grid.json", out / "grid.json")
    for result in sorted(run_dir.glob("cells/*/result.json")):
        if json.loads(result.read_text()).get("status") != "finished":
            continue
        cell, target = result.parent, out / "cells" / result.parent.name
        target.mkdir(parents=True, exist_ok=True)
        for name in ("result.json", "recipe.yaml"):
            shutil.copyfile(cell / name, target / name)
        (target / "metrics.jsonl").write_text(kept_metrics(cell / "metrics.jsonl"))
        kept.append(cell.name)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    kept = keep(args.run_dir, args.out)
    print(f"kept {len(kept)} finished cells in {args.out / 'cells'}")


if __name__ == "__main__":
    main()
