"""Pick the compiled kernel variant for this CPU.

setup.py compiles one kernel source once per variant of the target architecture
(the table in ``fastattn/_variants.py``: ``baseline``, ``avx2``, ``avx512``,
``avx512_bf16``, ``avx512_amx`` (Linux) on x86-64; ``baseline``, ``neon``, ``neon_bf16`` on aarch64).  At
import we load the best one the CPU can execute (a variant with ``auto_vendors`` only
on those vendors' CPUs); ``FASTATTN_ISA=<name>`` forces one (an error if this CPU or
this build lacks it), which is how the test suite checks every variant on one machine.
"""
import importlib
import os

from . import _variants
from ._kernels import _cpu

ARCH = _cpu.target_arch()
ALL_VARIANTS = tuple(v.name for v in _variants.variants_for(None if ARCH == "other" else ARCH))


def _built(name):
    try:
        importlib.import_module(f"fastattn._kernels._attn_{name}")
    except ImportError:
        return False
    return True


def _supported():
    arch = None if ARCH == "other" else ARCH
    return _variants.supported(arch, _cpu.cpu_features(), _cpu.cpu_vendor())


def available_variants():
    """Variants this CPU can execute and this build contains, best last."""
    return [name for name in _supported()[0] if _built(name)]


def _select():
    forced = os.environ.get("FASTATTN_ISA", "").strip().lower()
    can, auto = _supported()
    if forced:
        if forced not in ALL_VARIANTS:
            raise ImportError(f"FASTATTN_ISA={forced!r} is not one of {', '.join(ALL_VARIANTS)} "
                              f"(the {ARCH} variants)")
        if forced not in can:
            raise ImportError(f"FASTATTN_ISA={forced!r}: this CPU cannot execute the {forced} kernels "
                              f"(it supports {', '.join(can)})")
        if not _built(forced):
            raise ImportError(f"FASTATTN_ISA={forced!r}: this build of fastattn has no {forced} kernels")
        return forced
    chosen = [name for name in auto if _built(name)]
    if not chosen:
        raise ImportError("fastattn: no kernel module could be imported (not even the baseline); "
                          "the build is incomplete -- reinstall fastattn")
    return chosen[-1]


VARIANT = _select()
kernels = importlib.import_module(f"fastattn._kernels._attn_{VARIANT}")
