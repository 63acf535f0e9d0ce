"""Kernels and backends, declared once.

A :class:`Kernel` is one implementation of one form of one op, named ``<op>.<form>--<impl>`` in the
style of ``mlstm_kernels`` (``mlstm.chunkwise--triton``, ``slstm.sequence--cuda``): the devices and
dtypes it accepts, the limits on its options, and the function that runs it. A :class:`Backend`
is a named, prioritised set of kernels plus an availability check. Everything that talks about
what a backend can do reads these declarations: :meth:`Backend.supports` (what the dispatcher
asks), ``xlstm-zoo doctor`` and the backend table in ``docs/backends.md``
(:func:`xlstm_zoo.backends.catalog.markdown_table`, checked by a test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

ANY_DEVICE: tuple[str, ...] = ()
ANY_DTYPE: tuple[torch.dtype, ...] = ()
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
GPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# The tensors each (op, form) takes and returns: the same for every implementation.
SHAPES = {
    ("mlstm", "chunkwise"): "q, k [B,H,T,Dk]; v [B,H,T,Dv]; i, f [B,H,T] -> h [B,H,T,Dv]; state (C, n, m)",
    ("mlstm", "parallel"): "q, k [B,H,T,Dk]; v [B,H,T,Dv]; i, f [B,H,T] -> h [B,H,T,Dv]; state (C, n, m)",
    ("mlstm", "recurrent"): "q, k [B,H,T,Dk]; v [B,H,T,Dv]; i, f [B,H,T] -> h [B,H,T,Dv]; state (C, n, m)",
    ("mlstm", "step"): "q, k [B,H,Dk]; v [B,H,Dv]; i, f [B,H] -> h [B,H,Dv]; state (C, n, m)",
    ("slstm", "sequence"): "wx [B,H,T,4Dh]; R [H,Dh,4Dh] -> h [B,H,T,Dh]; state (c, n, m, h)",
    ("slstm", "step"): "wx [B,H,4Dh]; R [H,Dh,4Dh] -> h [B,H,Dh]; state (c, n, m, h)",
    ("lstm", "sequence"): "wx [B,H,T,4Dh]; R [H,Dh,4Dh] -> h [B,H,T,Dh]; state (c, h)",
    ("lstm", "step"): "wx [B,H,4Dh]; R [H,Dh,4Dh] -> h [B,H,Dh]; state (c, h)",
    ("linear", "step"): "x [..., K]; W [N, K]; b [N] -> y [..., N] (a step's projections, no autograd)",
}
SEQUENCE_FORM_OPTION = {"mlstm": ("form", "chunkwise")}  # ops whose sequence form is chosen per call


@dataclass(frozen=True)
class Limit:
    """A bound on one option of a call (``chunk_size``, ``head_dim``); an absent option passes."""

    option: str
    allowed: tuple[int, ...] | None = None
    low: int | None = None
    high: int | None = None
    default: int | None = None  # the value an absent option has (None: absent always passes)

    def accepts(self, options: dict) -> bool:
        value = options.get(self.option, self.default)
        if value is None:
            return True
        return ((self.allowed is None or value in self.allowed) and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high))

    def describe(self) -> str:
        if self.allowed is not None:
            return f"{self.option} in {{{', '.join(map(str, self.allowed))}}}"
        return f"{self.option} {self.low if self.low is not None else ''}..{self.high if self.high is not None else ''}"


@dataclass(frozen=True)
class Kernel:
    op: str                                      # mlstm | slstm | lstm | linear
    form: str                                    # chunkwise | parallel | recurrent | sequence | step
    impl: str                                    # the backend's name
    run: Callable                                # the function the dispatcher calls
    devices: tuple[str, ...] = ANY_DEVICE        # torch device types; empty: any
    dtypes: tuple[torch.dtype, ...] = ANY_DTYPE  # compute dtypes; empty: any (states are fp32 always)
    limits: tuple[Limit, ...] = ()
    notes: str = ""

    def __post_init__(self):
        if (self.op, self.form) not in SHAPES:
            raise ValueError(f"kernel {self.name}: unknown op form; known: {', '.join(f'{o}.{f}' for o, f in SHAPES)}")

    @property
    def name(self) -> str:
        return f"{self.op}.{self.form}--{self.impl}"

    @property
    def dispatch_op(self) -> str:
        """The op function that reaches it: ``mlstm_step`` for the step, else ``mlstm_sequence``."""
        return f"{self.op}_step" if self.form == "step" else f"{self.op}_sequence"

    @property
    def shapes(self) -> str:
        return SHAPES[(self.op, self.form)]

    def serves(self, op: str, options: dict) -> bool:
        """Whether this kernel is the one ``op`` called with ``options`` means (the form matches)."""
        if op != self.dispatch_op:
            return False
        option, default = SEQUENCE_FORM_OPTION.get(self.op, (None, None))
        if self.form != "step" and option is not None:
            return options.get(option, default) == self.form
        return True

    def supports(self, device: torch.device, dtype: torch.dtype, options: dict) -> bool:
        return ((not self.devices or device.type in self.devices) and (not self.dtypes or dtype in self.dtypes)
                and all(limit.accepts(options) for limit in self.limits))


@dataclass
class Backend:
    """A named set of op implementations. Built-in backends declare ``kernels`` (``ops`` and
    :meth:`supports` follow from them); a plugin may instead give ``ops`` and override the hooks."""

    name: str
    ops: dict[str, Callable] = field(default_factory=dict)
    priority: int = 0
    description: str = ""
    kernels: tuple[Kernel, ...] = ()

    def __post_init__(self):
        for kernel in self.kernels:
            self.ops.setdefault(kernel.dispatch_op, kernel.run)

    def unavailable_reason(self) -> str | None:
        """None when usable on this machine, else why not (e.g. 'triton is not installed')."""
        return None

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        if op not in self.ops:
            return False
        if not self.kernels:
            return True
        return any(k.serves(op, options) and k.supports(device, dtype, options) for k in self.kernels)
