"""The trainer: AdamW, warm-up + cosine, clipping, fp32 or bf16 autocast, periodic evaluation,
atomic checkpoints with exact resume, metrics as JSON lines, and a progress bar.

Training batches are drawn from a generator seeded by (seed, step), so a run resumed from a
checkpoint sees exactly the batches an uninterrupted run would have seen.

Started by ``torchrun`` (``WORLD_SIZE > 1``), the trainer is data-parallel with the contract of
:mod:`xlstm_zoo.training.distributed`: the same global batch and the same optimiser steps as one
process, every rank training on its rows, only rank 0 writing. ``train.micro_batches > 1`` splits
each process's rows into sequential parts whose gradients add up (gradient accumulation). With
one process and one micro-batch the loop is the plain one: mean loss of the whole batch.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from xlstm_zoo.checkpoint import STATE, atomic_write, find_checkpoint, load_checkpoint, read_state, save_checkpoint
from xlstm_zoo.config import BuildContext, build as build_component
from xlstm_zoo.errors import ConfigError, WriteError, ZooError
from xlstm_zoo.initialization import KEEP, parameter_roles
from xlstm_zoo.model_files.files import model_files
from xlstm_zoo.loggers.base import Loggers, RunInfo, build_loggers
from xlstm_zoo.tasks.base import IGNORE, Task, merge_scores
from xlstm_zoo.training import signals
from xlstm_zoo.training.early_stop import EarlyStopper
from xlstm_zoo.training.distributed import DistContext, all_reduce_sum, check_split, reduce_scores, sum_hook
from xlstm_zoo.models.counts import parameter_counts
from xlstm_zoo.training.metrics import MetricsLog, read_metrics
from xlstm_zoo.training.preflight import check_device, probe_failed_plugins
from xlstm_zoo.training.resume import between_steps, check_implementations, restore_between_steps
from xlstm_zoo.training.schedule import lr_factor
from xlstm_zoo.recipe_loader import build, with_task_vocab
from xlstm_zoo.recipe_loader.meaning import meaning
from xlstm_zoo.recipe_loader.sizes import check_training_fits

CHECKPOINT = "checkpoint"  # a directory: see xlstm_zoo.checkpoint
METRICS = "metrics.jsonl"


class TrainingDiverged(ZooError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class NonFiniteEvaluation(ZooError):
    """A final evaluation gave NaN or inf though training stayed finite: no result to record."""


def check_finite(final: dict[str, dict[str, float]], step: int) -> None:
    """Refuse final metrics with a NaN or inf (e.g. logits that overflow on the longer test inputs): scored as
    they are, such logits would pass for a trained model with accuracy 0."""
    bad = [(split, name, value) for split, metrics in final.items() for name, value in metrics.items()
           if name != "headline" and isinstance(value, float) and not math.isfinite(value)]
    if bad:
        listed = ", ".join(f"{name} {value} on {split}" for split, name, value in bad)
        raise NonFiniteEvaluation(f"the evaluation after step {step} is not finite ({listed}) although training "
                                  "was: the model's outputs are not finite there (try bf16 -> fp32, a lower train.lr, "
                                  "or shorter evaluation inputs); the checkpoint is kept")


def build_task(recipe) -> Task:
    if recipe.task is None:
        raise ConfigError("the recipe has no `task:` section, so there is nothing to train on "
                          "(see `xlstm-zoo list task`)", path="task", file=recipe._source)
    return build_component(recipe.task, BuildContext(dim=0, path="task"), "task")


def build_model_for(recipe, task: Task) -> torch.nn.Module:
    recipe = with_task_vocab(recipe, task)
    vocab = getattr(recipe.model, "vocab_size", None)
    if vocab is not None and vocab < task.vocab_size:
        raise ConfigError(f"vocab_size={vocab} is smaller than task {recipe.task.type!r}'s vocabulary "
                          f"({task.vocab_size}); set model.vocab_size >= {task.vocab_size}",
                          path="model.vocab_size", file=recipe._source)
    return build(recipe)


def check_step_fits(recipe, task: Task, rows: int, device: str) -> None:
    """Before anything is allocated: one line if a training step cannot fit (see recipe.sizes); its
    sequence length is that of a one-row batch drawn as the first step draws."""
    cfg = recipe.train
    length = task.batch("train", 1, _step_generator(cfg.seed, 0)).tokens.shape[1]
    micro_rows = -(-rows // cfg.micro_batches)
    try:
        check_training_fits(with_task_vocab(recipe, task).model, micro_rows, length, device)
    except ConfigError as err:
        raise err.located(file=recipe._source) from None


def _step_generator(seed: int, step: int) -> torch.Generator:
    # modulo 2**64: any 64-bit seed works, and small ones give the same batches as always
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % 2**64)


def freeze(model, roles) -> None:
    """Stop the weights of the given init roles from training (no gradient, no optimiser state)."""
    by_role = list(parameter_roles(model).values())
    for role in roles:
        params = [p for p, r in by_role if r == role]
        if not params:
            present = ", ".join(sorted({r for _, r in by_role if r != KEEP}))
            tied = "; a tied head is the embedding" if role == "head" else ""
            raise ConfigError(f"train.frozen names role {role!r}, but this model has no weight with that role "
                              f"(its roles: {present}{tied})", path="train.frozen")
        for p in params:
            p.requires_grad_(False)


def param_groups(model, weight_decay: float, no_decay_roles=()) -> list[dict]:
    """AdamW groups: weight decay on matrices (2+ dims) except those whose init role is listed."""
    params = [(p, role) for p, role in parameter_roles(model).values() if p.requires_grad]
    decay = [p for p, role in params if p.dim() >= 2 and role not in no_decay_roles]
    rest = [p for p, role in params if p.dim() < 2 or role in no_decay_roles]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def adamw(groups: list[dict], lr: float, betas) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel where the parameters' device has one (CPU and CUDA): one kernel
    instead of ~10 small ops per parameter tensor (about a third of a tiny model's optimiser step;
    docs/performance.md)."""
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except RuntimeError:  # e.g. a device without the fused kernel: the default implementation
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


