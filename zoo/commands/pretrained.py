"""``xlstm-zoo convert`` and ``xlstm-zoo generate``: official checkpoints to xlstm-zoo models, and text from them.

    xlstm-zoo convert SRC --out DIR [--to zoo|hf] [--from auto|hf|xlstm_large|neurips|zoo]
                      [--config FILE] [--dtype keep|float32|bfloat16|float16] [--check [--tokens N]] [--dry-run]
    xlstm-zoo generate DIR --prompt TEXT [--max-new-tokens N] [--greedy | --temperature T --top-k K]
                       [--dtype ...] [--bos | --no-bos] [--seed N]

``convert`` detects the layout (docs/pretrained.md), maps every tensor strictly and writes ``DIR``
(``--to zoo``: recipe.yaml + model.safetensors + convert.json; ``--to hf``: a directory
``transformers`` loads). ``--dry-run`` prints the mapping table and writes nothing. ``--check`` runs
the official implementation (the ``xlstm`` package) on the same weights and prints the largest
logit difference; the source's tokenizer and model card (README.md) go with the weights. ``generate`` uses
the tokenizer saved with DIR (its ``tokenizer.json``; a run's ``checkpoint/``: the run's), for a BPE or
Hugging Face one through the ``tokenizers`` package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from rich.markup import escape

from xlstm_zoo.checkpoint import atomic_write, json_text
from xlstm_zoo.commands.output import console, show, table
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.model_files.files import carry
from xlstm_zoo.models.tokens import check_generation
from xlstm_zoo.pretrained import PROVENANCE, from_pretrained, plan, save_pretrained
from xlstm_zoo.pretrained.check import max_logit_difference, require
from xlstm_zoo.registry import Command
from xlstm_zoo.tasks.tokenizer import saved_tokenizer

DTYPES = {"keep": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str):
    if name not in DTYPES:
        raise ConfigError(f"unknown --dtype {name!r} (allowed: {', '.join(DTYPES)})")
    return DTYPES[name]


def _convert_arguments(c) -> None:
    c.add_argument("source", metavar="SRC", help="a checkpoint directory (HF, xlstm_large, xlstm-zoo) or a NeurIPS "
                                                 "state dict file (.safetensors, .pt)")
    c.add_argument("--out", metavar="DIR", help="output directory (required unless --dry-run)")
    c.add_argument("--to", default="zoo", choices=("zoo", "hf"), help="layout to write (default zoo)")
    c.add_argument("--from", dest="layout", default="auto", metavar="LAYOUT",
                   help="source layout: auto (default), hf, xlstm_large, neurips, zoo")
    c.add_argument("--config", metavar="FILE", help="a NeurIPS state dict's xLSTMLMModelConfig YAML")
    c.add_argument("--dtype", default="keep", metavar="DTYPE", help="keep (default), float32, bfloat16, float16")
    c.add_argument("--check", action="store_true", help="compare logits with the official implementation")
    c.add_argument("--tokens", type=int, default=64, metavar="N", help="tokens per row for --check (default 64)")
    c.add_argument("--dry-run", action="store_true", help="print the mapping table; write nothing")
    c.add_argument("--license", metavar="ID", help="the model card's licence field, e.g. apache-2.0 (--to zoo)")


def run_convert(args) -> int:
    dtype = _dtype(args.dtype)
    p = plan(args.source, layout=args.layout, config=args.config)
    params = sum(t.numel() for t in {id(t): t for t in p.model.parameters()}.values())
    console.print(f"[bold]{escape(str(args.source))}[/]: layout {p.opened.layout}, {len(p.rules)} tensors, "
                  f"{params:,} parameters -> {p.recipe.model.type} "
                  f"({len(p.recipe.model.stack.layout())} blocks, pattern {p.recipe.model.stack.layout()})",
                  highlight=False, soft_wrap=True)
    if args.dry_run:
        rows = table("source", "shape", "xlstm-zoo", "transform", title="mapping")
        for row in p.table():
            rows.add_row(*row)
        show(rows)
        return 0
    if not args.out:
        raise ConfigError("--out DIR is required (or --dry-run)")
    if args.check:
        require(p.opened)
    model = from_pretrained(args.source, dtype=dtype, layout=args.layout, config=args.config)
    files = save_pretrained(model, args.out, layout=args.to, license=args.license)
    files += [name for name in carry(args.source, args.out) if name not in files]
    kept = sorted(p.name for p in Path(args.out).iterdir() if p.name not in files)  # the user's, carried over
    console.print(f"wrote {escape(str(args.out))}: {', '.join(files)}" + (f" (kept: {escape(', '.join(kept))})"
                  if kept else ""), highlight=False, soft_wrap=True)
    if args.check:
        diff = max_logit_difference(model, p.opened, tokens=args.tokens)
        console.print(f"check: max |logit difference| vs the official implementation = {diff:.3g} "
                      f"(computed in fp32 from {args.dtype if dtype else 'the checkpoint'} weights, 2 x {args.tokens} "
                      "random tokens)", highlight=False, soft_wrap=True)
        provenance = Path(args.out) / PROVENANCE
        data = json.loads(provenance.read_text())
        data["check"] = {"max_abs_logit_difference": diff, "tokens": args.tokens}
        text = json_text(data) + "\n"
        atomic_write(provenance, lambda f: f.write(text.encode()))
        if not diff <= 1e-3:
            console.print("[bold red]check failed[/]: larger than 1e-3", highlight=False)
            return 1
    return 0


def _generate_arguments(c) -> None:
    c.add_argument("source", metavar="DIR", help="a checkpoint directory with tokenizer.json")
    c.add_argument("--prompt", required=True, help="the text to continue")
    c.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    c.add_argument("--greedy", action="store_true", help="always the most likely token (default: sample)")
    c.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature, finite and > 0 (default 1; for the most likely token use --greedy)")
    c.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens (K >= 1)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--dtype", default="keep", metavar="DTYPE", help="keep (default), float32, bfloat16, float16")
    c.add_argument("--compile", action="store_true",
                   help="run the per-token step under torch.compile (compiles for seconds first; faster per token "
                        "for small models, see docs/performance.md)")
    bos = c.add_mutually_exclusive_group()
    bos.add_argument("--bos", dest="bos", action="store_const", const=True, default=None,
                     help="put the BOS token first (default: as the checkpoint's config says)")
    bos.add_argument("--no-bos", dest="bos", action="store_const", const=False)


def run_generate(args) -> int:
    directory = Path(args.source)
    check_generation(args.max_new_tokens, args.temperature, args.top_k, args.greedy)  # before loading anything
    tokenizer = saved_tokenizer(directory)
    if tokenizer is None:
        raise ConfigError("no tokenizer saved here (tokenizer.json): generate works on checkpoints that ship one",
                          file=str(directory))
    model = from_pretrained(directory, dtype=_dtype(args.dtype))
    tokenizer.check_fits(model.embedding.num_embeddings, str(directory))
    info = _generation_info(model, directory)
    ids = [int(i) for i in tokenizer.encode_batch([args.prompt])[0]]
    bos = info.get("bos_token_id")
    if (args.bos if args.bos is not None else info.get("force_bos_token_insert", False)) and bos is not None:
        if not ids or ids[0] != bos:
            ids = [bos, *ids]
    if not ids:
        raise ConfigError("the prompt encodes to no tokens (give some text, or --bos)")
    eos = info.get("eos_token_id")
    generator = torch.Generator().manual_seed(args.seed)
    out, shown = [], tokenizer.decode(ids)
    sys.stdout.write(args.prompt)
    for token in model.stream(torch.tensor([ids]), args.max_new_tokens, greedy=args.greedy,
                              temperature=args.temperature, top_k=args.top_k, generator=generator,
                              compile=args.compile):
        if eos is not None and int(token) == eos:
            break
        out.append(int(token))
        text = tokenizer.decode(ids + out)  # decoded with the prompt, so spacing between tokens is right
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    return 0


def _generation_info(model, directory: Path) -> dict:
    """BOS/EOS ids and whether BOS goes first, from the checkpoint's configs (HF or converted)."""
    provenance = getattr(model, "provenance", {}) or {}
    if (directory / PROVENANCE).is_file():  # a converted directory keeps its source's configs here
        provenance = {**json.loads((directory / PROVENANCE).read_text()), **{k: v for k, v in provenance.items() if v}}
    info = {**provenance.get("source_config", {}), **provenance.get("generation", {})}
    if (directory / "generation_config.json").is_file():
        info.update(json.loads((directory / "generation_config.json").read_text()))
    return info


COMMANDS = (
    Command("convert", "convert an official xLSTM checkpoint (Hugging Face, xlstm_large, NeurIPS) to xlstm-zoo or HF",
            _convert_arguments, run_convert, description=__doc__),
    Command("generate", "generate text from a checkpoint directory that ships tokenizer.json (streaming)",
            _generate_arguments, run_generate, description=__doc__),
)
