"""How much a trained parity cell's answer still depends on its input, beside the same model at init.

    python tests/fidelity/answer_spread.py CELL_DIR [CELL_DIR ...]

For each grid or ``claim_cell.py`` cell directory: the model of its checkpoint, and the same recipe
freshly initialised with the cell's seed, read 512 inputs of length 3. At the answer position (the
separator, the same token for every input, so any spread comes through the recurrent memory) it
prints the standard deviation across inputs of each block's output (mean over units) and of the
answer logits. A seed stuck at chance whose spread has shrunk far below its init's has learned to
ignore its input. Writes nothing; not part of the test run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.tasks.base import IGNORE
from xlstm_zoo.training.trainer import build_model_for, build_task


def spread(model, batch) -> dict[str, float]:
    """{block name or 'answer logits': std across inputs at the scored position}."""
    outputs = {}
    hooks = [block.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(
        name, out[0] if isinstance(out, tuple) else out)) for name, block in model.stack.blocks.named_children()]
    model.eval()
    with torch.no_grad():
        logits, _ = model(batch.tokens)
    for hook in hooks:
        hook.remove()
    scored = batch.targets != IGNORE
    answers = batch.targets[scored].unique()  # the answer tokens' logits
    row = {f"block {name}": out[scored].std(0).mean().item() for name, out in outputs.items()}
    row["answer logits"] = logits[scored][:, answers].std(0).mean().item()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for cell in args.cells:
        recipe, trained, state = load_checkpoint(cell / "checkpoint")
        torch.manual_seed(recipe.train.seed)  # as the trainer does, before building the task and the model
        task = build_task(recipe)
        initial = build_model_for(recipe, task)
        batch = task.generate(3, 512, torch.Generator().manual_seed(1))
        print(f"{cell.name} (step {state.get('step')}):")
        for label, model in (("init", initial), ("trained", trained)):
            print(f"  {label:8s}" + "  ".join(f"{k} {v:.4f}" for k, v in spread(model, batch).items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
