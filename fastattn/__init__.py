"""fastattn: fast exact attention and softmax for NumPy arrays on multicore CPUs.

    >>> import numpy as np, fastattn
    >>> q = k = v = np.random.rand(1, 8, 128, 64).astype(np.float32)
    >>> out = fastattn.attention(q, k, v, causal=True)

Public API: :func:`attention`, :func:`attention_backward` (its gradients),
:func:`attention_varlen` (packed variable-length batches), :func:`attention_paged` (paged KV caches),
:func:`scaled_dot_product_attention` (torch's signature), :func:`softmax`, :func:`log_softmax`, :func:`merge_attention`, thread control
(:func:`set_num_threads`, :func:`get_num_threads`, :func:`threads`),
:func:`show_config`, and :mod:`fastattn.reference` (the pure-NumPy specification).
"""
from ._threads import _drop_invalid_omp_num_threads

_drop_invalid_omp_num_threads()     # before any OpenMP runtime reads it (libomp aborts on garbage)
from . import reference  # noqa: E402
try:
    from ._api import (attention, attention_backward, attention_paged, attention_varlen, log_softmax,
                       merge_attention, softmax)
except ImportError as _exc:
    # An unbuilt source checkout (no compiled kernels): say what to run instead.
    from ._unbuilt import raise_if_unbuilt
    raise_if_unbuilt(_exc, __path__[0])
    raise
from ._config import get_version as _get_version
from ._quantized import QuantizedKV, quantize_kv
from ._config import show_config
from ._sdpa import scaled_dot_product_attention
from ._threads import get_num_threads, set_num_threads, threads

__version__ = _get_version()

__all__ = [
    "attention", "scaled_dot_product_attention", "attention_backward", "attention_varlen", "attention_paged",
    "softmax", "log_softmax",
    "merge_attention", "QuantizedKV", "quantize_kv", "set_num_threads", "get_num_threads", "threads", "show_config", "reference", "__version__",
]
