"""Timing, peak memory and the result table of the benchmark suite.

For every case both sides are built, called once or more to warm up, then timed ``repeats`` times
with ``time.perf_counter``, ours and the baseline interleaved (and alternating which goes first), so
a change of load on a shared machine hits both; the reported time is the median. ``ratio`` is
``baseline / ours``: above 1 ours is faster.

Peak memory (cases with ``memory=True``) is the Linux resident-set high-water mark of one extra
call: write ``5`` to ``/proc/self/clear_refs`` (resets ``VmHWM``), read ``VmRSS`` before and
``VmHWM`` after from ``/proc/self/status``; peak = VmHWM - VmRSS before. Elsewhere it is ``None``
("n/a" in the table).

The roofline column (cases with ``roofline`` set): each side's FLOPs are counted once with
``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, attention: what it counts), and a
plain fp32 square GEMM of ``roofline`` rows is timed as a third side, interleaved with the other two,
so its GFLOP/s is this machine's matmul throughput under the same load. roofline = (counted FLOPs /
median time) / GEMM GFLOP/s: 1.0 means the side runs as fast as one large matmul. Our side is counted on
the reference backend (``XLSTM_ZOO_BACKEND=reference`` for that one call): the counter sees torch ops
only, so the products inside our compiled kernels (the mLSTM chunk core's) would go uncounted. The
reference computes the same products as torch matmuls.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from rich.console import Console
from rich.progress import Progress
from rich.table import Column, Table

from xlstm_zoo import allocator
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.bench.case import BaselineUnavailable, Case, Prepared, Scale
from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.progress import progress_columns

PROC_STATUS = "/proc/self/status"
PROC_CLEAR_REFS = "/proc/self/clear_refs"


# --- peak memory --------------------------------------------------------------------------------------


def _status_bytes(field: str, path: str = PROC_STATUS) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so the next peak starts from a true floor."""
    gc.collect()
    libc = allocator.glibc()
    if libc is not None:
        libc.malloc_trim(0)


