"""Gather one GPU job's results into results.json and results.md (tools/gpu/*.sh call it last).

    python tools/gpu/summarize.py RESULTS_DIR

Reads environment.json, steps.tsv (step, exit status, seconds, command), every ``*.junit.xml`` (pytest)
and every bench report ``*.json`` that tests/bench wrote (``records``/``skipped``) in RESULTS_DIR.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def steps(folder: Path) -> list[dict]:
    path = folder / "steps.tsv"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, rc, seconds, command = (line.split("\t") + ["", "", "", ""])[:4]
        rows.append(dict(step=name, exit=int(rc), seconds=int(seconds), command=command,
                         outcome="ok" if rc == "0" else "timed out" if rc in ("124", "137") else "failed"))
    return rows


def tests(folder: Path) -> dict:
    counts: Counter = Counter()
    failures, skips = [], Counter()
    for path in sorted(folder.glob("*.junit.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed" if child.tag == "failure" else "error"
                    failures.append(dict(test=name, message=(child.get("message") or child.text or "")[:600]))
                elif child.tag == "skipped":
                    outcome = "skipped"
                    skips[(child.get("message") or "")[:200]] += 1
            counts[outcome] += 1
    return dict(counts=dict(counts), failures=failures,
                skip_reasons=[dict(reason=r, count=n) for r, n in skips.most_common()])


def benches(folder: Path) -> dict:
    found = {}
    for path in sorted(folder.glob("*.json")):
        if path.name in ("environment.json", "results.json"):
            continue
        try:
            found[path.stem] = json.loads(path.read_text())
        except ValueError as err:
            found[path.stem] = dict(error=f"unreadable: {err}")
    return found


def markdown(result: dict, folder: Path) -> str:
    env = result["environment"]
    lines = [f"# GPU job `{folder.name}` on {env.get('device')}", "",
             "| item | value |", "| --- | --- |"]
    for key in ("time", "commit", "device", "compute_capability", "nvidia_smi", "torch", "cuda", "triton", "nvcc",
                "python", "cpu", "xlstm", "mlstm_kernels", "command"):
        lines.append(f"| {key} | {str(env.get(key)).replace('|', '/')} |")
    lines += ["", "## Steps", "", "| step | outcome | exit | seconds | command |", "| --- | --- | --- | --- | --- |"]
    for s in result["steps"]:
        lines.append(f"| {s['step']} | {s['outcome']} | {s['exit']} | {s['seconds']} | `{s['command']}` |")
    t = result["tests"]
    lines += ["", "## Tests", "", ", ".join(f"{n} {k}" for k, n in sorted(t["counts"].items())) or "none ran"]
    for f in t["failures"]:
        lines.append(f"- FAILED `{f['test']}`: {f['message'].splitlines()[0] if f['message'] else ''}")
    for s in t["skip_reasons"]:
        lines.append(f"- skipped {s['count']}x: {s['reason']}")
    for md in sorted(folder.glob("*.md")):  # the benchmark tables, the demo grid's report
        if md.name != "results.md":
            lines += ["", f"## {md.stem}", "", md.read_text().strip()]
    return "\n".join(lines) + "\n"


def main(folder: Path) -> int:
    env_path = folder / "environment.json"
    result = dict(environment=json.loads(env_path.read_text()) if env_path.exists() else {},
                  steps=steps(folder), tests=tests(folder), benches=benches(folder))
    (folder / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = markdown(result, folder)
    (folder / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
