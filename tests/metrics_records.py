"""metrics.jsonl compared across runs: every field but tokens_per_second, a wall-clock measurement."""

import json


def untimed(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_second"}
            for line in path.read_text().splitlines()]
