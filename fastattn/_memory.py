"""The size of the last-level cache, for the one decision that needs it: whether
``softmax(..., out=)`` / ``log_softmax(..., out=)`` write their result by
streaming (non-temporal) stores.

A result that cannot stay in the caches is written to memory anyway; ordinary
stores first read each of its lines (read-for-ownership), so a softmax into a
caller's output larger than the last-level cache moves three bytes across the
memory bus for every two it needs.  Streaming stores skip that read, but they
also push out of the caches a result that would have stayed there, and a freshly
allocated result is already in the caches (the kernel zeroes its pages), so they
are used only for a caller's ``out=`` of at least the last-level cache's size.
Where the size cannot be read (no ``sysconf`` / sysfs entry, Windows, macOS)
they are not used.  ``FASTATTN_STREAM_MIN_BYTES`` (bytes; 0 turns streaming
off) overrides the rule.
"""
from __future__ import annotations

import functools
import os
from typing import Optional

__all__ = ["last_level_cache_bytes", "stream_min_bytes", "prefetch_wide", "prefetch_l2"]

_SYSFS = "/sys/devices/system/cpu/cpu0/cache"


def _parse_size(text: str) -> Optional[int]:
    text = text.strip().upper()
    mult = 1
    if text.endswith("K"):
        mult, text = 1024, text[:-1]
    elif text.endswith("M"):
        mult, text = 1024 * 1024, text[:-1]
    elif text.endswith("G"):
        mult, text = 1024 ** 3, text[:-1]
    return int(text) * mult if text.isascii() and text.isdigit() else None


def _sysfs_llc() -> Optional[int]:
    """The largest data or unified cache level of CPU 0 in sysfs (Linux)."""
    best_level, best = -1, None
    try:
        entries = os.listdir(_SYSFS)
    except OSError:
        return None
    for name in entries:
        if not name.startswith("index"):
            continue
        try:
            with open(os.path.join(_SYSFS, name, "level")) as f:
                level = int(f.read().strip())
            with open(os.path.join(_SYSFS, name, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(_SYSFS, name, "size")) as f:
                size = _parse_size(f.read())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size and level > best_level:
            best_level, best = level, size
    return best


@functools.lru_cache(maxsize=None)
def last_level_cache_bytes() -> Optional[int]:
    """The last-level cache of this machine in bytes (as the OS reports it: on a
    virtual machine, the host's), or None when it cannot be read."""
    for key in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            v = os.sysconf(key)
        except (ValueError, OSError, AttributeError):
            v = 0
        if v and v > 0:
            return int(v)
    return _sysfs_llc()


def stream_min_bytes() -> int:
    """The smallest out= (bytes) that softmax writes by streaming stores: the
    last-level cache's size, FASTATTN_STREAM_MIN_BYTES if set (a non-negative
    integer; 0 = never), 0 when the cache size is unknown."""
    env = os.environ.get("FASTATTN_STREAM_MIN_BYTES")
    if env is not None and env.strip():
        text = env.strip()
        if text.isascii() and text.isdigit():
            return int(text)
        import warnings
        warnings.warn(f"FASTATTN_STREAM_MIN_BYTES={env!r} is not a non-negative integer; ignored",
                      RuntimeWarning, stacklevel=2)
    return last_level_cache_bytes() or 0


def prefetch_wide(vendor: str) -> bool:
    """Whether the one-row loops (a decode unit of one query row) issue software
    prefetches for the float32 / float64 key and value rows they stream in place:
    not on AMD CPUs (``vendor`` as CPUID spells it), whose hardware prefetchers
    stream such rows alone -- on a Zen 3 the hints cost the one-thread float32
    decode about a sixth of its speed -- and on every other CPU (the hints were
    measured to help on Intel Xeon).  ``FASTATTN_PREFETCH_WIDE`` = ``1`` / ``0``
    overrides.  Narrower storage types (float16, bfloat16, int8, float8,
    QuantizedKV codes) and the loops of several rows always prefetch.  Results
    never depend on it."""
    env = _env_switch("FASTATTN_PREFETCH_WIDE")
    return vendor != "AuthenticAMD" if env is None else env


def prefetch_l2(vendor: str) -> bool:
    """Whether the software prefetch hints of the query-vectorised kernel (next
    key rows), the one-row decode loops and the QuantizedKV readers put their
    lines into L2 (``prefetcht1``) rather than L1 (``prefetcht0``): on AMD CPUs
    (``vendor`` as CPUID spells it) -- on a Zen 4, 16 query rows against keys
    from memory ran 1.14-1.18x faster and the one-row decode of QuantizedKV,
    int8 and float16 caches faster, the prefill level -- and not elsewhere (the
    L1 hints were tuned on Intel Xeon).
    ``FASTATTN_PREFETCH_L2`` = ``1`` / ``0`` overrides.  (The float32 / float64
    streams of few query rows without :func:`prefetch_wide` always use L2
    hints.)  Results never depend on it."""
    env = _env_switch("FASTATTN_PREFETCH_L2")
    return vendor == "AuthenticAMD" if env is None else env


def _env_switch(name: str) -> Optional[bool]:
    """The environment variable ``name`` as a switch: True for ``1``, False for
    ``0`` (spaces around ignored), None when unset or empty; any other value
    warns and counts as unset."""
    env = os.environ.get(name)
    if env is None or not env.strip():
        return None
    if env.strip() in ("0", "1"):
        return env.strip() == "1"
    import warnings
    warnings.warn(f"{name}={env!r} is not 0 or 1; ignored", RuntimeWarning, stacklevel=3)
    return None
