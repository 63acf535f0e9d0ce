"""Training dynamics against the official xLSTM: the same loop, data and seeds for both.

    python tests/fidelity/compare_official.py --out runs/fidelity            # everything (33 runs of 10-40 s each on 2 idle cores)
    python tests/fidelity/compare_official.py --only 'parity/*' --seeds 0    # a subset

Learners (``--list`` names them): the official ``xLSTMLMModel`` (NeurIPS blocks; sLSTM on its
``vanilla`` backend, mLSTM on its parallel form; its own ``reset_parameters`` init and weight-decay
groups) beside our recipes: one built to match it (``init.scheme: xlstm``, headwise gate
projections, the official forget-bias power law, no decay on embedding and recurrent weights),
our defaults, and single changes between the two, so that each difference's cost shows.

Every learner trains through :func:`train_curve`: AdamW, linear warm-up then cosine (our
schedule), gradient clipping, batches drawn from the task's generator seeded by (seed, step),
evaluation on the test split every ``eval_every`` steps. Writes ``curves.json``, ``results.md``
(final test accuracy per learner and seed, mean and std, the step each seed first reached 0.9)
and ``curves.png`` into ``--out``. Needs the test extra (``xlstm``) and matplotlib.

Not part of the default test run: it trains dozens of models.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from rich.progress import Progress

import xlstm_zoo
from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.grid.runner import progress_columns
from xlstm_zoo.tasks.base import merge_scores
from xlstm_zoo.training.schedule import lr_factor
from xlstm_zoo.training.trainer import build_task as build_recipe_task, param_groups


@dataclass(frozen=True)
class Setting:
    """One task and training budget shared by every learner compared on it."""

    name: str
    task: dict
    dim: int = 32
    heads: int = 4
    steps: int = 1000
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    eval_every: int = 100
    context_length: int = 256   # the official mLSTM's causal-mask size: >= every sequence length


SETTINGS = {
    "parity": Setting("parity", {"type": "parity", "train_lengths": [3, 20], "test_lengths": [21, 40],
                                 "eval_sequences": 256}),
    "mqar": Setting("mqar", {"type": "mqar", "num_kv_pairs": 4, "context_length": 48, "num_keys": 32,
                             "num_values": 32, "eval_sequences": 256}, steps=600, batch_size=64),
}

# Our sLSTM block as the official one builds it: per-head gate and z/o projections, forget bias
# 5 .. -7 over each head's units, input-gate bias 0, no conv (the official parity setting).
OFFICIAL_SLSTM_CELL = {
    "type": "slstm", "proj": "headwise",
    "input_gate": {"type": "exponential", "proj": "headwise", "bias_init": 0.0},
    "forget_gate": {"type": "sigmoid", "proj": "headwise",
                    "bias_init": {"kind": "power_law", "start": 5.0, "end": -7.0, "over": "units"}},
}
OFFICIAL_TRAIN = {"no_weight_decay": ["embedding", "recurrent"]}


@dataclass
class Learner:
    name: str
    kind: str                       # "official" or "zoo"
    block: str                      # "slstm" or "mlstm"
    overrides: dict = field(default_factory=dict)   # zoo: model fields; official: layer fields
    train: dict = field(default_factory=dict)       # zoo: train-section fields (no_weight_decay)
    settings: tuple[str, ...] = ("parity",)
    heads: int | None = None                        # None: the setting's


def slstm_model(cell: dict, init: str, mlp_factor: float = 4 / 3) -> dict:
    """One post_up sLSTM block, no conv (the official parity setting)."""
    return {"init": {"scheme": init}, "stack": {"type": "xlstm", "ratio": "0:1", "num_blocks": 1, "blocks": {
            "s": {"type": "post_up", "conv_kernel": 0, "cell": cell, "mlp": {"proj_factor": mlp_factor}}}}}


# The official FFN rounds 1.3 * dim up to a multiple of 64: 64 units at dim 32 (ours: 2.0 * 32).
OFFICIAL_MLP = 2.0


def mlstm_model(init: str, proj: str = "blockdiag") -> dict:
    return {"init": {"scheme": init}, "stack": {"type": "xlstm", "ratio": "1:0", "num_blocks": 1,
            "blocks": {"m": {"type": "pre_up", "cell": {"type": "mlstm", "proj": proj}}}}}


def _cell(**changes) -> dict:
    return {**OFFICIAL_SLSTM_CELL, **changes}


AS_OFFICIAL = slstm_model(OFFICIAL_SLSTM_CELL, "xlstm", OFFICIAL_MLP)
LEARNERS = [
    # The official parity setting (4 heads of 8 units) and ours built like it.
    Learner("official sLSTM", "official", "slstm"),
    Learner("zoo sLSTM as official", "zoo", "slstm", AS_OFFICIAL, OFFICIAL_TRAIN),
    # One head of 32 units, where learning happens at this budget; then one difference at a time
    # (full vs headwise gate projections are the same map with one head, so that one is not here).
    Learner("official sLSTM, 1 head", "official", "slstm", heads=1),
    Learner("zoo sLSTM as official, 1 head", "zoo", "slstm", AS_OFFICIAL, OFFICIAL_TRAIN, heads=1),
    Learner("  + zoo init", "zoo", "slstm", slstm_model(OFFICIAL_SLSTM_CELL, "zoo", OFFICIAL_MLP), OFFICIAL_TRAIN,
            heads=1),
    Learner("  + linspace forget bias 3..6", "zoo", "slstm",
            slstm_model(_cell(forget_gate={"type": "sigmoid", "proj": "headwise", "bias_init": {"kind": "linspace"}}),
                        "xlstm", OFFICIAL_MLP), OFFICIAL_TRAIN, heads=1),
    Learner("  + decay on every matrix", "zoo", "slstm", AS_OFFICIAL, heads=1),
    Learner("zoo sLSTM defaults, 1 head", "zoo", "slstm", slstm_model({"type": "slstm"}, "zoo"), heads=1),
    Learner("official mLSTM", "official", "mlstm", settings=("mqar",)),
    Learner("zoo mLSTM as official", "zoo", "mlstm", mlstm_model("xlstm"), OFFICIAL_TRAIN, settings=("mqar",)),
    Learner("zoo mLSTM defaults", "zoo", "mlstm", mlstm_model("zoo", "linear"), settings=("mqar",)),
]


class OfficialLM(torch.nn.Module):
    """The official ``xLSTMLMModel`` with one block, returning ``(logits, None)`` like ours."""

    def __init__(self, block: str, setting: Setting, vocab_size: int, heads: int):
        super().__init__()
        from xlstm import (FeedForwardConfig, mLSTMBlockConfig, mLSTMLayerConfig, sLSTMBlockConfig,  # test extra
                           sLSTMLayerConfig, xLSTMLMModel, xLSTMLMModelConfig)

        blocks = ({"slstm_block": sLSTMBlockConfig(
                      slstm=sLSTMLayerConfig(backend="vanilla", num_heads=heads, conv1d_kernel_size=0,
                                             bias_init="powerlaw_blockdependent"),
                      feedforward=FeedForwardConfig(proj_factor=1.3, act_fn="gelu")),
                   "slstm_at": [0]}
                  if block == "slstm" else
                  {"mlstm_block": mLSTMBlockConfig(mlstm=mLSTMLayerConfig(num_heads=heads))})
        config = xLSTMLMModelConfig(vocab_size=vocab_size, embedding_dim=setting.dim, num_blocks=1,
                                    context_length=setting.context_length, tie_weights=False, **blocks)
        self.model = xLSTMLMModel(config)
        self.model.reset_parameters()

    def forward(self, tokens, state=None):
        return self.model(tokens), None

    def param_groups(self, weight_decay):
        decay, no_decay = self.model.get_weight_decay_optim_groups()
        return [{"params": list(decay), "weight_decay": weight_decay},
                {"params": list(no_decay), "weight_decay": 0.0}]


def build_task(setting: Setting):
    return build_recipe_task(xlstm_zoo.load_recipe({"model": {"type": "causal_lm", "vocab_size": None},
                                                    "task": setting.task}))


def build_learner(learner: Learner, setting: Setting, task):
    heads = learner.heads or setting.heads
    if learner.kind == "official":
        model = OfficialLM(learner.block, setting, task.vocab_size, heads)
        return model, model.param_groups(setting.weight_decay)
    model_cfg = {"type": "causal_lm", "vocab_size": task.vocab_size, "dim": setting.dim, "tie_weights": False,
                 **copy.deepcopy(learner.overrides)}  # learners share cell dicts: never edit them in place
    if learner.block == "slstm":
        cell = model_cfg["stack"]["blocks"]["s"]["cell"]
        cell["num_heads"] = learner.heads or cell.get("num_heads", setting.heads)
    else:
        model_cfg["stack"]["blocks"]["m"]["cell"]["num_heads"] = heads
    model = xlstm_zoo.build(xlstm_zoo.load_recipe({"model": model_cfg}))
    return model, param_groups(model, setting.weight_decay, learner.train.get("no_weight_decay", ()))


@torch.no_grad()
def test_accuracy(model, task) -> float:
    model.eval()
    parts = [task.score(model(b.tokens)[0].float(), b) for b in task.eval_batches("test")]
    model.train()
    return task.summarize(merge_scores(parts))["accuracy"]


def train_curve(learner: Learner, setting: Setting, seed: int, progress=None) -> dict:
    """Train one learner on one setting from one seed; the test-accuracy curve and timings."""
    task = build_task(setting)
    torch.manual_seed(seed)
    model, groups = build_learner(learner, setting, task)
    optimizer = torch.optim.AdamW(groups, lr=setting.lr, betas=(0.9, 0.98))
    bar = progress.add_task(f"{setting.name} | {learner.name} | seed {seed}", total=setting.steps, info="") \
        if progress else None
    curve, started = [], time.perf_counter()
    for step in range(setting.steps):
        for group in optimizer.param_groups:
            group["lr"] = setting.lr * lr_factor(step, setting.steps, setting.warmup_steps, 0.1)
        batch = task.batch("train", setting.batch_size, torch.Generator().manual_seed(seed * 1_000_003 + step))
        logits, _ = model(batch.tokens)
        loss = task.loss(logits.float(), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % setting.eval_every == 0 or step + 1 == setting.steps:
            curve.append({"step": step + 1, "loss": loss.item(), "test": test_accuracy(model, task)})
            if bar is not None:
                progress.update(bar, info=f"test {curve[-1]['test']:.3f}")
        if bar is not None:
            progress.update(bar, completed=step + 1)
    if bar is not None:
        progress.remove_task(bar)
    return {"learner": learner.name, "setting": setting.name, "seed": seed, "curve": curve,
            "seconds": round(time.perf_counter() - started, 1), "parameters": sum(p.numel() for p in model.parameters())}


def first_step_at(curve: list[dict], threshold: float = 0.9) -> int | None:
    return next((point["step"] for point in curve if point["test"] >= threshold), None)


def summary_table(runs: list[dict]) -> str:
    # Wall time stays in curves.json only: these runs share the machine with other work, so their
    # seconds are no speed comparison (tests/bench/ is where speed is measured).
    lines = ["| setting | learner | params | test accuracy per seed | mean ± std | steps to 0.9 per seed |",
             "| --- | --- | --- | --- | --- | --- |"]
    keys = list(dict.fromkeys((r["setting"], r["learner"]) for r in runs))
    for setting, learner in keys:
        group = [r for r in runs if (r["setting"], r["learner"]) == (setting, learner)]
        finals = [r["curve"][-1]["test"] for r in group]
        std = statistics.stdev(finals) if len(finals) > 1 else 0.0
        reach = ", ".join(str(first_step_at(r["curve"]) or "-") for r in group)
        lines.append(f"| {setting} | {learner} | {group[0]['parameters']:,} | {', '.join(f'{f:.3f}' for f in finals)} "
                     f"| {statistics.mean(finals):.3f} ± {std:.3f} | {reach} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib  # optional: the plot extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in runs))
    fig, axes = plt.subplots(1, len(settings), figsize=(7 * len(settings), 4.5), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        learners = list(dict.fromkeys(r["learner"] for r in runs if r["setting"] == setting))
        for i, learner in enumerate(learners):
            group = [r for r in runs if (r["setting"], r["learner"]) == (setting, learner)]
            color = f"C{i}"
            for j, run in enumerate(group):
                ax.plot([p["step"] for p in run["curve"]], [p["test"] for p in run["curve"]], color=color,
                        alpha=0.8, linestyle="--" if learner.startswith("official") else "-",
                        label=learner if j == 0 else None)
        ax.set(title=f"{setting}: test accuracy (each line one seed)", xlabel="step", ylabel="accuracy", ylim=(0, 1.02))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/fidelity")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="*", help="'SETTING/LEARNER' glob, e.g. 'parity/*official*'")
    parser.add_argument("--steps", type=int, help="train every setting this many steps (a smoke run)")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    jobs = [(s, learner) for learner in LEARNERS for s in learner.settings
            if fnmatch.fnmatch(f"{s}/{learner.name}", args.only)]
    if args.list or not jobs:
        print("\n".join(f"{s}/{learner.name}" for s, learner in jobs) or f"nothing matches {args.only!r}")
        return 0 if jobs else 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "curves.json"
    runs = json.loads(done_path.read_text()) if done_path.exists() else []
    done = {(r["setting"], r["learner"], r["seed"]) for r in runs}
    seeds = [int(s) for s in args.seeds.split(",")]
    with Progress(*progress_columns()) as progress:
        overall = progress.add_task("fidelity", total=len(jobs) * len(seeds), info="")
        for setting_name, learner in jobs:
            for seed in seeds:
                if (setting_name, learner.name, seed) not in done:  # resumable: finished runs are kept
                    setting = SETTINGS[setting_name]
                    if args.steps:
                        setting = replace(setting, steps=args.steps, warmup_steps=min(setting.warmup_steps, args.steps),
                                          eval_every=max(1, args.steps // 2))
                    runs.append(train_curve(learner, setting, seed, progress))
                    text = json.dumps(runs, indent=1)
                    atomic_write(done_path, lambda f: f.write(text.encode()))
                progress.advance(overall)
    table = summary_table(runs)
    atomic_write(out / "results.md", lambda f: f.write(table.encode()))
    plot(runs, out / "curves.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