@torch.no_grad()
def evaluate(model, task: Task, split: str, *, device="cpu", precision="fp32",
             ctx: DistContext = DistContext()) -> dict[str, float]:
    """Score ``split``'s evaluation set; data-parallel processes score every ``world``-th batch each
    and add their sums, so all of them return the metrics of the whole set."""
    was_training = model.training
    model.eval()
    parts = []
    with _autocast(device, precision):
        for i, batch in enumerate(task.eval_batches(split)):
            if i % ctx.world != ctx.rank:
                continue
            batch = batch.to(device)
            logits, _ = model(batch.tokens, **batch.model_inputs())
            parts.append(task.score(logits.float(), batch))
    model.train(was_training)
    return task.summarize(reduce_scores(merge_scores(parts), ctx))


def _autocast(device, precision):
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(recipe, run_dir: str | Path | None = None, *, progress=None, description: str = "training") -> dict:
    """Train ``recipe.model`` on ``recipe.task``; returns the final evaluation metrics per split.

    With ``run_dir``, writes ``metrics.jsonl`` and the ``checkpoint/`` directory there and resumes
    from the checkpoint if one exists; a run whose checkpoint is at the last step is finished: its
    result is returned again (the final metrics re-evaluated) and nothing is trained or written.
    ``progress`` is a rich Progress to add a task bar to (or None).
    Under ``torchrun`` every rank calls this; rank 0 alone writes and shows progress.
    """
    if run_dir is not None and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ConfigError(f"the run directory {run_dir} exists and is a file (give a new or existing directory)")
    cfg = recipe.train
    ctx = DistContext.from_env()
    rows = check_split(cfg.batch_size, ctx.world, cfg.micro_batches, recipe._source)
    device = ctx.device(cfg.device)
    check_device(device, recipe._source)
    ctx.init(device)
    try:
        result = _train(recipe, cfg, ctx, rows, device, Path(run_dir) if run_dir is not None else None,
                        progress if ctx.is_main else None, description)
        ctx.barrier()  # no rank tears the process group down while another still uses it
        return result
    finally:
        ctx.destroy()


