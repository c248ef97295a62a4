"""Pure-NumPy reference implementation: the *specification* of fastattn.

Everything here computes in float64 and always returns float64 arrays.  The
attention reference materialises the full ``(..., Lq, Lk)`` score matrix; it is
meant to be obviously correct, not fast.  The compiled kernels in
``fastattn._kernels`` are tested against these functions.

Conventions shared with the fast API
------------------------------------
* ``softmax`` of a row that is entirely ``-inf`` is all zeros; ``log_softmax`` of
  such a row is all ``-inf``.  A row containing ``+inf`` or ``NaN`` is all ``NaN``.
  No floating-point warnings are ever emitted.
* An attention query row with no visible key (everything masked, an empty
  window, ``kv_lengths`` 0, ``Lk == 0``, or all visible scores ``-inf``) yields
  output 0, weights 0 and lse ``-inf``.
* Scores are built in this order: ``s = scale * q @ k^T``; softcap
  ``s = c * tanh(s / c)``; ``+ bias``; ``- slope * |p(i) - j|`` (ALiBi); then every
  invisible key (causal, window, mask, kv_lengths) is set to ``-inf``.

Layout
------
This module is the public face; the code lives in private siblings, each
importable on its own within the package:

* ``_reference_checks``: argument conversion (float64, bfloat16, float8,
  QuantizedKV, int8 / float8 scales) and option checks;
* ``_reference_softmax``: :func:`softmax`, :func:`log_softmax` and the row
  softmax with log-sum-exp;
* ``_reference_attention``: :func:`attention`, :func:`merge_attention`, key
  visibility and grouped-query heads;
* ``_reference_backward``: :func:`attention_backward`;
* ``_reference_batches``: :func:`attention_varlen` and :func:`attention_paged`;
* ``_reference_sinks``: attention sinks.

They use only NumPy and relative imports among themselves, so that this file
also works when loaded from its path, without the package (the tests do that
before the kernels are built): see ``_sibling`` below.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import zlib

__all__ = ["softmax", "log_softmax", "attention", "merge_attention", "attention_backward", "attention_varlen",
           "attention_paged"]


def _sibling(name):
    """The module ``fastattn.<name>`` next to this file.

    Within the package: a relative import.  When this file was loaded from its
    path (``importlib.util.spec_from_file_location``, no package), the siblings
    are imported as submodules of a stand-in package whose path is this
    directory -- one per directory, registered in ``sys.modules`` -- so that their
    relative imports of each other (``from ._reference_checks import ...``) work
    the same way."""
    if __package__:
        return importlib.import_module(f".{name}", __package__)
    here = os.path.dirname(os.path.abspath(__file__))
    package = f"_fastattn_reference_{zlib.crc32(here.encode()):08x}"
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [here]
        sys.modules[package] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{package}.{name}")


_softmax = _sibling("_reference_softmax")
_attention = _sibling("_reference_attention")
_backward = _sibling("_reference_backward")
_batches = _sibling("_reference_batches")

softmax, log_softmax = _softmax.softmax, _softmax.log_softmax
attention, merge_attention = _attention.attention, _attention.merge_attention
attention_backward = _backward.attention_backward
attention_varlen, attention_paged = _batches.attention_varlen, _batches.attention_paged
# not public: the tests check the QuantizedKV kernels' dequantization against it
_dequantized = _sibling("_reference_checks")._dequantized

# The public functions present themselves as this module's (help(), the docs,
# pickling by reference): fastattn.reference.attention, not fastattn._reference_attention.attention.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
