"""Parameter counts and the training-FLOPs estimate a run reports (result.json).

``non_embedding_parameters``: every distinct parameter but the token embedding and the output head
(Kaplan et al.'s convention; the size the LM grid matches models on). ``flops_per_token``: training
(forward + backward) FLOPs per token estimated as ``6 x`` the weights each token multiplies with:
the non-embedding parameters plus the head's ``vocab x dim`` (tied or not; the embedding is a lookup).
The estimate leaves out what grows with the context (attention scores, recurrent state updates) and
elementwise work, so it is a lower bound that is closest for small contexts.
"""

from __future__ import annotations

import torch


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    distinct = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in distinct.values())
    embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(model, "head", None)
    head_weight = getattr(head, "weight", None)
    untied_head = head_weight.numel() if head_weight is not None and id(head_weight) not in embedding_ids else 0
    non_embedding = total - embedding - untied_head
    head_macs = head_weight.numel() if head_weight is not None else 0
    return {"parameters": total, "non_embedding_parameters": non_embedding,
            "flops_per_token": 6 * (non_embedding + head_macs)}
