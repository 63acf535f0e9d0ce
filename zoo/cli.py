"""The ``xlstm-zoo`` command line.

Configuration mistakes print one line naming the file, the field path and what is allowed, and
exit with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from xlstm_zoo.errors import ZooError
from xlstm_zoo.initialization import count_blocks, describe as describe_init

console = Console()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from xlstm_zoo.allocator import keep_freed_memory

    keep_freed_memory()  # fewer page faults on repeated large CPU buffers; XLSTM_ZOO_MALLOC=default opts out
    try:
        from xlstm_zoo.plugins.cli import apply_options

        apply_options(args)  # strict mode and --plugin modules, before any registry access
        return args.run(args) or 0
    except ZooError as err:
        if args.debug:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xlstm-zoo", description="Compose, build and run xLSTM-family models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="load a plugin module, e.g. a local my_cells.py (repeatable; also XLSTM_ZOO_PLUGINS=mod1,mod2)")
    p.add_argument("--strict-plugins", action="store_true",
                   help="turn every plugin warning into an error (also XLSTM_ZOO_STRICT_PLUGINS=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("list", help="list registered components (wildcards allowed)")
    c.add_argument("kind", nargs="?", help="cell, gate, norm, block, stack, model, backend, ...")
    c.add_argument("pattern", nargs="?", help="shell-style wildcard on the name, e.g. 'm*'")
    c.set_defaults(run=cmd_list)

    c = sub.add_parser("show", help="show a component's config fields, types, defaults and description")
    c.add_argument("kind")
    c.add_argument("name")
    c.set_defaults(run=cmd_show)

    c = sub.add_parser("build", help="build a recipe and print a per-block summary with parameter counts")
    c.add_argument("recipe", help="a recipe file or a shipped recipe name (see `xlstm-zoo recipes`)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a field, e.g. --set model.stack.num_blocks=4 (repeatable)")
    c.add_argument("--dump", action="store_true", help="print the fully resolved recipe as YAML")
    c.set_defaults(run=cmd_build)

    c = sub.add_parser("schema", help="print the recipe JSON Schema (for editor completion)")
    c.set_defaults(run=cmd_schema)

    c = sub.add_parser("recipes", help="list the shipped recipes")
    c.set_defaults(run=cmd_recipes)

    c = sub.add_parser("demo", help="build every shipped model recipe, run a forward pass and generate tokens")
    c.add_argument("--tokens", type=int, default=16, help="tokens to generate per recipe (default 16)")
    c.add_argument("--seq-len", type=int, default=64, help="forward-pass length (default 64)")
    c.set_defaults(run=cmd_demo)

    from xlstm_zoo.grid.commands import add_commands

    add_commands(sub)  # train, grid, report
    from xlstm_zoo.bench.commands import add_commands as add_bench_commands

    add_bench_commands(sub)  # bench

    from xlstm_zoo.plugins.cli import cmd_plugins

    c = sub.add_parser("plugins", help="list plugins (core included): distribution, version, status, what each registered")
    c.add_argument("--check", action="store_true",
                   help="also run xlstm_zoo.testing's conformance checks on every third-party component (exit 1 on failure)")
    c.set_defaults(run=cmd_plugins)

    c = sub.add_parser("doctor", help="this machine's GPU/Triton/nvcc, every backend's availability and why, "
                                      "and which backend each op uses")
    c.set_defaults(run=cmd_doctor)

    from xlstm_zoo.export.cli import add_parser as add_export_parser

    add_export_parser(sub)  # export (ONNX / TensorRT step models)
    return p


def cmd_doctor(args) -> int:
    from xlstm_zoo.backends import doctor
    from xlstm_zoo.registry import registry

    machine = Table("item", "value", title="This machine", title_justify="left", show_header=False)
    for item, value in doctor.machine_facts():
        machine.add_row(item, escape(value))
    console.print(machine)

    names = sorted(registry.names("backend"), key=lambda n: -registry.instance("backend", n).priority)
    backends = Table("backend", "priority", "status", "source", title="Backends (highest priority first)",
                     title_justify="left")
    for name in names:
        backend = registry.instance("backend", name)
        try:
            reason = backend.unavailable_reason()
        except Exception as err:  # a broken plugin backend is reported, not fatal
            reason = f"its availability check raised {type(err).__name__}: {err}"
        status = "[green]available[/]" if reason is None else f"[red]unavailable:[/] {escape(reason)}"
        backends.add_row(name, str(backend.priority), status, registry.get("backend", name).source)
    console.print(backends)

    for device, dtype in doctor.targets():
        rows = doctor.op_choices(device, dtype)
        table = Table("op", "uses", *names, title=f"Ops on {device.type} ({str(dtype).removeprefix('torch.')})",
                      title_justify="left")
        for row in rows:
            cells = [_doctor_cell(row.statuses[n], row.op in registry.instance("backend", n).ops) for n in names]
            table.add_row(row.op, f"[bold]{escape(row.uses)}[/]", *cells)
        console.print(table)
    console.print("Force a backend with a cell's [bold]backend:[/] field or XLSTM_ZOO_BACKEND=name.")
    return 0


def _doctor_cell(status: str, has_kernel: bool) -> str:
    """Short form of a dispatcher status (why a backend is unavailable is in the Backends table)."""
    if status == "ok":
        return "[green]ok[/]"
    if not has_kernel:
        return "[dim]no kernel[/]"
    if status.startswith("does not support"):
        return "[yellow]unsupported here[/]"
    return "[red]unavailable[/]"


def cmd_list(args) -> int:
    from xlstm_zoo.registry import registry

    found = registry.find(args.kind, args.pattern)
    table = Table("kind", "name", "description", "from")
    for c in found:
        table.add_row(c.kind, c.name, escape(c.description), c.source)
    console.print(table)
    if not found:
        console.print(f"no components match {args.pattern!r}" if args.pattern else "no components")
        return 1
    return 0


def cmd_show(args) -> int:
    from xlstm_zoo.registry import registry

    entry = registry.get(args.kind, args.name)
    console.print(f"[bold]{entry.kind} {entry.name}[/] ({escape(entry.source)}): {escape(entry.description)}")
    table = Table("field", "type", "default", "description")
    for name, field in entry.config.model_fields.items():
        if name == "type":
            continue
        table.add_row(name, escape(_type_name(field)), escape(_default(field)), escape(field.description or ""))
    console.print(table)
    return 0


def _type_name(field) -> str:
    from xlstm_zoo.config import _ComponentField

    for meta in field.metadata:
        if isinstance(meta, _ComponentField):
            return f"{meta.kind} (any registered)"
    text = repr(field.annotation)
    for noise in ("typing.", "xlstm_zoo.", "<class '", "'>"):
        text = text.replace(noise, "")
    return text


def _default(field) -> str:
    import yaml
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    value = field.default_factory() if field.default_factory else field.default
    if value is PydanticUndefined:
        return "(required)"
    if isinstance(value, BaseModel):
        return yaml.safe_dump(value.model_dump(), default_flow_style=True, width=10**6, sort_keys=False).strip()
    return repr(value)


def cmd_build(args) -> int:
    import yaml

    from xlstm_zoo.recipe import build, load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    model = build(recipe)
    if args.dump:  # plain stdout, so `--dump > r.yaml` gives a loadable file; the table goes to stderr
        sys.stdout.write(yaml.safe_dump(recipe.model_dump(), sort_keys=False))
    print_summary(recipe, model, Console(stderr=True) if args.dump else console)
    return 0


def print_summary(recipe, model, out: Console = console) -> None:
    stack = model.stack
    table = Table("block", "type", "cell", "heads", "params", title=f"{recipe.name or 'recipe'}: {recipe.model.type}")
    for i, (block, kind) in enumerate(zip(stack.blocks, stack.block_types)):
        cell = getattr(block, "cell", None)
        table.add_row(str(i), kind, type(cell).__name__ if cell is not None else "-",
                      str(getattr(cell, "num_heads", "-")), f"{_count(block):,}")
    block_params = sum(_count(b) for b in stack.blocks)
    table.add_row("", "other", "embedding, head, norms", "", f"{_count(model) - block_params:,}")
    table.add_row("", "[bold]total", "", "", f"[bold]{_count(model):,}")
    out.print(table)
    init = getattr(recipe.model, "init", None)
    if init is not None:
        rules = describe_init(model, init, dim=recipe.model.dim, num_blocks=count_blocks(stack),
                              tied=getattr(recipe.model, "tie_weights", False))
        out.print(f"init (scheme {init.scheme}): " + "; ".join(f"{role} {rule}" for role, rule in rules.items())
                  + "; biases, norms and skips as their components set them")


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def cmd_schema(args) -> int:
    from xlstm_zoo.recipe import Recipe

    print(json.dumps(Recipe.model_json_schema(), indent=2))
    return 0


def cmd_recipes(args) -> int:
    from xlstm_zoo.recipe import load_recipe, shipped_recipes

    table = Table("recipe", "description")
    for name in shipped_recipes():
        table.add_row(name, load_recipe(name).description)
    console.print(table)
    return 0


def cmd_demo(args) -> int:
    """The main job until training lands: every shipped model recipe built and run on this machine."""
    import torch
    from rich.progress import Progress

    from xlstm_zoo.recipe import build, load_recipe, shipped_recipes

    names = [n for n in shipped_recipes() if n.startswith("models/")]
    table = Table(Column("recipe", no_wrap=True), Column("params", no_wrap=True, justify="right"),
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
            table.add_row(name, f"{_count(model):,}", f"{forward_ms:.1f}",
                          f"{diff:.1e}" + ("" if ok else " [red]FAIL"), f"{tok_s:.0f}", repr(sample)[:24])
            progress.advance(task)
    console.print(table)
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
    import platform

    import torch

    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"


if __name__ == "__main__":
    sys.exit(main())
