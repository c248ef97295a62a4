"""The kernel layer stays in rooms by job: no kernel source file over 800 lines, no
function over 150, and every file on the map in fastattn/_kernels/README.md."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "fastattn" / "_kernels"
SOURCES = sorted(p for p in KERNELS.glob("*") if p.suffix in (".pxi", ".h", ".pyx")) if KERNELS.exists() else []

if not SOURCES:     # tests copied out of the checkout (wheel checks)
    pytest.skip(f"no kernel sources next to the tests ({KERNELS})", allow_module_level=True)


def _cython_functions(lines):
    """(name, length) of each top-level def / cdef / cpdef function, to its last code line."""
    starts = [i for i, line in enumerate(lines)
              if re.match(r"(cdef|cpdef|def)\s[^=]*\(", line) and not line.startswith("cdef extern")]
    ends = starts[1:] + [len(lines)]
    for a, b in zip(starts, ends):
        while b > a and (not lines[b - 1].strip() or not lines[b - 1].startswith((" ", "\t"))):
            b -= 1
        yield lines[a].split("(")[0], b - a + 1


def _c_functions(lines):
    """(name, length) of each C function definition (a line opening at column 0 with a
    parenthesis, not a declaration), to its closing brace."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if (re.match(r"(static|inline|void|int|double|float|size_t|FA_)\w*", line) and "(" in line
                and not line.rstrip().endswith((";", "\\"))):
            depth, j, opened = 0, i, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if opened and depth <= 0:
                    break
                if not opened and lines[j].rstrip().endswith(";"):
                    break         # a prototype over several lines
                j += 1
            if opened:
                yield line.split("(")[0], j - i + 1
            i = j + 1
        else:
            i += 1


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_kernel_file_is_a_room(path):
    lines = path.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= 800, f"{path.name}: {len(lines)} lines (split it by job)"
    functions = _c_functions(lines) if path.suffix == ".h" else _cython_functions(lines)
    long = [(name, n) for name, n in functions if n > 150]
    assert not long, f"{path.name}: functions over 150 lines: {long}"


def test_every_kernel_file_is_on_the_map():
    text = (KERNELS / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in SOURCES if p.suffix != ".pyx" and f"`{p.name}`" not in text]
    assert not missing, f"fastattn/_kernels/README.md does not map {missing}"


def test_the_function_finders_see_functions():
    # the checks above would pass vacuously if the finders found nothing
    row_unit = (KERNELS / "row_unit.pxi").read_text(encoding="utf-8").split("\n")
    vec_core = (KERNELS / "vec_core.h").read_text(encoding="utf-8").split("\n")
    assert len(list(_cython_functions(row_unit))) >= 5
    assert len(list(_c_functions(vec_core))) >= 10
