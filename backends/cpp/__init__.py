"""The ``cpp`` backend: the sLSTM and LSTM time loops and the mLSTM chunkwise form's per-chunk steps, forward
and backward, and for generation the mLSTM step and a step's linear maps (:mod:`.linear`), compiled from
C++ for the CPU (see :mod:`.build`).

The fused PyTorch loops spend most of their time dispatching ~13 (forward) and ~17 (backward) small ops
per token from Python; the C++ loops run the whole recurrence per (head, batch) row with no dispatch at
all, the gate maths vectorised where glibc's vector maths library is there. Nothing is compiled at import:
the first availability check builds the library (a few seconds; cached per machine). Without a compiler
the backend is unavailable; a failed build warns once (:class:`CppBuildWarning`) and sLSTM and LSTM on
the CPU use the fused loops. The mLSTM chunk core (:mod:`.mlstm`) keeps each (batch-head, chunk) block's
[L, L] matrices in cache where the PyTorch core streams them through memory once per op.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import CppBuildWarning, unavailable_reason
from xlstm_zoo.backends.cpp import (block_diagonal, block_step, causal_conv, gated_activation, head_norm_gate, linear, rms_norm,
                                    selective_scan, soft_cap)
from xlstm_zoo.backends.cpp.lstm import PROJECTED_KERNEL, lstm_sequence
from xlstm_zoo.backends.cpp.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.cpp.rwkv import KERNELS as RWKV_KERNELS
from xlstm_zoo.backends.cpp.slstm import slstm_sequence
from xlstm_zoo.backends.kernel import FLOAT_DTYPES, Kernel, declare_backend

__all__ = ["CppBuildWarning", "KERNELS", "cpp_backend"]

MLSTM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64 (gradcheck) stays on the reference

KERNELS = (
    Kernel("mlstm", "chunkwise", "cpp", mlstm_sequence, devices=("cpu",), dtypes=MLSTM_DTYPES, doc_starts=True,
           notes="float32 with a (batch, head) row per thread, or packed rows: the whole form in C++, one thread "
                 "per row, forward and backward; else the per-chunk steps in C++, computed in float32"),
    Kernel("mlstm", "step", "cpp", mlstm_step, devices=("cpu",), dtypes=(torch.float32,),
           notes="one fused pass per (batch, head) row; with autograd the reference step"),
    Kernel("slstm", "sequence", "cpp", slstm_sequence, devices=("cpu",), dtypes=FLOAT_DTYPES, doc_starts=True,
           notes="C++ forward and backward loops; halves compute in float32"),
    Kernel("lstm", "sequence", "cpp", lstm_sequence, devices=("cpu",), dtypes=FLOAT_DTYPES, doc_starts=True,
           notes="C++ forward and backward loops; halves compute in float32"),
    PROJECTED_KERNEL,
    linear.KERNEL,
    rms_norm.KERNEL, *head_norm_gate.KERNELS, soft_cap.KERNEL, *gated_activation.KERNELS, causal_conv.KERNEL,
    block_diagonal.KERNEL, block_step.KERNEL, *selective_scan.KERNELS,
    *RWKV_KERNELS,
)


cpp_backend = declare_backend(
    "cpp", priority=15, kernels=KERNELS, availability=unavailable_reason,
    description="sLSTM and LSTM loops and the mLSTM chunkwise form, forward and backward, the generation step's "
                "mLSTM update and linear maps, and the layers' passes (norms, gates, conv), compiled from C++ for "
                "the CPU, and Mamba's selective scan (built on first use)")