def _train(recipe, cfg, ctx: DistContext, rows: int, device: str, run_dir: Path | None, progress,
           description: str) -> dict:
    run = _Run.prepare(recipe, cfg, ctx, rows, device, run_dir)
    if run.start == cfg.steps or run.stopped:  # a finished run again: nothing trained, nothing logged twice
        return _finished_result(run_dir, cfg, run.model, run.task, device, ctx, run.start, run.stopped)
    with run.reporting(progress, description):
        try:
            for step in range(run.start, cfg.steps):
                loss, batch = run.loss_and_gradients(step)
                with signals.held():  # weights change: a Ctrl-C or SIGTERM waits until this step is recorded
                    run.safe = None  # until the step is recorded; an exception in between (a second Ctrl-C) saves nothing
                    run.optimizer.step()
                    run.record(step + 1, loss.item(), batch.tokens.numel())
                    run.safe = step + 1
                if run.stopped:  # train.early_stop reached at this step's evaluation
                    run.write({"step": step + 1, "event": "early_stop"})
                    break
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, or a cancelled Ray task: keep the progress made since the last checkpoint
            run.save_interrupted()
            raise
        return run.finish()


@dataclass
class _Run:
    """One training run's parts and bookkeeping; its methods are the steps of :func:`_train`."""

    recipe: Any
    cfg: Any                        # recipe.train
    ctx: DistContext
    rows: int                       # rows per process and micro-batch
    device: str
    run_dir: Path | None
    task: Task
    model: torch.nn.Module
    forward: torch.nn.Module        # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    log: MetricsLog                 # metrics.jsonl: the source of truth
    loggers: Loggers                # train.report_to (rank 0 only): get every record metrics.jsonl gets
    start: int = 0                  # the first step to take (a resumed run's checkpoint step)
    safe: int | None = 0            # weights, optimizer and metrics.jsonl are exactly those after `safe` steps
    saved: int = 0                  # the step of the last checkpoint written
    parameters: list = field(default_factory=list)  # listed once for the gradient clipping
    last_loss: float = float("nan")
    tokens_seen: int = 0            # trained by this launch
    tokens_before: int = 0          # trained before a resume (the checkpoint's count)
    train_seconds: float = 0.0      # in training steps only (evaluations and checkpoints left out): tokens/s
    step_started: float = 0.0
    progress: Any = None
    bar: Any = None
    t0: float = 0.0
    stopper: EarlyStopper | None = None  # train.early_stop
    stopped: bool = False           # the early-stop rule was met (a resumed run: it had been)
    scores: dict | None = None      # the last periodic evaluation, per split
    model_files: dict = field(default_factory=dict)  # written into every checkpoint: what transformers reads

    @classmethod
    def prepare(cls, recipe, cfg, ctx: DistContext, rows: int, device: str, run_dir: Path | None) -> "_Run":
        """Loggers checked, model and optimizer built, resumed from the run's checkpoint if it has one."""
        loggers = Loggers(_build_loggers(cfg, run_dir) if ctx.is_main else [])
        torch.manual_seed(cfg.seed)
        task = build_task(recipe)
        check_step_fits(recipe, task, rows, device)
        model = build_model_for(recipe, task).to(device)
        probe_failed_plugins(model, lambda: task.batch("train", 1, _step_generator(cfg.seed, 0)))
        freeze(model, cfg.frozen)
        optimizer = adamw(param_groups(model, cfg.weight_decay, cfg.no_weight_decay), cfg.lr, cfg.betas)
        log = MetricsLog(run_dir / METRICS if run_dir and ctx.is_main else None)
        forward = model
        if ctx.distributed:
            forward = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
            forward.register_comm_hook(None, sum_hook)
        run = cls(recipe, cfg, ctx, rows, device, run_dir, task, model, forward, optimizer, log, loggers)
        found = find_checkpoint(run_dir / CHECKPOINT) if run_dir is not None else None
        run.stopper = EarlyStopper(cfg.early_stop)
        if found is not None:
            run.start, run.stopped, run.tokens_before = _resume(found, recipe, model, optimizer, run.stopper, device,
                                                                log, ctx.world, task)
            if run.tokens_before is None:  # a checkpoint written before it carried the count
                run.tokens_before = _logged_tokens(run_dir / METRICS, run.start)["tokens"]
        else:  # lines of a run killed before its first checkpoint: trained again from step 0, logged once
            log.restart()
        if run_dir is not None and ctx.is_main:
            write_task_files(task, run_dir)
            run.model_files = model_files(recipe, model, getattr(task, "tokenizer", None))
        run.safe = run.saved = run.start
        ctx.barrier()  # rank 0 has truncated metrics.jsonl before anyone goes on
        # listed once: model.parameters() walks every submodule each time
        run.parameters = list(model.parameters())
        return run

    @contextlib.contextmanager
    def reporting(self, progress, description: str):
        """The progress bar and the loggers for the block; the loggers are closed with how it ended."""
        if self.loggers:
            self.loggers.open(RunInfo.for_run(self.run_dir, self.recipe.model_dump(mode="json"), self.start))
        self.progress = progress
        self.bar = progress.add_task(description, total=self.cfg.steps, completed=self.start, info="") if progress else None
        self.model.train()
        self.t0 = time.perf_counter()
        status = "failed"
        try:
            yield
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.loggers.close(status)

    def write(self, record: dict) -> None:
        self.log.write(record)
        self.loggers.write(record)

    def loss_and_gradients(self, step: int):
        """Set the step's learning rate, draw its batch, and leave the clipped gradients of its loss in
        the parameters; a loss that is not finite stops the run. Returns (loss, batch)."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
        self.step_started = time.perf_counter()
        batch = self.task.train_batch(step, cfg.batch_size, cfg.seed, _step_generator(cfg.seed, step)).to(self.device)
        plain = not self.ctx.distributed and cfg.micro_batches == 1  # the plain loop: mean loss of the whole batch
        if plain:
            with _autocast(self.device, cfg.precision):
                logits, _ = self.model(batch.tokens, **batch.model_inputs())
            loss = self.task.loss(logits.float(), batch)
        else:
            self.optimizer.zero_grad(set_to_none=True)
            loss = _accumulate(self.forward, self.task, batch, self.rows, cfg, self.ctx, self.device)
        if not torch.isfinite(loss):  # the same value on every rank: they all stop here
            self.diverged(step + 1, loss.item())
        if plain:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, cfg.grad_clip)
        return loss, batch

    def diverged(self, step: int, loss: float):
        good = find_checkpoint(self.run_dir / CHECKPOINT) if self.run_dir else None
        where = f"; the last good checkpoint is {good}" if good else ""
        self.log.write({"step": step, "event": "diverged", "loss": str(loss)})
        raise TrainingDiverged(f"training diverged at step {step}: loss is {loss}{where} "
                               "(try a lower train.lr, grad_clip, or bf16 -> fp32)")

    def record(self, done: int, loss: float, tokens: int) -> None:
        """After optimiser step ``done``: its metrics, a periodic evaluation, a checkpoint, the progress bar."""
        cfg = self.cfg
        self.last_loss = loss
        self.tokens_seen += tokens
        self.train_seconds += time.perf_counter() - self.step_started
        if done % cfg.log_every == 0 or done == cfg.steps:
            self.write({"step": done, "split": "train", "loss": loss, "lr": self.optimizer.param_groups[0]["lr"],
                        "tokens": self.tokens_before + self.tokens_seen, "tokens_per_second": self.tokens_per_second()})
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            self.scores = {split: self.evaluate(split) for split in cfg.eval_splits}
            for split, metrics in self.scores.items():
                self.write({"step": done, "split": split, **metrics})
            self.stopped = self.stopper.reached(self.scores)  # every rank sees the same scores: all stop together
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            self.checkpoint(done)
        if self.bar is not None:
            rate = self.tokens_seen / max(time.perf_counter() - self.t0, 1e-9)
            self.progress.update(self.bar, completed=done, info=f"loss {loss:.3f}  {rate:,.0f} tok/s")

    def tokens_per_second(self) -> float:
        """Training tokens per second of this process's steps so far (evaluations and checkpoints left out)."""
        return round(self.tokens_seen / max(self.train_seconds, 1e-9), 1)

    def evaluate(self, split: str) -> dict[str, float]:
        return evaluate(self.model, self.task, split, device=self.device, precision=self.cfg.precision, ctx=self.ctx)

    def checkpoint(self, step: int, **state) -> None:
        if self.run_dir is not None and self.ctx.is_main:
            try:
                save_checkpoint(self.run_dir / CHECKPOINT, self.recipe, self.model,
                                optimizer=self.optimizer.state_dict(), files=self.model_files, step=step,
                                train_tokens=self.tokens_before + self.tokens_seen,
                                **between_steps(self.stopper, self.device, self.recipe), **task_state(self.task),
                                **cli_command(), **state)
            except OSError as err:  # a full disk: the save wrote into a temporary directory, now removed
                kept = f"the checkpoint of step {self.saved} is kept" if self.saved else "no checkpoint was written yet"
                raise WriteError.of(self.run_dir / CHECKPOINT, err, kept) from None
            self.saved = step

    def save_interrupted(self) -> None:
        if self.run_dir is not None and self.ctx.is_main and self.safe is not None and self.safe > self.saved:
            self.checkpoint(self.safe)
            self.log.write({"step": self.safe, "event": "interrupted"})

    def finish(self) -> dict:
        """The final evaluation on every split, the final checkpoint; the run's result."""
        cfg = self.cfg
        done = self.safe if self.stopped else cfg.steps
        if self.stopped:  # evaluated and logged at the step it stopped
            final = self.scores
        else:
            final = {split: self.evaluate(split) for split in cfg.eval_splits}
            for split, metrics in final.items():
                self.write({"step": done, "split": split, **metrics})
        self.checkpoint(done, **({"stopped_early": True} if self.stopped else {}))
        if self.bar is not None:
            self.progress.remove_task(self.bar)
        check_finite(final, done)
        result = _result(done, self.stopped, self.last_loss, final, self.model, self.ctx)
        if self.tokens_seen:  # this launch trained: its speed (a resumed run: since the resume)
            result.update(train_tokens=self.tokens_before + self.tokens_seen, tokens_per_second=self.tokens_per_second())
        return result


