"""The experiments behind the state-tracking claim's settings, recorded from grid run directories.

Each experiment is a grid recipe in ``tests/fidelity/claim/`` (parity at the paper's lengths: train
3-40, test 41-256), run with the ordinary grid command, e.g.

    OMP_NUM_THREADS=1 xlstm-zoo grid tests/fidelity/claim/lstm_lr.yaml --out runs/claim/lstm_lr --jobs 2

or as one cell of the shipped grid changed by overrides, with ``tests/fidelity/claim_cell.py`` (into
``runs/claim/EXPERIMENT/cells/``, the same files). This script reads the run directories' per-cell
``metrics.jsonl`` (valid and test accuracy at every ``eval_every``) and ``result.json`` (steps run, CPU seconds), and writes into ``--out``:
``curves.json`` (every cell's curve), ``results.md`` (per experiment and setting: final test accuracy
per seed, the step each seed first reached 0.9 on test, steps run, CPU seconds) and ``curves.png``.

    python tests/fidelity/claim_runs.py runs/claim/* --out tests/fidelity/recorded/claim

Not part of the test run: the experiments train dozens of models.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def read_cell(cell_dir: Path) -> dict | None:
    """One cell's curve and outcome; a cell stopped before its end (interrupted) keeps its curve so far."""
    result_path, metrics_path, recipe_path = cell_dir / "result.json", cell_dir / "metrics.jsonl", cell_dir / "recipe.yaml"
    if not metrics_path.exists():
        return None  # never started
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    curve: dict[int, dict] = {}
    scaled = None  # the last test evaluation's scaled accuracy (0 = guessing, whatever the number of answers)
    for r in records:
        if r.get("split") in ("valid", "test"):
            curve.setdefault(r["step"], {"step": r["step"]})[r["split"]] = r["accuracy"]
            if r["split"] == "test":
                scaled = r.get("scaled_accuracy")
    points = [curve[s] for s in sorted(curve) if "test" in curve[s]]
    if not points:
        return None
    result = json.loads(result_path.read_text()) if result_path.exists() else {"status": "interrupted"}
    finished = result["status"] == "finished"
    # the cell id is <variant>__<axis>=<value>__seed=<n>-<digest>: labels for interrupted cells too
    variant, rest = re.match(r"(.*?)__([a-z][\w.]*=.*)-[0-9a-f]+$", cell_dir.name).groups()
    labels = dict(part.split("=", 1) for part in rest.split("__"))
    variant = re.sub(r"^xLSTM_(\d)_(\d)_$", r"xLSTM[\1:\2]", variant)  # the id's spelling of "xLSTM[0:1]"
    return {"experiment": cell_dir.parent.parent.name, "variant": variant, "seed": int(labels.pop("seed")),
            "setting": ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "curve": points, "finished": finished, "steps": result.get("steps", points[-1]["step"]),
            "stopped_early": bool(result.get("stopped_early")), "cpu_seconds": result.get("cpu_seconds"),
            "seconds": result.get("seconds"),
            "test": result["metrics"]["test"]["accuracy"] if finished else points[-1]["test"],
            "scaled": result["metrics"]["test"].get("scaled_accuracy") if finished else scaled}


def first_step_at(curve: list[dict], threshold: float = 0.9) -> int | None:
    return next((p["step"] for p in curve if p.get("test", 0) >= threshold), None)


def summary_table(cells: list[dict]) -> str:
    lines = ["| experiment | variant | setting | test accuracy per seed | mean | scaled | step test >= 0.9 | steps run | "
             "CPU s per cell |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keys = list(dict.fromkeys((c["experiment"], c["variant"], c["setting"]) for c in cells))
    for key in keys:
        group = sorted((c for c in cells if (c["experiment"], c["variant"], c["setting"]) == key),
                       key=lambda c: c["seed"])
        tests = [c["test"] for c in group]
        cpu = [c["cpu_seconds"] for c in group if c["cpu_seconds"] is not None]
        scaled = ", ".join("-" if c.get("scaled") is None else f"{c['scaled']:.3f}" for c in group)
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2] or '-'} | {', '.join(f'{t:.3f}' for t in tests)} "
            f"| {statistics.mean(tests):.3f} | {scaled} "
            f"| {', '.join(str(first_step_at(c['curve']) or '-') for c in group)} "
            f"| {', '.join(str(c['steps']) + ('*' if c['stopped_early'] else '' if c['finished'] else '+') for c in group)} "
            f"| {', '.join(f'{s:.0f}' for s in cpu) or '-'} |")
    notes = ("`*`: stopped early by the cell's `train.early_stop` rule (on the valid split); `+`: the experiment was "
             "stopped at this step (the accuracy is the last evaluation's).")
    return "\n".join(lines) + "\n\n" + notes + "\n"


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib  # optional: the plot extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = list(dict.fromkeys(c["experiment"] for c in cells))
    columns = min(4, len(experiments))  # wrap into rows: one panel per experiment
    rows = -(-len(experiments) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.5 * rows), squeeze=False)
    for ax in axes.flat[len(experiments):]:
        ax.set_visible(False)
    for ax, experiment in zip(axes.flat, experiments):
        keys = list(dict.fromkeys((c["variant"], c["setting"]) for c in cells if c["experiment"] == experiment))
        for i, key in enumerate(keys):
            group = [c for c in cells if c["experiment"] == experiment and (c["variant"], c["setting"]) == key]
            for j, cell in enumerate(group):
                ax.plot([p["step"] for p in cell["curve"]], [p.get("test", float("nan")) for p in cell["curve"]],
                        color=f"C{i}", alpha=0.8, label=" ".join(filter(None, key)) if j == 0 else None)
        ax.set(title=f"{experiment}: test accuracy (a line per seed)", xlabel="step", ylabel="accuracy",
               ylim=(0.0, 1.02))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="grid run directories (each holding cells/)")
    parser.add_argument("--out", default="tests/fidelity/recorded/claim")
    parser.add_argument("--previous", help="a curves.json recorded earlier: its cells first (their run directories gone)")
    args = parser.parse_args(argv)
    cells = json.loads(Path(args.previous).read_text()) if args.previous else []
    cells += [cell for run in args.runs for d in sorted(Path(run, "cells").iterdir())
              if (cell := read_cell(d)) is not None]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curves.json").write_text(json.dumps(cells, indent=1) + "\n")
    table = summary_table(cells)
    (out / "results.md").write_text(table)
    plot(cells, out / "curves.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
