"""Reports of a grid run: a markdown table (mean +- std over seeds), a CSV and a PNG plot, with
the paper's numbers beside ours where the recipe maps the grid to a paper table; and the learning
curves behind them (``curves.png``), read from each cell's metrics.jsonl.

Only seeds are averaged: a label that varies across the cells (the variant, an axis, a zipped
path) within one row and column is added to the row's name (``small, train.lr=0.003``), so different settings
are never averaged as if they were seeds; one fixed by the row and column (zipped with the columns' axis) is not."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader import PaperConfig, ReportConfig
from xlstm_zoo.grid.runner import UnreadableResult, read_manifest, read_result
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import METRICS


@dataclass
class Group:
    values: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # cells whose result.json does not parse
    pending: int = 0
    paper: float | None = None
    paper_std: float | None = None

    @property
    def mean(self):
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def std(self):
        n = len(self.values)
        if n < 2:
            return 0.0 if n else None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (n - 1))


@dataclass
class Curve:
    """One line of curves.png: a metric against the step for one row and column of the report, the
    mean over its seeds with their spread (min and max) as a band."""

    row: str
    column: str
    metric: str          # "<split>/<metric>", as the loggers name it
    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    seeds: int           # cells that logged this metric


@dataclass
class Report:
    title: str
    metric: str
    split: str
    rows: list[str]
    columns: list[str]
    groups: dict[tuple[str, str], Group]
    has_paper: bool
    curves: list[Curve] = field(default_factory=list)
    column_label: str | None = None  # what the columns are (report.columns, e.g. task.type), for plot titles
    runs: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # (row, column) -> finished results

    def markdown(self) -> str:
        head = ["", *self.columns]
        lines = [f"### {self.title}: {self.metric} on {self.split} (mean ± std over seeds)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in self.rows:
            lines.append("| " + " | ".join([row] + [self._cell(self.groups.get((row, c))) for c in self.columns]) + " |")
        if self.has_paper:
            lines += ["", "(paper: the published number for the same row and column, from recipes/paper/tables)"]
        failed = [error for row in self.rows for c in self.columns if (g := self.groups.get((row, c)))
                  for error in g.failed]
        if failed:  # why each failed cell has no number, not only how many
            lines += ["", f"Failed cells ({len(failed)}):", ""] + [f"- {error}" for error in failed]
        return "\n".join(lines + self._run_facts()) + "\n"

    def _run_facts(self) -> list[str]:
        """Sizes and training speed per row and column (means over its finished cells), where the results
        have them (language-model tasks report tokens per second)."""
        keys = [(r, c) for r in self.rows for c in self.columns
                if any("tokens_per_second" in x for x in self.runs.get((r, c), []))]
        if not keys:
            return []
        lines = ["", "| row | non-embedding parameters | FLOPs/token | training tokens | tokens/s |", "|---|---|---|---|---|"]
        for row, column in keys:
            done = [x for x in self.runs[row, column] if "tokens_per_second" in x]
            mean = {k: sum(x.get(k, 0) for x in done) / len(done)
                    for k in ("non_embedding_parameters", "flops_per_token", "train_tokens", "tokens_per_second")}
            name = row if len(self.columns) == 1 else f"{row}, {self.column_label}={column}"
            lines.append(f"| {name} | {mean['non_embedding_parameters']:,.0f} | {mean['flops_per_token']:,.0f} | "
                         f"{mean['train_tokens']:,.0f} | {mean['tokens_per_second']:,.0f} |")
        return lines

    def _cell(self, g: Group | None) -> str:
        if g is None:
            return ""
        parts = []
        if g.values:
            if len(g.values) == 1:  # a spread of one value would read as a measured 0
                parts.append(f"{fmt(g.mean)} (one seed)")
            else:
                parts.append(f"{fmt(g.mean)} ± {fmt(g.std)} (seeds: {', '.join(fmt(v) for v in g.values)})")
        if g.failed:
            parts.append(f"failed {len(g.failed)}")
        if g.unreadable:
            parts.append(f"unreadable {len(g.unreadable)}")
        if g.pending:
            parts.append(f"pending {g.pending}")
        if g.paper is not None:
            parts.append(f"paper {fmt(g.paper)}")
        return "; ".join(parts)

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["row", "column", "metric", "split", "mean", "std", "n", "failed", "pending", "paper",
                         "paper_std", "errors", "values"])
        for (row, column), g in self.groups.items():
            writer.writerow([row, column, self.metric, self.split, g.mean, g.std, len(g.values), len(g.failed),
                             g.pending, g.paper, g.paper_std, " | ".join(g.failed + g.unreadable),
                             " ".join(f"{v:.6g}" for v in g.values)])
        return out.getvalue()


def fmt(value) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if abs(value) >= 0.001 or value == 0 else f"{value:.1e}"


def _label(labels: dict, key: str | None) -> str:
    if key is None:
        return "value"
    if key not in labels:
        raise ConfigError(f"report groups by {key!r}, but the grid's cells have labels {sorted(labels)}",
                          path="report")
    value = labels[key]
    return "(base)" if value is None else str(value)


def _varying(cells: list[dict], keep: tuple[str | None, ...]) -> list[str]:
    """Labels other than the seed and ``keep`` whose value differs between cells where ``keep``'s do not, in label
    order. A label that ``keep`` fixes (a path zipped with the columns' axis, e.g. a stop rule per task) names no
    other setting: every cell of one row and column has the same value."""
    def text(cell, key):
        return json.dumps(cell["labels"].get(key), sort_keys=True)

    names = dict.fromkeys(k for c in cells for k in c["labels"])
    varying = []
    for name in names:
        if name == "seed" or name in keep:
            continue
        values: dict[tuple, set[str]] = {}
        for cell in cells:
            values.setdefault(tuple(text(cell, k) for k in keep if k is not None), set()).add(text(cell, name))
        if any(len(v) > 1 for v in values.values()):
            varying.append(name)
    return varying


def _row(labels: dict, key: str, extra: list[str]) -> str:
    parts = [] if key == "variant" and labels.get("variant") is None and extra else [_label(labels, key)]
    return ", ".join(parts + [f"{k}={labels.get(k)}" for k in extra])


def build_report(run_dir: str | Path) -> Report:
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    cfg = ReportConfig.model_validate(manifest["report"])
    extra = _varying(manifest["cells"], (cfg.rows, cfg.columns))
    rows, columns, groups, logged, runs = [], [], {}, {}, {}
    for cell in manifest["cells"]:
        row, column = _row(cell["labels"], cfg.rows, extra), _label(cell["labels"], cfg.columns)
        rows += [row] if row not in rows else []
        columns += [column] if column not in columns else []
        group = groups.setdefault((row, column), Group())
        logged.setdefault((row, column), []).append(read_metrics(run_dir / "cells" / cell["id"] / METRICS))
        try:
            result = read_result(run_dir / "cells" / cell["id"])
        except UnreadableResult as err:
            group.unreadable.append(f"{err} (the grid runs the cell again)")
            continue
        if result is None or result.get("digest") != cell["digest"]:
            group.pending += 1
        elif result["status"] != "finished":
            group.failed.append(f"{cell['id']}: {result.get('error', 'unknown error')}")
        else:
            metrics = result["metrics"].get(cfg.split)
            if metrics is None or cfg.metric not in metrics:
                known = sorted(metrics) if metrics else sorted(result["metrics"])
                raise ConfigError(f"metric {cfg.metric!r} on split {cfg.split!r} is not in the results "
                                  f"(available: {', '.join(known)})", path="report")
            group.values.append(float(metrics[cfg.metric]))
            runs.setdefault((row, column), []).append(result)
    if cfg.paper is not None:
        _add_paper(cfg.paper, groups)
    curves = [curve for (row, column), runs in logged.items()
              for name in ("train/loss", f"{cfg.split}/{cfg.metric}")
              if (curve := _curve(row, column, name, runs)) is not None]
    return Report(manifest.get("name") or run_dir.name, cfg.metric, cfg.split, rows, columns, groups,
                  cfg.paper is not None, curves, cfg.columns, runs)


def _curve(row: str, column: str, name: str, runs: list[list[dict]]) -> Curve | None:
    """``name`` (``<split>/<metric>``) over the steps of each seed's metrics.jsonl, unfinished cells
    included; at each step the mean and spread of the seeds that have it."""
    split, metric = name.split("/", 1)
    per_seed = [{r["step"]: float(r[metric]) for r in records if r.get("split") == split and metric in r}
                for records in runs]
    per_seed = [series for series in per_seed if series]
    if not per_seed:
        return None
    steps = sorted({step for series in per_seed for step in series})
    values = [[series[step] for series in per_seed if step in series] for step in steps]
    return Curve(row, column, name, steps, [sum(v) / len(v) for v in values], [min(v) for v in values],
                 [max(v) for v in values], len(per_seed))


def paper_table(name: str) -> list[dict]:
    path = Path(str(resources.files("xlstm_zoo.recipes.paper.tables"))) / f"{name}.csv"
    if not path.exists():
        tables = sorted(p.stem for p in path.parent.glob("*.csv"))
        raise ConfigError(f"no paper table {name!r} (shipped: {', '.join(tables)})", path="report.paper.table")
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(lines))


def _add_paper(paper: PaperConfig, groups: dict[tuple[str, str], Group]) -> None:
    table = paper_table(paper.table)
    for (row, column), group in groups.items():
        filters = {}
        for csv_column, source in paper.match.items():
            mapped = paper.labels.get(row if source == "row" else column, row if source == "row" else column)
            filters.update(mapped if isinstance(mapped, dict) else {csv_column: mapped})
        hits = [r for r in table if all(str(r.get(k)) == str(v) for k, v in filters.items())]
        if len(hits) == 1:
            group.paper = _number(hits[0].get(paper.value))
            group.paper_std = _number(hits[0].get(paper.std)) if paper.std else None


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def write_report(report: Report, run_dir: str | Path) -> list[Path]:
    """report.md, report.csv, report.png and curves.png in the run directory (each written atomically;
    the plots where matplotlib is installed and, for curves.png, where a cell has logged metrics)."""
    run_dir = Path(run_dir)
    written = []
    for name, text in (("report.md", report.markdown()), ("report.csv", report.csv())):
        atomic_write(run_dir / name, lambda f, t=text: f.write(t.encode()))
        written.append(run_dir / name)
    for name, png in (("report.png", _plot(report)), ("curves.png", _plot_curves(report))):
        if png is not None:
            atomic_write(run_dir / name, lambda f, data=png: f.write(data))
            written.append(run_dir / name)
    return written


def _plot(report: Report) -> bytes | None:
    try:  # optional dependency (the plot extra)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(report.columns) * max(1, len(report.rows)) / 2), 4))
    width = 0.8 / max(1, len(report.rows))
    for i, row in enumerate(report.rows):
        xs, means, stds, paper_x, paper_y = [], [], [], [], []
        for j, column in enumerate(report.columns):
            g = report.groups.get((row, column))
            x = j + (i - (len(report.rows) - 1) / 2) * width
            if g and g.mean is not None:
                xs.append(x), means.append(g.mean), stds.append(g.std or 0.0)
            if g and g.paper is not None:
                paper_x.append(x), paper_y.append(g.paper)
        bars = ax.bar(xs, means, width, yerr=stds, capsize=2, label=row)
        if paper_x:
            ax.scatter(paper_x, paper_y, marker="x", color=bars.patches[0].get_facecolor() if bars.patches else "k",
                       zorder=3)
    ax.set_xticks(range(len(report.columns)), report.columns, rotation=30, ha="right")
    ax.set_ylabel(f"{report.metric} ({report.split})")
    ax.set_title(report.title + ("   (x: paper)" if report.has_paper else ""))
    ax.legend(fontsize="small")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


PANELS_PER_LINE = 4  # report columns side by side in curves.png; more wrap onto further lines


def _plot_curves(report: Report) -> bytes | None:
    """curves.png: for each report column a panel of the training loss and one of the report's metric
    against the step, one line per row (mean over seeds, band: their min to max)."""
    if not report.curves:
        return None
    try:  # optional dependency (the plot extra)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = list(dict.fromkeys(c.metric for c in report.curves))
    wide = min(len(report.columns), PANELS_PER_LINE)
    lines = -(-len(report.columns) // wide)
    fig, axes = plt.subplots(lines * len(metrics), wide, figsize=(3.6 * wide, 2.6 * lines * len(metrics)),
                             squeeze=False, sharex="col")
    colours = {row: f"C{i % 10}" for i, row in enumerate(report.rows)}
    for j, column in enumerate(report.columns):
        for i, metric in enumerate(metrics):
            ax = axes[(j // wide) * len(metrics) + i][j % wide]
            for curve in (c for c in report.curves if c.column == column and c.metric == metric):
                ax.plot(curve.steps, curve.mean, color=colours[curve.row],
                        marker="o" if len(curve.steps) < 12 else None, markersize=3)
                if curve.seeds > 1:
                    ax.fill_between(curve.steps, curve.low, curve.high, color=colours[curve.row], alpha=0.2, lw=0)
            title = f"{report.column_label} = {column}" if report.column_label else column
            ax.set_title(title if i == 0 else "", fontsize="medium")
            ax.set_ylabel(metric, fontsize="small")
            ax.tick_params(labelsize="small")
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize="small")
    for k in range(len(report.columns), lines * wide):  # empty slots of the last line
        for i in range(len(metrics)):
            axes[(k // wide) * len(metrics) + i][k % wide].set_visible(False)
    if len(report.rows) > 1:  # one entry per row, whichever panels it has lines in
        fig.legend([plt.Line2D([], [], color=colours[row]) for row in report.rows], report.rows,
                   loc="upper right", fontsize="small")
    fig.suptitle(f"{report.title}: learning curves (mean over seeds; band: min to max)", fontsize="medium")
    fig.tight_layout(rect=(0, 0, 0.85 if len(report.rows) > 1 else 1, 0.95))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()
