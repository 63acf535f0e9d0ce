"""Packed rows: document boundaries in a batch, and restarting rows of a state.

A row packed from several documents carries ``doc_starts [B, T]`` (bool): ``True`` at t means a document
starts there and the state entering t is the zero state, as if the row began at t. flash-linear-attention's
convention (batch 1, ``cu_seqlens`` of cumulative lengths) converts to it with :func:`doc_starts_from_cu_seqlens`.

:func:`packable` gives a ``forward(x, state=None, **kw)`` the ``doc_starts`` argument by running each
document of each row on its own (its first one from the row's state, the others from the zero state)
and joining outputs and final states: exact for any module whose state holds everything it carries
from one token to the next, at the price of one call per document. ``None`` skips all of this.
:func:`takes_doc_starts` instead declares a forward that handles ``doc_starts`` itself (passes them down to
its parts and its ops: one call for the whole batch); :func:`run_packed` calls a part either way.
:func:`reset_rows` puts chosen rows of a state back to the zero state (a server restarting one user).
"""

from __future__ import annotations

import functools

import torch

from xlstm_zoo.errors import InputError


def check_doc_starts(doc_starts, batch: int, length: int, device=None) -> torch.Tensor:
    """``doc_starts`` as a bool tensor ``[batch, length]`` on ``device`` (None: the CPU), or an :class:`InputError`
    saying what is wrong."""
    if not isinstance(doc_starts, torch.Tensor):
        raise InputError(f"doc_starts must be a bool tensor [B, T], got a {type(doc_starts).__name__}")
    if doc_starts.dtype != torch.bool:
        raise InputError(f"doc_starts must be a bool tensor [B, T] (True where a document starts), "
                         f"got dtype {str(doc_starts.dtype).removeprefix('torch.')}")
    if tuple(doc_starts.shape) != (batch, length):
        raise InputError(f"doc_starts has shape {tuple(doc_starts.shape)}, but the input is {batch} rows of "
                         f"{length} positions: it must be [{batch}, {length}]")
    return doc_starts.detach().to("cpu" if device is None else device)


def doc_starts_from_cu_seqlens(cu_seqlens, batch: int, length: int) -> torch.Tensor:
    """flash-linear-attention's ``cu_seqlens`` (``[0, l1, l1+l2, ..., T]`` for one packed row) as ``doc_starts [1, T]``."""
    if batch != 1:
        raise InputError(f"cu_seqlens describes one packed row (batch 1), but the input has {batch} rows; "
                         "for several rows pass doc_starts [B, T]")
    values = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InputError(f"cu_seqlens must hold integers, got {values[:8]}")
    if len(values) < 2 or values[0] != 0 or values[-1] != length:
        raise InputError(f"cu_seqlens must start at 0 and end at the sequence length {length}, got {values[:8]}"
                         + (" ..." if len(values) > 8 else ""))
    if any(b <= a for a, b in zip(values, values[1:])):
        raise InputError(f"cu_seqlens must increase strictly (every document at least one token), got {values[:8]}")
    starts = torch.zeros(1, length, dtype=torch.bool)
    starts[0, values[:-1]] = True
    return starts


def boundaries(doc_starts, cu_seqlens, batch: int, length: int) -> torch.Tensor | None:
    """The one ``doc_starts`` a model call means (None: no boundaries); at most one of the two may be given."""
    if doc_starts is not None and cu_seqlens is not None:
        raise InputError("give doc_starts or cu_seqlens, not both")
    if cu_seqlens is not None:
        return doc_starts_from_cu_seqlens(cu_seqlens, batch, length)
    return None if doc_starts is None else check_doc_starts(doc_starts, batch, length)


def rows_starting(doc_starts: torch.Tensor | None, device=None) -> dict[int, torch.Tensor]:
    """``{t: rows [B] (bool)}`` for every position t where some row's document starts: the rows whose state is
    put back to the zero state before t (a loop over time restarts exactly these; positions not listed run
    as they would without boundaries). Empty for None."""
    if doc_starts is None:
        return {}
    on_device = doc_starts.to(device)
    return {t: on_device[:, t] for t in doc_starts.any(0).nonzero().flatten().tolist()}