def write_task_files(task: Task, run_dir: Path) -> None:
    """A task's files for the run directory (text_lm: tokenizer.json), written atomically."""
    for name, text in getattr(task, "run_files", dict)().items():
        atomic_write(run_dir / name, lambda f, text=text: f.write(text.encode()))


def cli_command() -> dict:
    """``{"command": "xlstm-zoo train ..."}`` when this process is the xlstm-zoo command (the model card
    shows it), else nothing: a Python caller's command line says nothing about the run."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if Path(sys.argv[0]).name == "xlstm-zoo" or getattr(main, "name", "") == "xlstm_zoo.__main__":
        return {"command": shlex.join(["xlstm-zoo", *sys.argv[1:]])}
    return {}


def task_state(task: Task) -> dict:
    """What a task adds to every checkpoint's state.json (text_lm: its tokenizer)."""
    return getattr(task, "checkpoint_state", dict)()


def _build_loggers(cfg, run_dir: Path | None) -> list:
    """``train.report_to``'s loggers (a missing package is an error now, before any training)."""
    if cfg.report_to and run_dir is None:
        raise ConfigError("train.report_to needs a run directory for the loggers' files and run ids: "
                          "give --out (or drop --report-to)", path="train.report_to")
    return build_loggers(cfg.report_to)


