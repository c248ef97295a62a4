"""Sphinx configuration of fastattn's documentation.

The API reference is generated from the docstrings of the *compiled* package, so
fastattn must be importable with its kernels built.  This file does not put the
checkout on ``sys.path``: an unbuilt source tree there would shadow the installed
package (``fastattn._kernels`` holds only sources).  Two ways to build:

* installed (as CI does): ``pip install '.[docs]'``, then from any directory
  outside the checkout
  ``python -m sphinx -W --keep-going -b html <checkout>/docs /tmp/fastattn-docs``;
* built in place: ``python setup.py build_ext --inplace``, then
  ``PYTHONPATH=. python -m sphinx -W -b html docs docs/_build/html``.

``-b doctest`` instead of ``-b html`` runs every ``>>>`` example of the pages
and of the docstrings they include; the docstring examples of ``fastattn.dask``
and ``fastattn.integrations`` need their packages (``pip install '.[test,docs,
transformers]'`` and ``pip install torch==2.13.0``, as CI does), while the html
build needs only ``.[docs]`` (they are mocked for autodoc when missing).
"""
import os
import sys

try:
    import fastattn
except ImportError as exc:      # most often: the unbuilt checkout shadows the package
    raise RuntimeError(
        "the docs need the compiled fastattn package: install it (pip install .) and run "
        "sphinx from a directory outside the checkout, or build it in place (python setup.py "
        f"build_ext --inplace) and set PYTHONPATH to the checkout.  The import failed: {exc}"
    ) from exc

# which fastattn autodoc documents (an installed copy or a tree built in place)
print(f"fastattn docs: documenting fastattn {fastattn.__version__} from "
      f"{os.path.dirname(fastattn.__file__)}", file=sys.stderr)

project = "fastattn"
author = "the fastattn authors"
copyright = "the fastattn authors, BSD-3-Clause"
release = fastattn.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "numpydoc",             # the docstrings are NumPy style (Parameters, Returns, Raises, ...)
]

exclude_patterns = ["_build"]
templates_path = []

# --- autodoc / autosummary: tables of the public names, no generated stub files
autosummary_generate = False
autodoc_default_options = {"member-order": "bysource"}
# the signatures are in the docstrings' Parameters sections; don't repeat type hints
autodoc_typehints = "none"
# the optional integrations' pages render without their packages (the [docs]
# extra alone): what is not installed is mocked for autodoc; the doctests of
# those pages skip (find_spec) rather than run against a mock
from importlib.util import find_spec  # noqa: E402
autodoc_mock_imports = [m for m in ("torch", "transformers", "dask", "distributed")
                        if find_spec(m) is None]

# --- numpydoc: every check of numpydoc's validator runs on each docstring the
# pages render (parameters documented in order, Returns/Yields, See Also,
# Examples, section order, ...); with -W a failed check fails the build.
numpydoc_show_class_members = False
numpydoc_validation_checks = {"all"}

# --- doctest (-b doctest): the pages' examples import what they use; examples
# that need an optional package (torch, dask) say ``:skipif: find_spec("torch") is None``
doctest_global_setup = "import numpy as np\nimport fastattn\nfrom importlib.util import find_spec"

html_theme = "alabaster"
html_title = f"fastattn {release}"
html_theme_options = {
    "description": "Fast exact attention and softmax for NumPy arrays on multicore CPUs",
    "fixed_sidebar": True,
    "page_width": "1100px",
}
html_static_path = []
