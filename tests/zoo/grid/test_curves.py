"""curves.png: each report column's learning curves, one line per row, mean over seeds with their
spread, read from the cells' metrics.jsonl."""

import json
import struct

import pytest

from xlstm_zoo.grid.report import build_report, write_report


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def fake_grid(tmp_path, tasks=("parity", "cycle")):
    """Two variants x ``tasks`` x two seeds; loss falls by a seed-dependent amount, accuracy is logged
    at steps 5 and 10; the (big, cycle) cells have logged nothing yet."""
    cells = []
    for variant in ("small", "big"):
        for task in tasks:
            for seed in (0, 1):
                cell_id = f"{variant}-{task}-{seed}"
                cells.append({"id": cell_id, "labels": {"variant": variant, "task.type": task, "seed": seed},
                              "overrides": [], "digest": cell_id, "error": None})
                if (variant, task) == ("big", "cycle"):
                    continue
                records = [{"step": s, "split": "train", "loss": 2.0 - 0.1 * s * (1 + seed), "lr": 0.01}
                           for s in (2, 4, 6, 8, 10)]
                records.insert(2, {"step": 4, "event": "resumed"})
                records += [{"step": s, "split": "valid", "accuracy": s / 20 + 0.1 * seed} for s in (5, 10)]
                (tmp_path / "cells" / cell_id).mkdir(parents=True)
                (tmp_path / "cells" / cell_id / "metrics.jsonl").write_text(
                    "".join(json.dumps(r) + "\n" for r in records) + '{"step": 11, "spl')  # a torn last line
    manifest = {"name": "fake", "report": {"rows": "variant", "columns": "task.type", "metric": "accuracy",
                                           "split": "valid"}, "cells": cells}
    (tmp_path / "grid.json").write_text(json.dumps(manifest))


def test_curves_are_the_seed_mean_and_spread_per_row_and_column(tmp_path):
    pytest.importorskip("matplotlib")
    fake_grid(tmp_path)
    report = build_report(tmp_path)
    curves = {(c.row, c.column, c.metric): c for c in report.curves}
    assert sorted(curves) == sorted((row, task, metric) for row, task in
                                    [("small", "parity"), ("small", "cycle"), ("big", "parity")]
                                    for metric in ("train/loss", "valid/accuracy")), "no curve without data"
    loss = curves[("small", "parity", "train/loss")]
    assert loss.steps == [2, 4, 6, 8, 10] and loss.seeds == 2
    assert loss.mean == pytest.approx([2.0 - 0.15 * s for s in loss.steps])
    assert loss.low == pytest.approx([2.0 - 0.2 * s for s in loss.steps])
    assert loss.high == pytest.approx([2.0 - 0.1 * s for s in loss.steps])
    accuracy = curves[("big", "parity", "valid/accuracy")]
    assert accuracy.steps == [5, 10] and accuracy.mean == pytest.approx([0.3, 0.55])

    files = write_report(report, tmp_path)
    assert tmp_path / "curves.png" in files
    width, height = png_size(tmp_path / "curves.png")
    assert (width, height) == (720, 520), "two columns side by side, a loss and an accuracy panel each"


def test_many_columns_wrap_onto_more_lines(tmp_path):
    pytest.importorskip("matplotlib")
    fake_grid(tmp_path, tasks=("a", "b", "c", "d", "e"))
    write_report(build_report(tmp_path), tmp_path)
    assert png_size(tmp_path / "curves.png") == (1440, 1040), "four panels wide, a second line for the fifth"
