"""Every C entry of the cpp backend is declared once in Python (``build.c_entry`` beside its wrapper; the 7B
step's argument struct as a ``ctypes.Structure``), and each declaration equals the ``extern "C"`` prototype
(or struct) in the sources as the compiler's preprocessor sees them: a miscounted or mistyped argument list
fails here instead of corrupting memory at the call."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.block_step import _Args

pytestmark = pytest.mark.skipif(build.compiler() is None or shutil.which(build.compiler()) is None,
                                reason="needs a C++ compiler (its preprocessor reads the prototypes)")

DEFINITION = re.compile(r"\bvoid\s+(xlstm_zoo_\w+)\s*\(([^)]*)\)\s*\{")
SCALARS = {"int64_t": "i64", "int": "int", "float": "f32", "double": "f64"}


def preprocessed(sources: list[Path], include: Path) -> str:
    """The sources after the preprocessor (macros expanded: the sLSTM entries come from one), one line."""
    out = subprocess.run([build.compiler(), "-std=c++17", "-E", "-P", "-DXLSTM_ZOO_VECTOR_MATH", f"-I{include}",
                          *map(str, sources)], capture_output=True, text=True, check=True).stdout
    return " ".join(out.split())


def argument_kind(argument: str) -> str:
    """``const float* x`` -> ptr, ``int64_t rows`` -> i64, ... (the names of build.C_TYPES)."""
    if "*" in argument:
        return "ptr"
    words = argument.replace("const ", "").split()
    if len(words) != 2 or words[0] not in SCALARS:
        raise AssertionError(f"an argument type the declarations cannot name: {argument!r}")
    return SCALARS[words[0]]


def prototypes(sources: list[Path], include: Path) -> dict[str, tuple[str, ...]]:
    return {name: tuple(argument_kind(a) for a in arguments.split(",") if a.strip())
            for name, arguments in DEFINITION.findall(preprocessed(sources, include))}


def mismatches(declared: dict, defined: dict) -> list[str]:
    problems = [f"{name}: declared but not defined in the sources" for name in sorted(set(declared) - set(defined))]
    problems += [f"{name}: defined in the sources but not declared (build.c_entry)"
                 for name in sorted(set(defined) - set(declared))]
    problems += [f"{name}: declared ({' '.join(declared[name])}) but defined ({' '.join(defined[name])})"
                 for name in sorted(set(declared) & set(defined)) if declared[name] != defined[name]]
    return problems


def test_every_declaration_equals_its_prototype():
    defined = prototypes(list(build.SOURCES), build.HERE)
    assert len(defined) >= 30, "the parser found too few entries to be reading the sources"
    assert mismatches(build.ENTRIES, defined) == []


def test_a_changed_prototype_fails_the_check(tmp_path):
    """The check can fail: the sources with one argument dropped from a prototype, or one added, or a type
    changed, each disagree with the declarations."""
    for header in build.HEADERS:
        shutil.copy(header, tmp_path)
    original = (build.HERE / "rms_norm.cpp").read_text()
    for old, new in (("float eps, int64_t threads", "int64_t threads"),               # dropped
                     ("float eps, int64_t threads", "float eps, float extra, int64_t threads"),  # added
                     ("int64_t rows, int64_t D, float eps", "int64_t rows, int D, float eps")):  # retyped
        assert old in original
        mutated = tmp_path / "rms_norm.cpp"
        mutated.write_text(original.replace(old, new, 1))
        defined = prototypes([mutated], tmp_path)
        declared = {name: build.ENTRIES[name] for name in defined}
        assert mismatches(declared, defined) == [
            f"xlstm_zoo_rms_norm_forward_f32: declared ({' '.join(build.ENTRIES['xlstm_zoo_rms_norm_forward_f32'])}) "
            f"but defined ({' '.join(defined['xlstm_zoo_rms_norm_forward_f32'])})"], (old, new)


def struct_fields(source: str, struct: str) -> list[tuple[str, str]]:
    """(field, kind) of ``struct <struct> { ... };`` in order; kind as :func:`argument_kind`."""
    body = re.search(rf"struct {struct}\s*\{{(.*?)\}};", source, re.S).group(1)
    fields = []
    for declaration in filter(None, (d.strip() for d in body.split(";"))):
        base, *names = re.match(r"((?:const\s+)?\w+)\s+(.*)", declaration).groups()
        for name in names[0].split(","):
            name = name.strip()
            fields.append((name.lstrip("*").strip(), "ptr" if name.startswith("*") else SCALARS[base.replace("const ", "")]))
    return fields


def test_the_block_step_struct_equals_its_ctypes_mirror():
    kinds = {ctypes.c_void_p: "ptr", ctypes.c_int64: "i64", ctypes.c_float: "f32"}
    mirror = [(name, kinds[kind]) for name, kind in _Args._fields_]
    assert struct_fields((build.HERE / "block_step.cpp").read_text(), "BlockStep") == mirror


def test_c_entry_names_what_it_cannot_declare():
    with pytest.raises(ValueError, match=r"c_entry bad: 'ptr\*x' is not a C argument type; allowed: ptr, i64"):
        build.c_entry("bad", "ptr*x")
    assert "xlstm_zoo_bad" not in build.ENTRIES
