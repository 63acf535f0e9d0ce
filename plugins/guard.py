"""Build-time isolation of plugin components, and their conformance check on first build.

Every builder a third-party plugin registers is wrapped:

- a builder that raises (anything but a :class:`~xlstm_zoo.errors.ZooError`, which is the
  user's configuration mistake and passes through) becomes a one-line :class:`PluginError`
  naming the plugin's distribution, its version and the error; other components are untouched.
  A backend whose builder raises is instead reported once and replaced by an unavailable backend,
  so the dispatcher falls back to the others;
- the first time a plugin's cell, block, norm or gate is built in a process, its default config
  goes through :mod:`xlstm_zoo.testing` at the suite's small size (dim 16, T=11; cells without
  the float64 gradcheck). A failure is one warning naming the plugin (strict mode: an error); the
  user's component is still returned. The check forks the RNG, so seeded runs stay reproducible.

Nothing here runs at start-up: ``xlstm-zoo list`` never builds a plugin component.
"""

from __future__ import annotations

import functools
import warnings

import torch

from xlstm_zoo import testing
from xlstm_zoo.backends.kernel import Backend
from xlstm_zoo.errors import ConfigError, ZooError
from xlstm_zoo.export.step_model import ExportWarning, undeclared_states
from xlstm_zoo.packed import supports_doc_starts
from xlstm_zoo.plugins.contract import DOC_STARTS, EXPORT_SAMPLE
from xlstm_zoo.plugins.status import PluginError, PluginInfo, describe, report

LAZY_CHECK_KINDS = ("cell", "block", "norm", "gate")
CHECK_KINDS = ("cell", "block", "stack", "model", "norm", "gate", "backend")


def guard(entry, info: PluginInfo):
    """``entry``'s builder, wrapped as described above."""
    builder = entry.builder

    def build_plugin_component(*args, **kwargs):
        try:
            built = builder(*args, **kwargs)
        except ZooError:
            raise
        except Exception as err:
            path = getattr(args[1], "path", None) if len(args) > 1 else None
            where = f" (at {path})" if path else ""
            message = f"{entry.kind} {entry.name!r}{where} failed to build: {describe(err)}"
            if entry.kind == "backend":
                report(info, message)
                return unavailable_backend(entry.name, f"plugin {info.label}: {message}")
            if message not in info.problems:
                info.problems.append(message)
                info.status = "failed"
            raise PluginError(f"plugin {info.label}: {message}") from err
        if not build_plugin_component.__zoo_checked__:
            build_plugin_component.__zoo_checked__ = True
            if entry.kind in LAZY_CHECK_KINDS:
                result = run_check(entry, build_plugin_component, full=False)
                info.checks[f"{entry.kind}:{entry.name}"] = result
                if result.startswith("failed"):
                    report(info, f"{entry.kind} {entry.name!r} {result}")
        return built

    functools.update_wrapper(build_plugin_component, builder, updated=())
    build_plugin_component.__zoo_plugin__ = info
    build_plugin_component.__zoo_checked__ = False  # the conformance check on first build has run
    return build_plugin_component


def run_check(entry, builder=None, *, full: bool = True) -> str:
    """Run :mod:`xlstm_zoo.testing`'s check for ``entry`` at its default config.

    Returns ``"passed"``, ``"failed conformance (...): reason"`` or ``"not checked: reason"``
    (no check for the kind, or the default config does not build at the check's size). Called
    without ``builder`` (``xlstm-zoo plugins --check``), it checks the plugin's own builder and
    the check on first build is then skipped."""
    kind = entry.kind
    if builder is None:
        builder = entry.builder
        if getattr(builder, "__zoo_plugin__", None) is not None and hasattr(builder, "__wrapped__"):
            builder.__zoo_checked__ = True
            builder = builder.__wrapped__
    if kind not in CHECK_KINDS:
        return f"not checked: no conformance check for kind {kind!r}"
    try:
        config = entry.name if kind == "backend" else entry.default_config()
    except Exception as err:
        return f"not checked: its config has no usable default ({_one_line(describe(err))})"
    kwargs = {} if kind == "backend" else {"builder": builder}
    if kind == "cell" and not full:
        kwargs["gradcheck"] = kwargs["export"] = False
    try:
        # On the CPU whatever the default device: a first build may happen on meta (a size count, the
        # pretrained loader), where the check could compute nothing.
        with torch.random.fork_rng(devices=[]), torch.device("cpu"), torch.inference_mode(False), torch.enable_grad(), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", ExportWarning)  # said below, once, as a missing optional part
            built = testing.check_component(kind, config, **kwargs)
    except ConfigError as err:
        return f"not checked: the default config does not build at the check's size ({_one_line(str(err))})"
    except Exception as err:
        reason = str(err) if isinstance(err, AssertionError) else describe(err)
        return f"failed conformance (xlstm_zoo.testing.check_{kind}): {_one_line(reason)}"
    missing = missing_optional_parts(built) if kind == "cell" else []
    return "passed" + (f" (warning: {'; '.join(missing)})" if missing else "")


def missing_optional_parts(cell) -> list[str]:
    """The optional parts of the plugin API (:mod:`xlstm_zoo.plugins.contract`) that ``cell`` lacks,
    each with the default the host uses instead."""
    try:
        state = cell.init_state(1)
    except Exception:  # noqa: BLE001 - the conformance check has passed; nothing more to say
        return []
    missing = [f"{what} (optional since plugin API {EXPORT_SAMPLE.since}; export validates from "
               f"{EXPORT_SAMPLE.default})" for what in undeclared_states(state)]
    if not supports_doc_starts(cell):
        missing.append(f"{type(cell).__name__} declares no document boundaries (optional since plugin API "
                       f"{DOC_STARTS.since}; {DOC_STARTS.default})")
    return missing


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unavailable_backend(name: str, reason: str):
    """A backend the dispatcher skips (forcing it is an error that gives ``reason``)."""
    class UnavailableBackend(Backend):
        def unavailable_reason(self) -> str | None:
            return reason

        def supports(self, op, device, dtype, **options) -> bool:
            return False

    return UnavailableBackend(name=name, ops={}, priority=-(10**9), description=reason)