def reset_peak(path: str = PROC_CLEAR_REFS) -> bool:
    """Reset the resident-set high-water mark (VmHWM); False where the kernel does not allow it."""
    try:
        with open(path, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_peak(fn, *, status: str = PROC_STATUS, clear_refs: str = PROC_CLEAR_REFS) -> int | None:
    """Bytes the resident set grew to above its level before ``fn()`` ran, or None where not measurable."""
    _release_free_memory()
    before = _status_bytes("VmRSS", status)
    if before is None or not reset_peak(clear_refs):
        fn()
        return None
    fn()
    hwm = _status_bytes("VmHWM", status)
    return None if hwm is None else max(0, hwm - before)


# --- timing -------------------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    group: str
    shapes: str
    baseline_name: str
    ours_s: float | None = None
    baseline_s: float | None = None
    ratio: float | None = None          # baseline / ours: > 1 means ours is faster
    params_ours: int | None = None
    params_baseline: int | None = None
    peak_ours: int | None = None        # bytes
    peak_baseline: int | None = None
    rel_ours: float | None = None       # time / time of the group's reference case (e.g. T=1024, position 10)
    rel_baseline: float | None = None
    ours_times: list | None = None
    baseline_times: list | None = None
    ours_desc: str = ""                 # what each side runs (shown once per group, under the table)
    baseline_desc: str = ""
    note: str = ""                      # baseline skipped / not installed / failed
    memory: bool = False                # peak memory was asked for
    info: dict | None = None            # the case's details (recipe, overrides, T, position)
    error: str | None = None            # ours failed (the baseline failing is a note)
    flops_ours: int | None = None       # counted FLOPs of one call (roofline cases)
    flops_baseline: int | None = None
    gemm_gflops: float | None = None    # the plain fp32 GEMM timed beside the case
    roofline_ours: float | None = None  # (flops / time) / GEMM GFLOP/s
    roofline_baseline: float | None = None


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def count_flops(fn, *, reference_backend: bool = False) -> int:
    """FLOPs of one call of ``fn`` as torch's flop counter counts them; ``reference_backend``: with every
    op on the pure-PyTorch reference (the counter cannot see into compiled kernels)."""
    forced = os.environ.get(ENV_FORCE)
    if reference_backend:
        os.environ[ENV_FORCE] = "reference"
    try:
        with FlopCounterMode(display=False) as counter:
            fn()
    finally:
        if reference_backend and forced is None:
            del os.environ[ENV_FORCE]
        elif reference_backend:
            os.environ[ENV_FORCE] = forced
    return counter.get_total_flops()


def gemm(size: int) -> Prepared:
    """A plain fp32 ``size x size`` GEMM: the machine's matmul throughput, timed beside a case."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    out = torch.empty(size, size)
    return Prepared(lambda: torch.mm(a, b, out=out), note=f"fp32 GEMM {size}x{size}x{size}")


def _roofline(flops: int | None, seconds: float | None, gemm_gflops: float | None) -> float | None:
    if not flops or not seconds or not gemm_gflops:
        return None
    return flops / seconds / 1e9 / gemm_gflops


def run_case(case: Case, *, repeats: int, warmup: int = 1) -> Row:
    """Build both sides, warm up, measure memory if asked, then time them interleaved."""
    row = Row(case.name, case.group, case.shapes, case.baseline_name, memory=case.memory, info=case.info or None)
    try:
        ours = case.ours()
    except Exception as err:  # ours failing is recorded, the suite goes on (and the CLI exits 1)
        row.error = f"{type(err).__name__}: {err}"
        ours = None
    try:
        base = case.baseline()
    except BaselineUnavailable as err:
        base, row.note = None, str(err)
    except Exception as err:
        base, row.note = None, f"baseline failed: {type(err).__name__}: {err}"
    try:  # a side that fails when called is dropped here, before anything is timed
        for _ in range(warmup):
            ours and ours.fn()
    except Exception as err:
        ours, row.error = None, f"{type(err).__name__}: {err}"
    try:
        for _ in range(warmup):
            base and base.fn()
    except Exception as err:
        base, row.note = None, f"baseline failed: {type(err).__name__}: {err}"
    sides = [s for s in (ours, base) if s is not None]
    ref_gemm = None
    if case.roofline and sides:
        row.flops_ours = count_flops(ours.fn, reference_backend=True) if ours else None
        row.flops_baseline = count_flops(base.fn) if base else None
        ref_gemm = gemm(case.roofline)
        ref_gemm.fn()
        sides.append(ref_gemm)
    if case.memory:
        row.peak_ours = measure_peak(ours.fn) if ours else None
        row.peak_baseline = measure_peak(base.fn) if base else None
    times = {id(s): [] for s in sides}
    for r in range(repeats * case.sample_factor):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            times[id(side)].append(_timed(side.fn))
    if ours is not None:
        row.ours_times = times[id(ours)]
        row.ours_s = statistics.median(row.ours_times) if row.ours_times else None
        row.params_ours, row.ours_desc = ours.params, ours.note
    if base is not None:
        row.baseline_times = times[id(base)]
        row.baseline_s = statistics.median(row.baseline_times) if row.baseline_times else None
        row.params_baseline, row.baseline_desc = base.params, base.note
    if ref_gemm is not None:
        row.gemm_gflops = 2 * case.roofline ** 3 / statistics.median(times[id(ref_gemm)]) / 1e9
        row.roofline_ours = _roofline(row.flops_ours, row.ours_s, row.gemm_gflops)
        row.roofline_baseline = _roofline(row.flops_baseline, row.baseline_s, row.gemm_gflops)
    if case.memory and row.peak_ours is None and row.peak_baseline is None:
        row.note = "; ".join(n for n in (row.note, "peak memory n/a (no writable /proc/self/clear_refs)") if n)
    if row.ours_s and row.baseline_s:
        row.ratio = row.baseline_s / row.ours_s
    del ours, base, sides, ref_gemm
    _release_free_memory()
    return row


def add_relative(rows: list[Row], cases: list[Case]) -> None:
    """Fill ``rel_*``: each time divided by the time of its case's reference case (same side)."""
    by_name = {r.case: r for r in rows}
    for case in cases:
        row, ref = by_name.get(case.name), by_name.get(case.ref) if case.ref else None
        if row is None or ref is None:
            continue
        if row.ours_s and ref.ours_s:
            row.rel_ours = row.ours_s / ref.ours_s
        if row.baseline_s and ref.baseline_s:
            row.rel_baseline = row.baseline_s / ref.baseline_s


def run_cases(cases: list[Case], *, repeats: int, warmup: int = 1, console: Console | None = None,
              progress: bool = True) -> list[Row]:
    rows = []
    with Progress(*progress_columns(), console=console or Console(stderr=True), transient=False,
                  disable=not progress) as bar:
        task = bar.add_task("bench", total=len(cases), info="")
        for case in cases:
            bar.update(task, info=case.name)
            rows.append(run_case(case, repeats=repeats, warmup=warmup))
            bar.advance(task)
    add_relative(rows, cases)
    return rows


# --- the report ---------------------------------------------------------------------------------------


def machine_info(scale: Scale | None = None, repeats: int | None = None) -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    info = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "cpus_usable": affinity,
            "load_avg": load, "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "malloc": allocator.state()}
    if scale is not None:
        info["scale"] = asdict(scale)
    if repeats is not None:
        info["repeats"] = repeats
    return info


def header(info: dict) -> str:
    return (f"torch.get_num_threads()={info['torch_threads']}, CPUs={info['cpu_count']} "
            f"(usable {info['cpus_usable']}), load average {info['load_avg']}, torch {info['torch']}, "
            f"{info['machine']}, malloc: {info.get('malloc', '?')}" + (f", scale {info['scale']['name']}" if "scale" in info else "")
            + (f", median of {info['repeats']}" if "repeats" in info else ""))


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f}"


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def _params(row: Row) -> str:
    if row.params_ours is None and row.params_baseline is None:
        return "-"
    f = lambda n: "-" if n is None else f"{n:,}"  # noqa: E731
    return f"{f(row.params_ours)} / {f(row.params_baseline)}"


