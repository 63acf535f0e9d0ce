"""Bench cases for packed rows: one training step (forward + backward) over rows packed from 8 documents
each (``doc_starts``) against the same tokens unpacked, per model kind. The ratio unpacked / packed is what
keeping documents apart costs (1.0: nothing; the target is at least 0.9)."""

from __future__ import annotations

import torch

from xlstm_zoo.bench.case import Case, Prepared, Scale, count
from xlstm_zoo.recipe_loader import build, load_recipe

DOCUMENTS_PER_ROW = 8
PACKED_MODELS = [("xlstm_7_1", "xLSTM[7:1]"), ("xlstm_1_0", "xLSTM[1:0]"), ("llama", "Llama"), ("mamba", "Mamba"),
                 ("rwkv", "RWKV-4")]


def document_starts(batch: int, length: int, seed: int) -> torch.Tensor:
    """``[batch, length]`` with ``DOCUMENTS_PER_ROW`` documents of random lengths in every row."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.zeros(batch, length, dtype=torch.bool)
    for row in range(batch):
        cuts = torch.randperm(length - 1, generator=g)[:DOCUMENTS_PER_ROW - 1] + 1
        starts[row, cuts] = True
    return starts


def _train_step(model, tokens, doc_starts):
    model.train()

    def fn():
        model.zero_grad(set_to_none=True)
        model(tokens, doc_starts=doc_starts)[0].sum().backward()
    return fn


def packed_cases(scale: Scale) -> list[Case]:
    out = []
    for recipe, label in PACKED_MODELS:
        def side(packed: bool, recipe=recipe):
            torch.manual_seed(scale.seed)
            model = build(load_recipe(recipe, [f"dim={scale.dim}"]))
            g = torch.Generator().manual_seed(scale.seed + 5)
            tokens = torch.randint(0, model.embedding.num_embeddings, (scale.batch, scale.seq_len), generator=g)
            starts = document_starts(scale.batch, scale.seq_len, scale.seed) if packed else None
            note = f"{DOCUMENTS_PER_ROW} documents per row" if packed else "one document per row"
            return Prepared(_train_step(model, tokens, starts), count(model), note)

        out.append(Case(name=f"packed/{recipe}", group="packed rows: training step, packed vs the same tokens",
                        shapes=f"B={scale.batch} T={scale.seq_len} dim={scale.dim}, {DOCUMENTS_PER_ROW} documents a row",
                        ours=lambda side=side: side(True), baseline=lambda side=side: side(False),
                        baseline_name="unpacked"))
    return out
