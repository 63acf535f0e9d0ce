"""``xlstm-zoo doctor``: this machine's toolchain, every backend's availability and kernels, and which
backend each op uses (the dispatcher's own answers; the kernels from their declarations)."""

from __future__ import annotations

from rich.markup import escape

from xlstm_zoo.backends import doctor
from xlstm_zoo.backends.catalog import kernel_rows
from xlstm_zoo.commands.output import console, show, table
from xlstm_zoo.registry import Command, registry


def cmd_doctor(args) -> int:
    machine = table("item", "value", title="This machine", title_justify="left", show_header=False)
    for item, value in doctor.machine_facts():
        machine.add_row(item, escape(value))
    show(machine)

    names = sorted(registry.names("backend"), key=lambda n: -registry.instance("backend", n).priority)
    backends = table("backend", "priority", "status", "source", title="Backends (highest priority first)",
                     title_justify="left")
    for name in names:
        backend = registry.instance("backend", name)
        try:
            reason = backend.unavailable_reason()
        except Exception as err:  # a broken plugin backend is reported, not fatal
            reason = f"its availability check raised {type(err).__name__}: {err}"
        status = "[green]available[/]" if reason is None else f"[red]unavailable:[/] {escape(reason)}"
        backends.add_row(name, str(backend.priority), status, registry.get("backend", name).source)
    show(backends)
    kernels = table("kernel", "priority", "devices", "dtypes", "limits", "doc_starts",
                    title="Kernels (declared by each backend; shapes and notes: docs/backends.md)", title_justify="left")
    for row in kernel_rows(registry.instance("backend", n) for n in names):
        kernels.add_row(row["kernel"], row["priority"], row["devices"], row["dtypes"], row["limits"], row["doc_starts"])
    show(kernels)

    for device, dtype in doctor.targets():
        rows = doctor.op_choices(device, dtype)
        ops = table("op", "uses", *names, title=f"Ops on {device.type} ({str(dtype).removeprefix('torch.')})",
                    title_justify="left")
        for row in rows:
            cells = [_doctor_cell(row.statuses[n], row.op in registry.instance("backend", n).ops) for n in names]
            ops.add_row(f"{row.op} + doc_starts" if row.packed else row.op, f"[bold]{escape(row.uses)}[/]", *cells)
        show(ops)
    console.print("Force a backend with a cell's [bold]backend:[/] field or XLSTM_ZOO_BACKEND=name. "
                  "[bold]+ doc_starts[/]: packed rows' calls (document boundaries); [yellow]no doc_starts[/]: that "
                  "backend's kernel cannot restart a row mid-sequence, so packed calls go elsewhere.")
    return 0


def _doctor_cell(status: str, has_kernel: bool) -> str:
    """Short form of a dispatcher status (why a backend is unavailable is in the Backends table)."""
    if status == "ok":
        return "[green]ok[/]"
    if not has_kernel:
        return "[dim]no kernel[/]"
    if status.startswith("does not support"):
        return "[yellow]unsupported here[/]"
    if status.endswith("does not take document boundaries (doc_starts)"):
        return "[yellow]no doc_starts[/]"
    return "[red]unavailable[/]"


def _no_arguments(parser) -> None:
    pass


COMMANDS = (
    Command("doctor", "this machine's GPU/Triton/nvcc, every backend's availability and why, and which backend each op "
                      "uses", _no_arguments, cmd_doctor),
)