def _rel(row: Row) -> str:
    if row.rel_ours is None and row.rel_baseline is None:
        return ""
    f = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    return f"{f(row.rel_ours)} / {f(row.rel_baseline)}"


COLUMNS = ["case", "ours (ms)", "baseline (ms)", "ratio base/ours", "params ours / base",
           "peak MiB ours / base", "time vs ref ours / base", "roofline ours / base (GEMM GFLOP/s)", "note"]


def _roof(row: Row) -> str:
    if row.gemm_gflops is None:
        return ""
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    return f"{f(row.roofline_ours)} / {f(row.roofline_baseline)} ({row.gemm_gflops:.0f})"


def _cells(row: Row) -> list[str]:
    baseline = _ms(row.baseline_s) if row.baseline_s is not None else "n/a"
    mem = f"{_mib(row.peak_ours)} / {_mib(row.peak_baseline)}" if row.memory else ""
    note = row.note if row.error is None else f"ERROR {row.error}; {row.note}".rstrip("; ")
    return [row.case, _ms(row.ours_s), baseline, "-" if row.ratio is None else f"{row.ratio:.2f}",
            _params(row), mem, _rel(row), _roof(row), note]


def legend(rows: list[Row]) -> list[str]:
    """One line per group: what "ours" and the baseline run there."""
    lines, seen = [], {}
    for row in rows:
        entry = seen.setdefault(row.group, ([], []))
        for descs, desc in zip(entry, (row.ours_desc, row.baseline_desc)):
            if desc and desc not in descs:
                descs.append(desc)
    for group, (ours, base) in seen.items():
        lines.append(f"{group}: ours = {' | '.join(ours) or '-'}; baseline = {' | '.join(base) or '-'}")
    return lines


def render_table(rows: list[Row], info: dict | None = None) -> Table:
    table = Table(Column(COLUMNS[0], no_wrap=True), *COLUMNS[1:],
                  title="xlstm-zoo bench: ours vs official (ratio > 1: ours faster)",
                  caption=header(info) if info else None)
    group = None
    for row in rows:
        if row.group != group:
            if group is not None:
                table.add_section()
            group = row.group
        table.add_row(*_cells(row))
    return table


def markdown(rows: list[Row], info: dict) -> str:
    lines = ["# xlstm-zoo bench", "", header(info), "",
             "ratio = baseline / ours (> 1: ours faster); times are medians; \"time vs ref\" divides by the "
             "group's reference case (T=1024 in the sweep, position 10 in generation); roofline = counted GFLOP/s "
             "(torch.utils.flop_counter) / the GFLOP/s of a plain fp32 GEMM timed interleaved in the same case.", "",
             "| group | " + " | ".join(COLUMNS) + " |", "|" + " --- |" * (len(COLUMNS) + 1)]
    for row in rows:
        lines.append("| " + " | ".join([row.group, *(c.replace("|", "\\|") for c in _cells(row))]) + " |")
    lines += ["", *(f"- {line}" for line in legend(rows))]
    return "\n".join(lines) + "\n"


def write_results(rows: list[Row], info: dict, out_dir: str | Path) -> list[Path]:
    """``results.json`` and ``results.md`` in ``out_dir``, each written to a temporary file and renamed."""
    out_dir = Path(out_dir)
    payload = json.dumps({"meta": info, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    paths = [out_dir / "results.json", out_dir / "results.md"]
    atomic_write(paths[0], lambda f: f.write(payload.encode()))
    text = markdown(rows, info)
    atomic_write(paths[1], lambda f: f.write(text.encode()))
    return paths
