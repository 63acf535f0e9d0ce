"""Kernels and backends, declared once.

A :class:`Kernel` is one implementation of one form of one op, named ``<op>.<form>--<impl>`` in the
style of ``mlstm_kernels`` (``mlstm.chunkwise--triton``, ``slstm.sequence--cuda``): the devices and
dtypes it accepts, the limits on its options, and the function that runs it. A :class:`Backend`
is a named, prioritised set of kernels plus an availability check. Everything that talks about
what a backend can do reads these declarations: :meth:`Backend.supports` (what the dispatcher
asks), ``xlstm-zoo doctor`` and the backend table in ``docs/backends.md``
(:func:`xlstm_zoo.backends.catalog.markdown_table`, checked by a test).

Document boundaries: the sequence forms of the recurrent ops take an optional ``doc_starts [B, T]`` (bool,
True where a document starts: the state entering that position is the zero state; see
:mod:`xlstm_zoo.packed`). A kernel says whether it takes them (``Kernel.doc_starts``); for a packed call the
op asks the dispatcher with the option ``doc_starts=True``, which only such kernels accept.
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
    ("lstm", "projected"): ("x [B,T,I]; w_x, w_v [2D,I]; b_x, b_v [2D]; R [H,Dh,4Dh] (D = H*Dh; i, f from x, z, o "
                            "from value_input [B,T,I] or x) -> h [B,T,D]; state (c, h)"),
    ("rwkv_wkv", "chunkwise"): "k, v [B,T,C]; w, u [C] -> wkv [B,T,C]; state (num, den, m)",
    ("rwkv_wkv", "recurrent"): "k, v [B,T,C]; w, u [C] -> wkv [B,T,C]; state (num, den, m)",
    ("rwkv_wkv", "step"): "k, v [B,C]; w, u [C] -> wkv [B,C]; state (num, den, m)",
    ("linear", "step"): "x [..., K]; W [N, K]; b [N] -> y [..., N] (a step's projections, no autograd)",
    ("mlstm7b_block", "step"): "x [B, d]; the block's weights and sizes; state (C, n, m) -> y [B, d]; state (no autograd)",
    # Passes of the layers around the cells, one op each (form "layer": the op function has the op's name).
    ("rms_norm", "layer"): "x [..., D]; weight [D]; bias [D] or None -> y [..., D]",
    ("head_norm", "layer"): "x [..., H*D]; weight, bias [H*D] -> LayerNorm per head, y [..., H*D]",
    ("head_norm_gate", "layer"): "h [B,H,T,D]; o [B,T,H*D]; weight, bias [H*D] -> head_norm(h) * sigmoid(o) [B,T,H*D]",
    ("soft_cap", "layer"): "x [...]; cap -> cap * tanh(x / cap)",
    ("silu_gate", "layer"): "u [..., 2F] -> silu(u[..., :F]) * u[..., F:]",
    ("gelu_gate", "layer"): "u [..., 2F] -> gelu(u[..., :F]) * u[..., F:] (exact GELU)",
    ("causal_conv_silu", "layer"): "x [B,T,C]; state [B,K-1,C]; weight [C,K]; bias [C] -> silu(causal conv) [B,T,C]",
    ("block_diagonal", "layer"): "x [..., N*S]; weight [N,S,S]; bias [N*S] or None -> y [..., N*S]",
    # Mamba's scan (one op function, selective_scan, for both forms).
    ("selective_scan", "chunked"): "u, dt [B,T,E]; A [E,N]; B, C [B,T,N]; h0 [B,E,N] -> y [B,T,E]; h_T [B,E,N]",
    ("selective_scan", "sequential"): "u, dt [B,T,E]; A [E,N]; B, C [B,T,N]; h0 [B,E,N] -> y [B,T,E]; h_T [B,E,N]",
}
# Ops whose sequence forms carry state across positions: their op functions take doc_starts.
BOUNDARY_OPS = ("mlstm", "slstm", "lstm", "rwkv_wkv", "selective_scan", "causal_conv_silu")
# Ops whose sequence form is chosen per call: the option that names it and its default.
SEQUENCE_FORM_OPTION = {"mlstm": ("form", "chunkwise"), "rwkv_wkv": ("form", "chunkwise"),
                        "selective_scan": ("form", "chunked")}
# Ops whose every form is reached through one op function of the op's own name.
OWN_NAME_OPS = ("selective_scan",)
# A forced backend (XLSTM_ZOO_BACKEND, a cell's backend field) must serve these op functions or the call is an
# error. Every other op runs on the forced backend where it declares a kernel of that op, else on the reference.
STRICT_FORCE_OPS = ("mlstm_sequence", "mlstm_step", "slstm_sequence", "slstm_step", "lstm_sequence", "lstm_step")


# Forms reached through an op function of their own (``lstm_projected``), not the op's sequence function.
OWN_FUNCTION_FORMS = ("step", "projected")


def op_function(op: str, form: str) -> str:
    """The op function (``xlstm_zoo.backends.<name>``) that reaches the kernels of ``op.form``."""
    if form == "layer" or op in OWN_NAME_OPS:
        return op
    if form in OWN_FUNCTION_FORMS:
        return f"{op}_{form}"
    return f"{op}_sequence"


def tracing() -> bool:
    """torch.compile, torch.export or torch.jit is tracing: the tensors have no data."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


def exporting() -> bool:
    """torch.export (the ONNX exporter) or torch.jit is tracing; unlike torch.compile, nothing can run a
    compiled kernel as an opaque call there, so ops take the reference form."""
    return torch.compiler.is_exporting() or torch.jit.is_tracing()


