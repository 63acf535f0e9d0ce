"""What a recipe means for a training run: the part that determines its result. A grid cell's digest
and a checkpoint's resume check both compare this, so they agree on what counts: editing a grid's
name, description, report or profiles, where it runs (``launch``) or where metrics go
(``train.report_to``) changes neither a cell's digest nor whether its checkpoint resumes."""

from __future__ import annotations

import hashlib
import json

from xlstm_zoo.config import digest_dump

# Top-level sections that describe the grid around a run, not the run.
NOT_MEANING = ("name", "description", "grid", "report", "profiles", "launch")


def meaning(recipe) -> dict:
    """The recipe as plain data without :data:`NOT_MEANING` and ``train.report_to``. Fields added after
    grids were first run are left out while they hold their default (``AddedField``, see
    :func:`xlstm_zoo.config.digest_dump`), so existing run directories keep their digests."""
    content = {k: v for k, v in digest_dump(recipe).items() if k not in NOT_MEANING}
    content["train"].pop("report_to", None)  # where metrics are sent does not change what is computed
    return content


def meaning_digest(recipe) -> str:
    return hashlib.sha256(json.dumps(meaning(recipe), sort_keys=True).encode()).hexdigest()
