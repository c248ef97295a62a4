"""Every public function's docstring is complete (NumPy style) and its Examples run.

The Examples are run here with ``doctest.DocTestFinder`` / ``DocTestRunner`` on
the objects themselves: ``fastattn.attention`` is a compiled (Cython) function,
which ``pytest --doctest-modules`` does not collect.
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import re
from pathlib import Path

import pytest

import fastattn
from fastattn import reference

# name -> (object, sections it must have beyond Returns (Yields for the context
# manager) and Examples)
PUBLIC = {
    "fastattn.attention": (fastattn.attention, ("Parameters", "Raises")),
    "fastattn.softmax": (fastattn.softmax, ("Parameters", "Raises")),
    "fastattn.log_softmax": (fastattn.log_softmax, ("Parameters", "Raises")),
    "fastattn.merge_attention": (fastattn.merge_attention, ("Parameters", "Raises")),
    "fastattn.scaled_dot_product_attention": (fastattn.scaled_dot_product_attention, ("Parameters", "Raises")),
    "fastattn.attention_backward": (fastattn.attention_backward, ("Parameters", "Raises")),
    "fastattn.attention_varlen": (fastattn.attention_varlen, ("Parameters", "Raises")),
    "fastattn.attention_paged": (fastattn.attention_paged, ("Parameters", "Raises")),
    "fastattn.set_num_threads": (fastattn.set_num_threads, ("Parameters", "Raises")),
    "fastattn.get_num_threads": (fastattn.get_num_threads, ()),
    "fastattn.threads": (fastattn.threads, ("Parameters", "Raises")),
    "fastattn.show_config": (fastattn.show_config, ("Parameters",)),
    "fastattn.quantize_kv": (fastattn.quantize_kv, ("Parameters", "Raises")),
    "fastattn.QuantizedKV": (fastattn.QuantizedKV, ("Parameters", "Raises")),
    "fastattn.reference.attention": (reference.attention, ("Parameters", "Raises")),
    "fastattn.reference.softmax": (reference.softmax, ("Parameters", "Raises")),
    "fastattn.reference.log_softmax": (reference.log_softmax, ("Parameters", "Raises")),
    "fastattn.reference.merge_attention": (reference.merge_attention, ("Parameters", "Raises")),
    "fastattn.reference.attention_backward": (reference.attention_backward, ("Parameters", "Raises")),
    "fastattn.reference.attention_varlen": (reference.attention_varlen, ("Parameters", "Raises")),
    "fastattn.reference.attention_paged": (reference.attention_paged, ("Parameters", "Raises")),
}

# the functions of the modules that need an optional package (dask, torch,
# transformers) that the API reference documents: name -> sections, as above.
# Each is checked where its module imports, and reported as skipped elsewhere.
OPTIONAL = {
    "fastattn.dask.attention": ("Parameters", "Raises"),
    "fastattn.dask.softmax": ("Parameters", "Raises"),
    "fastattn.dask.log_softmax": ("Parameters", "Raises"),
    "fastattn.integrations.torch.attention": ("Parameters", "Raises"),
    "fastattn.integrations.torch.scaled_dot_product_attention": ("Parameters", "Raises"),
    "fastattn.integrations.torch.softmax": ("Parameters", "Raises"),
    "fastattn.integrations.torch.log_softmax": ("Parameters", "Raises"),
    "fastattn.integrations.transformers.register": ("Parameters",),
    "fastattn.integrations.transformers.attention_forward": ("Parameters", "Raises"),
}
CORE = set(PUBLIC)
MISSING = {}            # name -> why its module does not import here
for _name, _required in OPTIONAL.items():
    _module, _attr = _name.rsplit(".", 1)
    try:
        PUBLIC[_name] = (getattr(importlib.import_module(_module), _attr), _required)
    except ImportError as exc:
        MISSING[_name] = f"{_module} does not import here: {exc}"
NAMES = list(PUBLIC) + [pytest.param(n, marks=pytest.mark.skip(reason=why)) for n, why in MISSING.items()]

API_RST = Path(__file__).resolve().parents[1] / "docs" / "api.rst"

SECTION = re.compile(r"^(\w[\w ]*)\n-{3,}$", re.M)


def sections(doc):
    """{section title: body} of a NumPy-style docstring (cleaned by inspect.getdoc)."""
    heads = list(SECTION.finditer(doc))
    return {m.group(1): doc[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(doc)]
            for i, m in enumerate(heads)}


def documented_parameters(body):
    """Names of the entries of a Parameters section ("a, b : type" lines at column 0;
    ``**options`` is the signature's ``options``)."""
    names = []
    for line in body.splitlines():
        if line and not line[0].isspace():
            names += [n.strip().lstrip("*") for n in line.split(":")[0].split(",")]
    return names


def test_every_public_function_is_listed():
    """A new public function must be added here, so that its docstring is checked."""
    public = {f"fastattn.{n}" for n in fastattn.__all__ if callable(getattr(fastattn, n))}
    public |= {f"fastattn.reference.{n}" for n in reference.__all__}
    assert public == CORE


def test_every_documented_function_is_listed():
    """A function the API reference renders (``.. autofunction::``) must be listed
    here too, so that its docstring is checked and its Examples run."""
    if not API_RST.exists():        # tests copied out of the checkout without docs/
        pytest.skip(f"no {API_RST}")
    documented = set()
    for name in re.findall(r"^\.\. autofunction:: (\S+)$", API_RST.read_text(encoding="utf-8"), re.M):
        documented.add(name if name.startswith("fastattn.") else f"fastattn.{name}")
    assert documented <= CORE | set(OPTIONAL), sorted(documented - CORE - set(OPTIONAL))


@pytest.mark.parametrize("name", NAMES)
def test_docstring_sections(name):
    obj, required = PUBLIC[name]
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    found = sections(doc)
    # (a class: its Attributes take the place of Returns)
    returns = "Yields" if obj is fastattn.threads else "Attributes" if inspect.isclass(obj) else "Returns"
    for title in (returns, "Examples") + required:
        assert title in found and found[title].strip(), f"{name}: no {title} section"
    params = [p for p in inspect.signature(obj).parameters if p != "self"]
    if params:
        assert documented_parameters(found["Parameters"]) == params, (
            f"{name}: the Parameters section does not list the signature's parameters in order")


@pytest.fixture
def restore_threads():
    yield
    fastattn.set_num_threads(None)


@pytest.mark.parametrize("name", NAMES)
def test_examples_run(name, restore_threads):
    obj, _ = PUBLIC[name]
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, module=False, globs={})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for t in tests:
        runner.run(t, out=report.append)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted > 0, f"{name}: no example was run"
    assert failed == 0, "".join(report)


def test_a_wrong_example_fails():
    """The runner above really compares outputs: a docstring with a wrong one fails."""
    def f():
        """
        >>> 1 + 1
        3
        """
    tests = doctest.DocTestFinder(recurse=False).find(f, "f", module=False, globs={})
    runner = doctest.DocTestRunner()
    for t in tests:
        runner.run(t, out=lambda s: None)
    assert runner.summarize(verbose=False) == (1, 1)