def last_document(doc_starts: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[B, len(positions)]`` (bool): whether each position (negative: the state's, before the row) lies in its
    row's last document. A carried window (a conv's last inputs) keeps only those, zeros elsewhere."""
    index = torch.arange(doc_starts.shape[1], device=doc_starts.device)
    last = torch.where(doc_starts, index, torch.iinfo(index.dtype).min).amax(1)  # [B]; no start: before all
    return positions.to(doc_starts.device)[None, :] >= last[:, None]


def segments(row_starts: torch.Tensor) -> list[tuple[int, int, bool]]:
    """``(start, end, fresh)`` per document of one row; ``fresh``: it starts from the zero state."""
    cuts = row_starts.nonzero().flatten().tolist()
    edges = sorted(set([0, *cuts]))
    ends = edges[1:] + [row_starts.numel()]
    return [(s, e, s in cuts) for s, e in zip(edges, ends)]


def select_rows(state, index: slice):
    """The rows ``index`` of a state (nested tuples of tensors with the batch first; None stays None)."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state[index]
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(select_rows(s, index) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(select_rows(s, index) for s in state)
    return state


def join_rows(states: list):
    """Inverse of :func:`select_rows` over consecutive rows: one state from per-row states."""
    first = states[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return torch.cat(states, dim=0)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(join_rows([s[i] for s in states]) for i in range(len(first))))
    if isinstance(first, (tuple, list)):
        return type(first)(join_rows([s[i] for s in states]) for i in range(len(first)))
    return first


def split_rows(state, batch: int) -> list:
    """Every row's state at once (:func:`select_rows` of each row), one ``split`` per tensor: autograd then joins
    the rows' gradients in one step instead of a full-size zero tensor per row."""
    if state is None:
        return [None] * batch
    if isinstance(state, torch.Tensor):
        return list(state.split(1))
    if isinstance(state, (tuple, list)):
        parts = [split_rows(s, batch) for s in state]
        rows = [[part[b] for part in parts] for b in range(batch)]
        return [type(state)(*row) if hasattr(state, "_fields") else type(state)(row) for row in rows]
    return [state] * batch


def run_documents(forward, x: torch.Tensor, state, doc_starts: torch.Tensor, **row_inputs):
    """``forward(x, state, **row_inputs) -> (y, state)`` over every document of every row on its own.

    ``row_inputs`` with the batch and time first (a cell's ``value_input``) are cut like ``x``. Inputs, outputs and
    states are cut with ``split`` (autograd: one gradient per cut tensor, not a full-size one per document)."""
    B = x.shape[0]
    outputs, states = [None] * B, [None] * B
    if state is None:
        # Rows with no document start after position 0 begin from the zero state either way: one batched
        # call for all of them (packed training rows are mostly such rows; exact, the same maths).
        plain = [b for b in range(B) if not bool(doc_starts[b, 1:].any())]
        if len(plain) > 1:
            idx = torch.tensor(plain, device=x.device)
            extra = {k: None if v is None else v[idx] for k, v in row_inputs.items()}
            y, joint = forward(x[idx], None, **extra)
            for b, y_b, state_b in zip(plain, y.split(1), split_rows(joint, len(plain))):
                outputs[b], states[b] = y_b, state_b
    x_rows, state_rows = x.split(1), split_rows(state, B)
    input_rows = {k: None if v is None else v.split(1) for k, v in row_inputs.items()}
    for b in range(B):
        if outputs[b] is not None:
            continue
        documents = segments(doc_starts[b])
        lengths = [end - start for start, end, _ in documents]
        pieces = x_rows[b].split(lengths, dim=1)
        extras = {k: [None] * len(lengths) if v is None else v[b].split(lengths, dim=1) for k, v in input_rows.items()}
        row_state, outs = state_rows[b], []
        for i, (_, _, fresh) in enumerate(documents):
            y, row_state = forward(pieces[i], None if fresh else row_state, **{k: v[i] for k, v in extras.items()})
            outs.append(y)
        outputs[b], states[b] = torch.cat(outs, dim=1), row_state
    return torch.cat(outputs, dim=0), join_rows(states)


def packable(forward):
    """Give a module's ``forward(self, x, state=None, **kw)`` the keyword ``doc_starts`` (see the module doc).

    Also the declaration that the module supports document boundaries: a plugin cell or block whose
    state holds all it carries between tokens can use it as it is."""

    @functools.wraps(forward)
    def wrapper(self, x, state=None, *, doc_starts=None, **kwargs):
        if doc_starts is None:
            return forward(self, x, state, **kwargs)
        starts = check_doc_starts(doc_starts, x.shape[0], x.shape[1])
        return run_documents(functools.partial(forward, self), x, state, starts, **kwargs)

    wrapper.packable = True
    return wrapper


def takes_doc_starts(forward):
    """Declare that a module's ``forward(self, x, state=None, *, doc_starts=None, **kw)`` handles document
    boundaries itself; ``doc_starts`` reaches it checked (a bool ``[B, T]`` on the CPU) or None."""

    @functools.wraps(forward)
    def wrapper(self, x, state=None, *, doc_starts=None, **kwargs):
        if doc_starts is not None:
            doc_starts = check_doc_starts(doc_starts, x.shape[0], x.shape[1], x.device)
        return forward(self, x, state, doc_starts=doc_starts, **kwargs)

    wrapper.packable = True
    return wrapper


def supports_doc_starts(module) -> bool:
    return bool(getattr(type(module).forward, "packable", False))


def run_packed(module, x, state, doc_starts, **kwargs):
    """``module(x, state, **kwargs)`` over packed rows: ``doc_starts`` handed on where the module declares them
    (:func:`packable` or :func:`takes_doc_starts`), else one call per document (a part such as a conv whose
    state holds all it carries). Tensor (or None) keywords are per-row inputs, cut with ``x``."""
    if doc_starts is None:
        return module(x, state, **kwargs)
    if supports_doc_starts(module):
        return module(x, state, doc_starts=doc_starts, **kwargs)
    rows = {k: v for k, v in kwargs.items() if v is None or isinstance(v, torch.Tensor)}
    fixed = {k: v for k, v in kwargs.items() if k not in rows}
    return run_documents(functools.partial(module, **fixed), x, state, doc_starts, **rows)


def check_rows(reset, batch: int) -> torch.Tensor:
    if not isinstance(reset, torch.Tensor) or reset.dtype != torch.bool or tuple(reset.shape) != (batch,):
        shown = (f"a {str(reset.dtype).removeprefix('torch.')} tensor of shape {tuple(reset.shape)}"
                 if isinstance(reset, torch.Tensor) else f"a {type(reset).__name__}")
        raise InputError(f"reset must be a bool tensor [{batch}] (True: restart that row), got {shown}")
    return reset


def reset_rows(state, zero_state, reset: torch.Tensor):
    """``state`` with the rows where ``reset`` is True replaced by ``zero_state``'s (same structure)."""
    if state is None or zero_state is None:
        return zero_state if state is None else state
    if isinstance(state, torch.Tensor):
        keep = reset.to(state.device).view(-1, *([1] * (state.dim() - 1)))
        return torch.where(keep, zero_state.to(state.dtype), state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(reset_rows(s, z, reset) for s, z in zip(state, zero_state)))
    if isinstance(state, (tuple, list)):
        return type(state)(reset_rows(s, z, reset) for s, z in zip(state, zero_state))
    return state


# -- per-position views of doc_starts, for modules that keep documents apart themselves ----------------------

def document_ids(starts: torch.Tensor) -> torch.Tensor:
    """``starts [..., T]`` -> the number of document starts at or before each position (int64): two positions
    share a document where these are equal, and 0 marks the row's first document when it continues a state."""
    return starts.cumsum(-1)


def document_positions(starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``starts [..., T]`` -> ``(offset, fresh)``: each position's distance from the start of its document
    (from the row's position 0 in the row's first document where no start precedes it), and whether a
    start lies at or before it (False: that first document, which continues the state given)."""
    t = torch.arange(starts.shape[-1], device=starts.device)
    last = torch.where(starts, t, -1).cummax(-1).values
    return t - last.clamp(min=0), last >= 0


def segment_cumsum(x: torch.Tensor, starts: torch.Tensor, *, reverse: bool = False) -> torch.Tensor:
    """Sums of ``x [..., T]`` over each position's document up to it (``reverse``: from it to the document's
    end), restarting at every start of ``starts`` (broadcastable to ``x``). Plain sums over a ``[T, T]`` mask,
    never differences of prefix sums (which cancel badly for long rows): for the short axes it serves (a
    chunk, or a sequence whose ``T x T`` matrix exists anyway)."""
    doc = document_ids(starts)
    t = torch.arange(x.shape[-1], device=x.device)
    order = t[None, :] >= t[:, None] if reverse else t[None, :] <= t[:, None]  # [t, r]: r counts for row t
    keep = (doc.unsqueeze(-1) == doc.unsqueeze(-2)) & order
    return (x.unsqueeze(-2) * keep).sum(-1)
