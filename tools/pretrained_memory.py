"""Peak memory of ``from_pretrained`` per dtype (the numbers in docs/pretrained.md).

    python tools/pretrained_memory.py DIR    # writes a random fp32 HF-layout checkpoint into DIR
                                             # (0.61 B parameters, 2.3 GiB), then loads it per dtype

Each load runs in a fresh process; peak RSS is ``ru_maxrss``.
"""

import json
import subprocess
import sys
from pathlib import Path

LOAD = """
import resource, sys, torch, xlstm_zoo
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
model = xlstm_zoo.from_pretrained(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{sys.argv[2]}: weights {size:.2f} GiB, peak RSS {peak:.2f} GiB ({base:.2f} GiB before loading)")
"""


def make(directory: Path, dim=2048, blocks=8, heads=4, vocab=50304, ffn=5504) -> None:
    import safetensors.torch
    import torch
    directory.mkdir(parents=True, exist_ok=True)
    r = lambda *shape: torch.randn(*shape) * 0.02  # noqa: E731
    t = {"backbone.embeddings.weight": torch.randn(vocab, dim), "backbone.out_norm.weight": torch.ones(dim),
         "lm_head.weight": r(vocab, dim)}
    for i in range(blocks):
        b = f"backbone.blocks.{i}."
        m = b + "mlstm_layer."
        t.update({b + "norm_mlstm.weight": torch.ones(dim), m + "q.weight": r(dim // 2, dim), m + "k.weight": r(dim // 2, dim),
                  m + "v.weight": r(dim, dim), m + "ogate_preact.weight": r(dim, dim),
                  m + "igate_preact.weight": r(heads, dim), m + "igate_preact.bias": torch.zeros(heads),
                  m + "fgate_preact.weight": r(heads, dim), m + "fgate_preact.bias": torch.full((heads,), 3.0),
                  m + "multihead_norm.weight": torch.ones(dim), m + "out_proj.weight": r(dim, dim),
                  b + "norm_ffn.weight": torch.ones(dim), b + "ffn.proj_up_gate.weight": r(ffn, dim),
                  b + "ffn.proj_up.weight": r(ffn, dim), b + "ffn.proj_down.weight": r(dim, ffn)})
    safetensors.torch.save_file(t, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "xlstm", "embedding_dim": dim, "num_blocks": blocks, "num_heads": heads, "vocab_size": vocab,
        "qk_dim_factor": 0.5, "norm_eps": 1e-6, "eps": 1e-6, "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0}))


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if not (target / "model.safetensors").is_file():
        make(target)
    for dtype in ("bfloat16", "float32"):
        subprocess.run([sys.executable, "-c", LOAD, str(target), dtype], check=True)
