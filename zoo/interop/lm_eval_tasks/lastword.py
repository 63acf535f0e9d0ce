"""The last-word task's data: lastword.jsonl beside this file, as a datasets split (no download)."""

import json
from pathlib import Path


def load(**kwargs):
    import datasets  # lm-evaluation-harness depends on it

    rows = [json.loads(line) for line in (Path(__file__).parent / "lastword.jsonl").read_text().splitlines()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
