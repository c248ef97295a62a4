"""fastattn with other libraries: :mod:`fastattn.integrations.torch` (tensors in and
out, a ``torch.autograd.Function``) and :mod:`fastattn.integrations.transformers`
(an attention backend for Hugging Face transformers).

Importing this package imports neither torch nor transformers; the detector
below tells the public functions when an argument is a torch tensor without
importing torch (a tensor cannot exist before torch is imported).
"""
import sys

import numpy as np

__all__ = []


def any_torch_tensor(*args):
    """True when one of ``args`` is a ``torch.Tensor`` (torch is never imported here)."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor is None:
        return False
    for a in args:
        # None and ndarrays, the usual arguments, skip torch's (slower) isinstance
        if a is not None and type(a) is not np.ndarray and isinstance(a, tensor):
            return True
    return False


def torch_attention(q, k, v, **options):
    """fastattn.attention for arguments that include a torch tensor."""
    from . import torch as torch_integration
    return torch_integration.attention(q, k, v, **options)


def torch_softmax(x, axis, out, num_threads, log_mode):
    """fastattn.softmax / log_softmax for a torch tensor ``x`` (or ``out``)."""
    from . import torch as torch_integration
    f = torch_integration.log_softmax if log_mode else torch_integration.softmax
    return f(x, axis, out=out, num_threads=num_threads)