def readable(x: torch.Tensor, *others: torch.Tensor | None, tracing_checked: bool = False) -> bool:
    """Whether a compiled kernel can read these tensors' memory as ``x``'s dtype on ``x``'s device (None entries
    skipped): plain tensors or parameters (not another subclass or a fake), none empty, all of ``x``'s dtype and
    device, nothing tracing (``tracing_checked``: the caller has just checked that). With the declared devices,
    dtypes and limits, the one rule for an ``opaque`` kernel."""
    if type(x) not in _PLAIN or not x.numel() or (not tracing_checked and tracing()):
        return False
    dtype, device = x.dtype, x.device
    for t in others:  # a loop, not all(...): a step calls this for every layer op
        if t is not None and (type(t) not in _PLAIN or not t.numel() or t.dtype != dtype or t.device != device):
            return False
    return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def custom_op(name: str):
    """The registered custom op ``namespace::name`` (a kernel's ``traced_op``) as ``torch.ops`` holds it."""
    namespace, op = name.split("::")
    return getattr(getattr(torch.ops, namespace), op)


@dataclass(frozen=True)
class Limit:
    """A bound on one option of a call (``chunk_size``, ``head_dim``); an absent option passes."""

    option: str
    allowed: tuple[int, ...] | None = None
    low: int | None = None
    high: int | None = None
    multiple_of: int | None = None
    default: int | None = None  # the value an absent option has (None: absent always passes)

    def accepts(self, options: dict) -> bool:
        value = options.get(self.option, self.default)
        if value is None:
            return True
        return ((self.allowed is None or value in self.allowed) and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high)
                and (self.multiple_of is None or value % self.multiple_of == 0))

    def describe(self) -> str:
        if self.allowed is not None:
            return f"{self.option} in {{{', '.join(map(str, self.allowed))}}}"
        if self.multiple_of is not None:
            return f"{self.option} a multiple of {self.multiple_of}"
        return f"{self.option} {self.low if self.low is not None else ''}..{self.high if self.high is not None else ''}"


@dataclass(frozen=True)
class Kernel:
    op: str                                      # mlstm | slstm | lstm | rwkv_wkv | linear | rms_norm | ... (SHAPES)
    form: str                                    # chunkwise | parallel | recurrent | sequence | step | layer
    impl: str                                    # the backend's name
    run: Callable                                # the function the dispatcher calls
    devices: tuple[str, ...] = ANY_DEVICE        # torch device types; empty: any
    dtypes: tuple[torch.dtype, ...] = ANY_DTYPE  # compute dtypes; empty: any (states are fp32 always)
    limits: tuple[Limit, ...] = ()
    notes: str = ""
    opaque: bool = False                         # reads raw memory (a compiled call): only where readable=True
    traced_op: str | None = None                 # the custom op (``ns::name``) a torch.compile graph calls for it
    doc_starts: bool = False                     # takes document boundaries (the op's doc_starts [B, T])

    def __post_init__(self):
        if (self.op, self.form) not in SHAPES:
            raise ValueError(f"kernel {self.name}: unknown op form; known: {', '.join(f'{o}.{f}' for o, f in SHAPES)}")
        if self.doc_starts and (self.op not in BOUNDARY_OPS or self.form == "step"):
            raise ValueError(f"kernel {self.name}: declares document boundaries, but {self.op}.{self.form} sees no sequence")

    @property
    def name(self) -> str:
        return f"{self.op}.{self.form}--{self.impl}"

    @property
    def dispatch_op(self) -> str:
        """The op function that reaches it: ``mlstm_step`` for the step, else ``mlstm_sequence``."""
        return op_function(self.op, self.form)

    @property
    def shapes(self) -> str:
        return SHAPES[(self.op, self.form)]

    def serves(self, op: str, options: dict) -> bool:
        """Whether this kernel is the one ``op`` called with ``options`` means (the form matches)."""
        if op != self.dispatch_op:
            return False
        option, default = SEQUENCE_FORM_OPTION.get(self.op, (None, None))
        if self.form not in OWN_FUNCTION_FORMS and option is not None:
            return options.get(option, default) == self.form
        return True

    def supports(self, device: torch.device, dtype: torch.dtype, options: dict) -> bool:
        return ((not self.devices or device.type in self.devices) and (not self.dtypes or dtype in self.dtypes)
                and (not self.opaque or options.get("readable", False))
                and (self.doc_starts or not options.get("doc_starts", False))
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
    availability: Callable[[], str | None] | None = None  # what unavailable_reason asks (None: always available)

    def __post_init__(self):
        for kernel in self.kernels:
            self.ops.setdefault(kernel.dispatch_op, kernel.run)

    def unavailable_reason(self) -> str | None:
        """None when usable on this machine, else why not (e.g. 'triton is not installed')."""
        return None if self.availability is None else self.availability()

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        if op not in self.ops:
            return False
        if not self.kernels:  # a plugin's bare ops: they know nothing of document boundaries
            return not options.get("doc_starts", False)
        return any(k.serves(op, options) and k.supports(device, dtype, options) for k in self.kernels)


def declare_backend(name: str, priority: int, description: str, kernels: tuple[Kernel, ...],
                    availability: Callable[[], str | None] | None = None) -> Callable[[], Backend]:
    """The builder the registry keeps for a built-in backend: a fresh :class:`Backend` of these kernels per call."""

    def make() -> Backend:
        return Backend(name=name, priority=priority, description=description, kernels=kernels,
                       availability=availability)

    make.__name__ = make.__qualname__ = f"{name}_backend"
    return make
