"""The README's code runs: every ```python block, each in a fresh namespace.

Each snippet must define its own arrays (a user copies one, not the page), so
the blocks are executed one by one, not as one script.  ```py blocks are
fragments that need a model download or a cluster (transformers, Dask); the
tests of those integrations run the same calls on small inputs.  Also checked: the two
commands at the top, the links into the docs, and the README's length.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)

if not README.exists():     # tests copied out of the checkout (wheel checks)
    pytest.skip(f"no README.md next to the tests ({README})", allow_module_level=True)

TEXT = README.read_text(encoding="utf-8")
BLOCKS = [(m.group(1), m.group(2), TEXT.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(TEXT)]
PYTHON = [(code, line) for lang, code, line in BLOCKS if lang == "python"]


def test_the_readme_has_snippets():
    # decode with a KV cache and GQA, causal prefill, masks, storage types, serving, training, softmax
    assert len(PYTHON) >= 6


@pytest.mark.parametrize("code, line", PYTHON, ids=[f"line{line}" for _, line in PYTHON])
def test_python_block_runs(code, line):
    namespace = {"__name__": f"README.md:{line}"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)


def test_the_first_commands():
    lang, code, _ = BLOCKS[0]
    assert lang == "bash"
    assert code.splitlines() == ["pip install . && fastattn",
                                 "pip install '.[test]' && pytest tests bench --benchmark-disable"]


def test_relative_links_resolve():
    root = README.parent
    targets = re.findall(r"\]\(((?!https?:)[^)#\s]+)(?:#[^)]*)?\)", TEXT)
    assert targets, "no links into the docs"
    missing = [t for t in targets if not (root / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_length():
    n = TEXT.count("\n")
    assert n <= 320, f"README.md has {n} lines: it is for users; run logs and design notes go in docs/"
