"""Spotting Dask arrays among a call's arguments without importing Dask.

The public functions' general path asks :func:`any_dask`; for a Dask argument the call
goes to :mod:`fastattn.dask` (imported only then) and returns a lazy result.
"""


def any_dask(*args):
    """True when an argument is a Dask collection (``dask.array.Array``)."""
    return any(type(a).__module__.startswith("dask.") for a in args)


def call(name, args, kwargs):
    """``fastattn.dask.<name>(*args, **kwargs)``."""
    from . import dask as fastattn_dask
    return fastattn_dask._lazy_call(name, args, kwargs)
