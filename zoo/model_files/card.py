"""The README.md model card ``save_pretrained`` writes: recipe, parameter counts, tokenizer, training data
and steps, final metrics, the command that trained it and the licence, with the Hugging Face metadata
header. What a run recorded is read from the directory the model was loaded from (a training
checkpoint: its ``state.json``; its run directory: ``result.json``, else the last evaluation in
``metrics.jsonl``). A README.md that is not a card of ours (no :data:`MARKER`) is the user's: kept."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from xlstm_zoo.models.counts import parameter_counts

README = "README.md"
MARKER = "<!-- xlstm-zoo model card: written by save_pretrained, replaced when the model is saved again -->"
METRICS = ("loss", "perplexity", "bits_per_byte", "accuracy", "headline")


def is_ours(path: Path) -> bool:
    """Whether ``path`` is absent or a card this module wrote (and so may be replaced)."""
    if not path.is_file():
        return not path.exists()  # nothing there yet (a directory named README.md is not ours to replace)
    try:
        return MARKER in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def model_card(recipe, model, *, tokenizer=None, source: str | Path | None = None, license: str | None = None) -> str:
    """The card for ``model`` built from ``recipe`` (a Recipe); ``source``: the directory it was loaded from."""
    run = _run_record(Path(source)) if source else {}
    counts = parameter_counts(model)
    name = recipe.name or "xlstm-zoo model"
    header = {"license": license or "other", "library_name": "xlstm-zoo", "pipeline_tag": "text-generation",
              "tags": ["xlstm-zoo", "recurrent", model.config.type, getattr(model.config.stack, "type", "stack")]}
    rows = [("parameters", f"{counts['parameters']:,}"),
            ("non-embedding parameters", f"{counts['non_embedding_parameters']:,}"),
            ("tokenizer", _tokenizer(tokenizer, model)),
            ("training data", _data(recipe)),
            ("training", _training(recipe, run)),
            ("command", f"`{run['command']}`" if run.get("command") else "not recorded"),
            ("licence", license or "not stated (set it with save_pretrained(..., license=...) or convert --license)")]
    lines = ["---", yaml.safe_dump(header, sort_keys=False).strip(), "---", MARKER, "", f"# {name}", ""]
    if recipe.description:
        lines += [recipe.description.strip(), ""]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines += _metrics(run.get("metrics") or {})
    lines += ["## Use", "", "```python", "import xlstm_zoo  # registers model_type xlstm_zoo with transformers",
              "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              'model = AutoModelForCausalLM.from_pretrained("this/directory")',
              'tokenizer = AutoTokenizer.from_pretrained("this/directory")  # where a tokenizer is saved',
              "```", "", "Without `import xlstm_zoo`: `from_pretrained(..., trust_remote_code=True)` (xlstm-zoo must "
              "be installed). See xlstm-zoo's docs/transformers.md.", "",
              "## Recipe", "", "```yaml", yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False).strip(),
              "```", ""]
    return "\n".join(lines)


def _tokenizer(tokenizer, model) -> str:
    vocab = model.embedding.num_embeddings
    if tokenizer is None:
        return f"none saved (model vocabulary {vocab})"
    return f"{tokenizer.kind}, {tokenizer.vocab_size:,} tokens (tokenizer.json; model vocabulary {vocab})"


def _data(recipe) -> str:
    task = recipe.task
    if task is None:
        return "not recorded"
    fields = task.model_dump(mode="json")
    where = fields.get("path")
    tok = (fields.get("tokenizer") or {}).get("type")
    parts = [task.type] + ([f"path {where}"] if "path" in fields else []) + ([f"tokenizer {tok}"] if tok else [])
    return ", ".join(str(p) for p in parts if p is not None) + ("" if where or "path" not in fields else " (default corpus)")


def _training(recipe, run: dict) -> str:
    train = recipe.train
    step = run.get("step")
    done = f"{step:,} of {train.steps:,} steps" if isinstance(step, int) else f"{train.steps:,} steps planned"
    return f"{done}, batch {train.batch_size}, lr {train.lr}, seed {train.seed}"


def _metrics(metrics: dict) -> list[str]:
    if not metrics:
        return []
    names = [m for m in METRICS if any(m in v for v in metrics.values())]
    lines = ["## Final metrics", "", "| split | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for split, values in metrics.items():
        lines.append(f"| {split} | " + " | ".join(_number(values.get(m)) for m in names) + " |")
    return lines + [""]


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def _run_record(source: Path) -> dict:
    """What the run that wrote the checkpoint ``source`` recorded: step, command, final metrics."""
    state = _json(source / "state.json") or {}
    run = {"step": state.get("step"), "command": state.get("command")}
    result = _json(source.parent / "result.json")
    if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
        run["metrics"] = result["metrics"]
    else:
        run["metrics"] = _last_evaluation(source.parent / "metrics.jsonl")
    return run


def _last_evaluation(path: Path) -> dict:
    """The last record of each evaluated split in metrics.jsonl (the train split's are training losses)."""
    last: dict[str, dict] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        split = record.get("split") if isinstance(record, dict) else None
        if split and split != "train":
            last[split] = record
    return last


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
