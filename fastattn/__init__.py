"""fastattn: fast exact attention and softmax for NumPy arrays on multicore CPUs.

    >>> import numpy as np, fastattn
    >>> q = k = v = np.random.rand(1, 8, 128, 64).astype(np.float32)
    >>> out = fastattn.attention(q, k, v, causal=True)

Public API: :func:`attention` (alias :func:`scaled_dot_product_attention`),
:func:`attention_backward` (its gradients),
:func:`softmax`, :func:`log_softmax`, :func:`merge_attention`, thread control
(:func:`set_num_threads`, :func:`get_num_threads`, :func:`threads`),
:func:`show_config`, and :mod:`fastattn.reference` (the pure-NumPy specification).
"""
from . import reference
from ._api import attention, log_softmax, merge_attention, scaled_dot_product_attention, softmax
from ._backward import attention_backward
from ._config import get_version as _get_version
from ._config import show_config
from ._threads import get_num_threads, set_num_threads, threads

__version__ = _get_version()

__all__ = [
    "attention", "scaled_dot_product_attention", "attention_backward", "softmax", "log_softmax",
    "merge_attention", "set_num_threads", "get_num_threads", "threads", "show_config", "reference", "__version__",
]