def _accumulate(forward, task: Task, batch, rows: int, cfg, ctx: DistContext, device: str) -> torch.Tensor:
    """Backward over this process's rows in ``micro_batches`` parts, each loss a *sum* divided by
    the global batch's number of scored positions, so the gradients (added up over parts here and
    over ranks by :func:`sum_hook`) are those of the global mean loss. Returns that mean loss (the
    same on every rank)."""
    scored = (batch.targets != IGNORE).sum()
    mine = batch.rows(ctx.rank * rows * cfg.micro_batches, (ctx.rank + 1) * rows * cfg.micro_batches)
    total = torch.zeros((), device=device)
    for m in range(cfg.micro_batches):
        part = mine.rows(m * rows, (m + 1) * rows)
        last = m == cfg.micro_batches - 1
        sync = forward.no_sync() if ctx.distributed and not last else contextlib.nullcontext()
        with sync:
            with _autocast(device, cfg.precision):
                logits, _ = forward(part.tokens, **part.model_inputs())
            part_sum = task.loss_sum(logits.float(), part)
            (part_sum / scored).backward()
        total = total + part_sum.detach()
    return all_reduce_sum(total, ctx) / scored


def _resume(path: Path, recipe, model, optimizer, stopper: EarlyStopper, device: str, log: MetricsLog,
            world: int = 1, task: Task | None = None) -> tuple[int, bool, int | None]:
    """Load the checkpoint at ``path`` into ``model``, ``optimizer``, ``stopper`` (its streak) and the random
    generators (a task with checkpoint state checks it first: e.g. its tokenizer); returns its step, whether
    the run had stopped early and the tokens trained up to it (None: a checkpoint without the count).
    Everything is checked before metrics.jsonl is cut back to that step (or, for a finished or early-stopped
    run, left as it is)."""
    if task is not None and hasattr(task, "check_checkpoint_state") and path.is_dir():
        task.check_checkpoint_state(read_state(path), path)  # e.g. another tokenizer: refused before the weights are read
    saved_recipe, saved_model, extra = load_checkpoint(path)
    if meaning(saved_recipe) != meaning(recipe):
        raise ConfigError(f"{path} was written by a different recipe; move it away to start afresh "
                          "(grids keep each configuration in its own directory, so this means a manual copy)")
    step = _checked_step(path, extra, recipe.train.steps)
    check_implementations(extra, recipe, path)
    restore_between_steps(extra, stopper, device, path / STATE if path.is_dir() else path)
    model.load_state_dict(saved_model.state_dict())
    optimizer.load_state_dict(extra["optimizer"])
    stopped = extra.get("stopped_early") is True
    if step < recipe.train.steps and not stopped:
        log.truncate_after(step)
        log.write({"step": step, "event": "resumed", **({"world_size": world} if world > 1 else {})})
    tokens = extra.get("train_tokens")
    return step, stopped, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def _checked_step(path: Path, extra: dict, steps: int) -> int:
    """The step a checkpoint resumes from; a checkpoint that cannot be resumed exactly is refused,
    before anything is changed (its metrics history is kept)."""
    where = path / STATE if path.is_dir() else path
    step = extra.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= steps:
        got = "no step" if step is None else f"step {step!r}"
        raise ConfigError(f"{where}: {got}; a checkpoint of this recipe has a whole-number step from 0 to "
                          f"train.steps={steps} (move the checkpoint away to start afresh; metrics.jsonl is kept)")
    if "optimizer" not in extra:
        raise ConfigError(f"{path}: no optimizer state; resuming without it would not continue the same training "
                          "(move the checkpoint away to start afresh; metrics.jsonl is kept)")
    return step


