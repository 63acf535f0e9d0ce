"""How one parity cell leaves its plateau: loss and accuracy per input length while it trains.

    python tests/fidelity/plateau_by_length.py PROFILE VARIANT SEED [path=value ...] [--every 50] [--until STEP]

trains the parity cell of ``state_tracking --profile PROFILE`` for VARIANT and SEED (the overrides
applied to the cell, as ``claim_cell.py`` does; the early-stop rule is switched off) on one thread,
and every ``--every`` steps prints one line: the training loss and, for 512 fixed inputs of each of
the lengths 3, 4, 6, 8, 12, 20 and 40, the loss and accuracy at the answer. It answers whether a seed
on the plateau fits the short inputs first or nothing at all. Writes nothing; not part of the test run.
"""

from __future__ import annotations

import torch

from claim_cell import traced_run

LENGTHS = (3, 4, 6, 8, 12, 20, 40)


def by_length(model, task, probes: dict) -> dict[int, tuple[float, float]]:
    """{length: (loss, accuracy)} at the scored positions of each length's fixed inputs (``task.score``)."""
    model.eval()
    out = {}
    with torch.no_grad():
        for n, batch in probes.items():
            logits, _ = model(batch.tokens)
            scores = task.score(logits, batch)
            out[n] = tuple(total / count for total, count in (scores["loss"], scores["accuracy"]))
    model.train()
    return out


def main(argv=None) -> int:
    args, run = traced_run(__doc__.split("\n\n")[0], argv)
    cfg = run.cfg
    generator = torch.Generator().manual_seed(12345)
    probes = {n: run.task.generate(n, 512, generator) for n in LENGTHS}
    print("step  train-loss  " + "  ".join(f"len {n}: loss acc" for n in LENGTHS))
    for step in range(min(args.until or cfg.steps, cfg.steps)):
        loss, _ = run.loss_and_gradients(step)
        run.optimizer.step()
        if (step + 1) % args.every == 0:
            row = by_length(run.model, run.task, probes)
            print(f"{step + 1:5d}  {loss.item():.3f}       " + "  ".join(
                f"{row[n][0]:.3f} {row[n][1]:.2f}".ljust(len(f"len {n}: loss acc")) for n in LENGTHS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
