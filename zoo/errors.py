"""Errors a user can act on. The CLI prints them on one line (no traceback unless --debug)."""

from __future__ import annotations

import difflib


class ZooError(Exception):
    """Base class: a mistake in configuration or usage, not a bug in xlstm-zoo."""


class ConfigError(ZooError, ValueError):
    """A bad recipe or component config. ``path`` is the dot-path of the field, ``file`` the recipe."""

    def __init__(self, message: str, *, path: str | None = None, file: str | None = None):
        self.message, self.path, self.file = message, path, file
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(p for p in (self.file, self.path) if p)
        return f"{where}: {self.message}" if where else self.message

    def located(self, *, path_prefix: str | None = None, file: str | None = None) -> "ConfigError":
        """The same error placed deeper in a recipe (prefix its path) or in a file."""
        path = ".".join(p for p in (path_prefix, self.path) if p) or None
        return ConfigError(self.message, path=path, file=file or self.file)


class UnknownComponentError(ConfigError, KeyError):
    """A ``type:`` (or name) that the registry does not know."""

    def __init__(self, kind: str, name: str, known: list[str], *, path: str | None = None, file: str | None = None):
        self.kind, self.name, self.known = kind, name, sorted(known)
        close = difflib.get_close_matches(str(name), self.known, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        listing = ", ".join(self.known) if self.known else "none registered"
        super().__init__(f"unknown {kind} {name!r}{hint} (known {kind}s: {listing})", path=path, file=file)

    def located(self, *, path_prefix=None, file=None):
        path = ".".join(p for p in (path_prefix, self.path) if p) or None
        return UnknownComponentError(self.kind, self.name, self.known, path=path, file=file or self.file)

    __str__ = Exception.__str__  # KeyError would quote the message


class RegistryError(ZooError):
    """Invalid registration: duplicate name without override, config that is not a pydantic model, ..."""


class BackendError(ZooError, RuntimeError):
    """No backend can run an op as asked (forced backend unavailable or unsupported)."""


class InputError(ZooError, ValueError):
    """A bad argument to a model call: a state that does not fit the model, token ids outside the
    vocabulary, generation settings out of range. Raised before anything is computed."""


class WriteError(ZooError):
    """A file could not be written (a full disk, no permission): what was kept is said."""

    @classmethod
    def of(cls, path, err: OSError, kept: str) -> "WriteError":
        reason = err.strerror or type(err).__name__
        return cls(f"cannot write {path}: {reason}; {kept} (free space or fix the permissions, then run the same "
                   "command again)")