def _finished_result(run_dir: Path, cfg, model, task: Task, device: str, ctx: DistContext, step: int,
                     stopped: bool) -> dict:
    """The result of a run that had already finished (at ``step``; early when ``stopped``): its final metrics
    evaluated again from the saved weights (nothing logged), its last training loss read from metrics.jsonl
    (None if gone)."""
    final = {split: evaluate(model, task, split, device=device, precision=cfg.precision, ctx=ctx)
             for split in cfg.eval_splits}
    check_finite(final, step)
    losses = [r["loss"] for r in read_metrics(run_dir / METRICS)
              if r.get("split") == "train" and r.get("step", 0) <= step and "loss" in r]
    result = _result(step, stopped, losses[-1] if losses else None, final, model, ctx)
    logged = _logged_tokens(run_dir / METRICS, step)
    if logged["tokens"]:  # as the run reported them when it finished
        result.update(train_tokens=logged["tokens"], tokens_per_second=logged["tokens_per_second"])
    return result


def _logged_tokens(path: Path, step: int) -> dict:
    """The last training record's token count and speed at or before ``step`` (0 where none logged them)."""
    last = [r for r in read_metrics(path) if r.get("split") == "train" and r.get("step", 0) <= step and "tokens" in r]
    return {"tokens": last[-1]["tokens"], "tokens_per_second": last[-1].get("tokens_per_second")} if last else \
        {"tokens": 0, "tokens_per_second": None}


def _result(step: int, stopped: bool, last_loss, metrics: dict, model, ctx: DistContext) -> dict:
    """What a training run returns (and the grid records): where it ended, its last training loss, the
    final metrics per split."""
    return {"steps": step, **({"stopped_early": True} if stopped else {}), "final_train_loss": last_loss,
            "metrics": metrics, **parameter_counts(model), "world_size": ctx.world}
