"""How fast a parity cell's answer stops depending on its input, and what then reaches its last block.

    python tests/fidelity/head_collapse.py PROFILE VARIANT SEED [path=value ...] [--every 50] [--until STEP]

trains the parity cell of ``state_tracking --profile PROFILE`` for VARIANT and SEED (the overrides
applied to the cell, as ``claim_cell.py`` does; the early-stop rule is switched off) on one thread,
and every ``--every`` steps prints: the training loss; for 512 fixed inputs of length 3, at the answer
position, the standard deviation across inputs of the answer logits and of the last block's cell
output (before its norm); the gradient norm reaching that cell's weights in the step; the head's norm.
With a trainable head the answer-logit spread falls within the first ~100 steps in every seed; in a
seed that stays at chance the cell's own spread and its gradient then die too. Writes nothing; not
part of the test run.
"""

from __future__ import annotations

import torch

from claim_cell import traced_run
from xlstm_zoo.tasks.base import IGNORE


def spreads(model, cell, batch) -> tuple[float, float]:
    """(answer-logit spread, cell-output spread) across the batch's inputs at the scored position."""
    captured = {}
    hook = cell.register_forward_hook(lambda _m, _i, out: captured.__setitem__("h", out[0]))
    model.eval()
    with torch.no_grad():
        logits, _ = model(batch.tokens)
    model.train()
    hook.remove()
    scored = batch.targets != IGNORE
    answers = batch.targets[scored].unique()
    return logits[scored][:, answers].std(0).mean().item(), captured["h"][scored].std(0).mean().item()


def main(argv=None) -> int:
    args, run = traced_run(__doc__.split("\n\n")[0], argv)
    cfg = run.cfg
    cell = run.model.stack.blocks[-1].cell
    probe = run.task.generate(3, 512, torch.Generator().manual_seed(12345))
    print("step  train-loss  answer-logit-spread  cell-output-spread  cell-gradient  head-norm")
    logit_sd, cell_sd = spreads(run.model, cell, probe)
    print(f"{0:5d}  {'-':10s}  {logit_sd:19.4f}  {cell_sd:18.4f}  {'-':>13s}  {run.model.head.weight.norm():9.2f}")
    for step in range(min(args.until or cfg.steps, cfg.steps)):
        loss, _ = run.loss_and_gradients(step)
        grads = [p.grad.norm() for p in cell.parameters() if p.grad is not None]
        gradient = torch.stack(grads).norm().item() if grads else 0.0
        run.optimizer.step()
        if (step + 1) % args.every == 0:
            logit_sd, cell_sd = spreads(run.model, cell, probe)
            print(f"{step + 1:5d}  {loss.item():10.3f}  {logit_sd:19.4f}  {cell_sd:18.4f}  {gradient:13.2e}  "
                  f"{run.model.head.weight.norm():9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
