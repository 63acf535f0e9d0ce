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
    kernels = table("kernel", "priority", "devices", "dtypes", "limits", "boundaries",
                    title="Kernels (declared by each backend; shapes and notes: docs/backends.md)", title_justify="left")
    for row in kernel_rows(registry.instance("backend", n) for n in names):
        kernels.add_row(row["kernel"], row["priority"], row["devices"], row["dtypes"], row["limits"], row["boundaries"])
    show(kernels)

    for device, dtype in doctor.targets():
        rows = doctor.op_choices(device, dtype)
        ops = table("op", "uses", *names, title=f"Ops on {device.type} ({str(dtype).removeprefix('torch.')})",
                    title_justify="left")
        for row in rows:
            op = row.op.removesuffix(doctor.PACKED)
            cells = [_doctor_cell(row.statuses[n], op in registry.instance("backend", n).ops) for n in names]
            ops.add_row(row.op, f"[bold]{escape(row.uses)}[/]", *cells)
        show(ops)
    console.print("Force a backend with a cell's [bold]backend:[/] field or XLSTM_ZOO_BACKEND=name.")
    return 0


def _doctor_cell(status: str, has_kernel: bool) -> str:
    """Short form of a dispatcher status (why a backend is unavailable is in the Backends table)."""
    if status == "ok":
        return "[green]ok[/]"
    if not has_kernel:
        return "[dim]no kernel[/]"
    if status.startswith("does not keep document boundaries"):
        return "[yellow]no boundaries[/]"
    if status.startswith("does not support"):
        return "[yellow]unsupported here[/]"
    return "[red]unavailable[/]"


def _no_arguments(parser) -> None:
    pass


COMMANDS = (
    Command("doctor", "this machine's GPU/Triton/nvcc, every backend's availability and why, and which backend each op "
                      "uses", _no_arguments, cmd_doctor),
)
