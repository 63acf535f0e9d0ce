"""``xlstm-zoo recipes``, ``build`` and ``demo``: the shipped recipes, one built, all of them run."""

from __future__ import annotations

import platform
import sys
import time

import torch
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Column

from xlstm_zoo.commands.output import console, show, table
from xlstm_zoo.initialization import count_blocks, describe as describe_init
from xlstm_zoo.recipe_loader import build, load_recipe, shipped_recipes
from xlstm_zoo.registry import Command

RECIPE_HELP = "a recipe file or a shipped recipe name (see `xlstm-zoo recipes`)"


def _build_arguments(parser) -> None:
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field, e.g. --set model.stack.num_blocks=4 (repeatable)")
    parser.add_argument("--dump", action="store_true", help="print the fully resolved recipe as YAML")


def _demo_arguments(parser) -> None:
    parser.add_argument("--tokens", type=int, default=16, help="tokens to generate per recipe (default 16)")
    parser.add_argument("--seq-len", type=int, default=64, help="forward-pass length (default 64)")


def _no_arguments(parser) -> None:
    pass


def cmd_build(args) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    model = build(recipe)
    if args.dump:  # plain stdout, so `--dump > r.yaml` gives a loadable file; the table goes to stderr
        sys.stdout.write(yaml.safe_dump(recipe.model_dump(), sort_keys=False))
    print_summary(recipe, model, Console(stderr=True) if args.dump else console)
    return 0


def print_summary(recipe, model, out: Console = console) -> None:
    stack = model.stack
    rows = table("block", "type", "cell", "heads", "params", title=f"{recipe.name or 'recipe'}: {recipe.model.type}")
    for i, (block, kind) in enumerate(zip(stack.blocks, stack.block_types)):
        cell = getattr(block, "cell", None)
        rows.add_row(str(i), kind, type(cell).__name__ if cell is not None else "-",
                     str(getattr(cell, "num_heads", "-")), f"{_count(block):,}")
    block_params = sum(_count(b) for b in stack.blocks)
    rows.add_row("", "other", "embedding, head, norms", "", f"{_count(model) - block_params:,}")
    rows.add_row("", "[bold]total", "", "", f"[bold]{_count(model):,}")
    show(rows, out)
    init = getattr(recipe.model, "init", None)
    if init is not None:
        rules = describe_init(model, init, dim=recipe.model.dim, num_blocks=count_blocks(stack),
                              tied=getattr(recipe.model, "tie_weights", False))
        out.print(f"init (scheme {init.scheme}): " + "; ".join(f"{role} {rule}" for role, rule in rules.items())
                  + "; biases, norms and skips as their components set them")


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def cmd_recipes(args) -> int:
    rows = table("recipe", "description")
    for name in shipped_recipes():
        rows.add_row(name, load_recipe(name).description)
    show(rows)
    return 0


def cmd_demo(args) -> int:
    """The main job until training lands: every shipped model recipe built and run on this machine."""
    names = [n for n in shipped_recipes() if n.startswith("models/")]
    rows = table(Column("recipe", no_wrap=True), Column("params", no_wrap=True, justify="right"),
                  f"forward T={args.seq_len} (ms)", "step == forward (max abs diff)",
                  f"generate {args.tokens} (tok/s)", "sample (bytes)", title="xlstm-zoo demo: shipped model recipes on " + _device_name())
    torch.manual_seed(0)
    failures = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("building and running recipes", total=len(names))
        for name in names:
            progress.update(task, description=f"running {name}")
            recipe = load_recipe(name)
            model = build(recipe).eval()
            vocab = recipe.model.vocab_size
            tokens = torch.randint(0, vocab, (2, args.seq_len))
            with torch.no_grad():
                start = time.perf_counter()
                logits, _ = model(tokens)
                forward_ms = 1000 * (time.perf_counter() - start)
                diff = _step_vs_forward(model, tokens[:, :16], logits[:, :16])
                start = time.perf_counter()
                out = model.generate(tokens[:, :8], args.tokens, greedy=True)
                tok_s = 2 * args.tokens / (time.perf_counter() - start)
            ok = torch.isfinite(logits).all().item() and diff < 1e-3
            failures += not ok
            sample = bytes(out[0, 8:].tolist()).decode("latin-1") if vocab <= 256 else str(out[0, 8:].tolist())
            rows.add_row(name, f"{_count(model):,}", f"{forward_ms:.1f}",
                         f"{diff:.1e}" + ("" if ok else " [red]FAIL"), f"{tok_s:.0f}", repr(sample)[:24])
            progress.advance(task)
    show(rows)
    console.print("(untrained weights: samples are random bytes; this checks that every recipe builds, runs and "
                  "that stepwise generation matches the parallel forward pass)")
    return 1 if failures else 0


def _step_vs_forward(model, tokens, logits) -> float:
    state, diffs = model.init_state(tokens.shape[0]), []
    for t in range(tokens.shape[1]):
        step_logits, state = model.step(tokens[:, t], state)
        diffs.append((step_logits - logits[:, t]).abs().max().item())
    return max(diffs)


def _device_name() -> str:
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


COMMANDS = (
    Command("build", "build a recipe and print a per-block summary with parameter counts", _build_arguments, cmd_build),
    Command("recipes", "list the shipped recipes", _no_arguments, cmd_recipes),
    Command("demo", "build every shipped model recipe, run a forward pass and generate tokens", _demo_arguments,
            cmd_demo),
)
