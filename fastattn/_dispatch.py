"""Pick the compiled kernel variant for this CPU.

setup.py compiles one kernel source several times (``_attn_baseline``,
``_attn_avx2`` = x86-64-v3, ``_attn_avx512`` = x86-64-v4).  At import we load the
best one the CPU can execute; ``FASTATTN_ISA=baseline|avx2|avx512`` forces one
(an error if this CPU or this build lacks it), which is how the test suite checks
every variant on one machine.
"""
import importlib
import os

from ._kernels import _cpu

ALL_VARIANTS = ("baseline", "avx2", "avx512", "avx512_bf16")


def _built(name):
    try:
        importlib.import_module(f"fastattn._kernels._attn_{name}")
    except ImportError:
        return False
    return True


def available_variants():
    """Variants this CPU can execute and this build contains, best last."""
    return [name for name in _cpu.supported_variants() if _built(name)]


def _select():
    forced = os.environ.get("FASTATTN_ISA", "").strip().lower()
    if forced:
        if forced not in ALL_VARIANTS:
            raise ImportError(f"FASTATTN_ISA={forced!r} is not one of {', '.join(ALL_VARIANTS)}")
        if forced not in _cpu.supported_variants():
            raise ImportError(f"FASTATTN_ISA={forced!r}: this CPU cannot execute the {forced} kernels "
                              f"(it supports {', '.join(_cpu.supported_variants())})")
        if not _built(forced):
            raise ImportError(f"FASTATTN_ISA={forced!r}: this build of fastattn has no {forced} kernels")
        return forced
    return available_variants()[-1]


VARIANT = _select()
kernels = importlib.import_module(f"fastattn._kernels._attn_{VARIANT}")
