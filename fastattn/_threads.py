"""Thread-count control for fastattn's OpenMP kernels.

Public surface (re-exported by :mod:`fastattn`):

``set_num_threads(n)``   process-wide setting (``None`` restores the default).
``get_num_threads()``    what a call with ``num_threads=None`` would use now.
``threads(n)``           context manager; overrides the setting *for the calling
                         Python thread only* and restores the previous value on exit.

Internal, used by every public kernel entry point::

    n = resolve_num_threads(num_threads)   # validated int >= 1

Precedence for a call, most specific first:

1. the call's own ``num_threads=`` argument;
2. the innermost active ``with fastattn.threads(n):`` block of the calling thread;
3. ``fastattn.set_num_threads(n)``;
4. :func:`effective_num_threads`, the default: the minimum of ``OMP_NUM_THREADS``
   (first entry, if set and valid), the CPUs this process may run on (scheduler
   affinity, and the cgroup v2/v1 CPU quota when it is lower), and the OpenMP
   runtime's own ``omp_get_max_threads()`` -- which is what
   ``threadpoolctl.threadpool_limits(n, user_api="openmp")`` lowers.  The
   environment/affinity/cgroup part is cached for one second (see
   :func:`refresh_cpu_info`); ``omp_get_max_threads()`` is asked on every call.

Explicit values (1-3) are used as given, like scikit-learn's ``n_threads``; only the
default follows threadpoolctl.  Values above the CPU count are allowed
(oversubscription is the caller's choice).

Thread safety: ``set_num_threads`` is guarded by a lock; ``threads()`` keeps its
override in a :class:`threading.local`, so concurrent ``with threads(...)`` blocks in
different Python threads neither see nor clobber each other, and nesting restores
correctly.  An override made by ``threads()`` does not propagate to threads started
inside the block.

Fork safety (GNU libgomp, Linux): a process forked by a thread that has run an
OpenMP parallel region inherits libgomp's idle thread-pool bookkeeping but not the
pool's threads, so the child's first parallel region waits forever for threads that
do not exist (verified with GCC 12 libgomp: the child hangs; a child that only runs
single-threaded regions is fine).  LLVM libomp / Intel libiomp reinitialise
themselves in a fork child (``pthread_atfork``); Windows has no ``fork``.

Mitigation, installed with :func:`os.register_at_fork`:

* *before* a Python-level fork (``os.fork``, ``multiprocessing``'s ``fork`` start
  method; ``spawn``/``forkserver`` children never inherit a used pool), if the
  forking thread has run one of our parallel
  regions, every libgomp loaded in the process is asked to release the calling
  thread's pool with ``omp_pause_resource_all(omp_pause_soft)`` (OpenMP 5.0; libgomp
  >= 9).  The child then starts with no pool and is fully multi-threaded; the parent
  re-creates its pool on the next parallel call (about 0.1 ms; the pause costs about
  0.5 ms per fork, only when needed).  ICVs such as a threadpoolctl limit survive.
* if that is not possible (old libgomp, no ``/proc``), the child is marked and
  :func:`resolve_num_threads` returns 1 there for every call (single-threaded regions
  never touch the pool), so the child is slow but never hangs.

Forks done in C without going through Python's ``os.fork`` (e.g. by another extension)
are not covered.  ``subprocess`` is unaffected (it execs immediately).
"""
from __future__ import annotations

import contextlib
import math
import operator
import os
import sys
import threading
from time import monotonic as _monotonic
from typing import Iterator, NamedTuple, Optional

__all__ = [
    "set_num_threads", "get_num_threads", "threads", "resolve_num_threads",
    "effective_num_threads", "cpu_count_available", "refresh_cpu_info", "fork_state",
]

_INT_MAX = 2**31 - 1

_lock = threading.Lock()
_global_num_threads: Optional[int] = None   # set_num_threads value; None = default
_tls = threading.local()                     # .override (threads()), .parallel_used

# fork-safety state (module globals are inherited by a fork child)
_forked_single_threaded = False   # True in a child that must not start an OpenMP team
_last_fork_pause: Optional[str] = None   # description of what the before-fork hook did


# --------------------------------------------------------------------------- validation

def _check_num_threads(num_threads: object, name: str = "num_threads") -> int:
    """Validate an explicit thread count and return it as a Python int."""
    if isinstance(num_threads, bool) or type(num_threads).__name__ == "bool_":
        raise TypeError(f"{name} must be a positive integer or None, got a bool ({num_threads!r})")
    try:
        n = operator.index(num_threads)   # int, numpy integers; rejects floats, strings
    except TypeError:
        raise TypeError(f"{name} must be a positive integer or None, got "
                        f"{num_threads!r} of type {type(num_threads).__name__}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    if n > _INT_MAX:
        raise ValueError(f"{name} is too large: {n}")
    return int(n)


# --------------------------------------------------------------------------- CPU counting

class _OmpNumThreads(NamedTuple):
    """What an OMP_NUM_THREADS value means (:func:`_parse_omp_num_threads`)."""
    first: Optional[int]          # the thread count it asks for, or None
    valid: bool                   # may stay in the environment


def _parse_omp_num_threads(raw: Optional[str]) -> _OmpNumThreads:
    """The one reading of an OMP_NUM_THREADS value (``raw`` None: unset), the rule of
    docs/guide.rst "Threads": a comma-separated list of positive integers written in
    ASCII digits (blanks around an entry allowed) is valid and asks for its first
    entry; an unset or blank value is valid and asks for nothing; anything else is
    invalid and asks for nothing -- "+3", "1_000", "2,x", non-ASCII digits ("²",
    "٣"), or a number too long for ``int()`` -- and never raises.
    """
    text = (raw or "").strip()
    if not text:
        return _OmpNumThreads(None, True)
    values = []
    for e in text.split(","):
        e = e.strip()
        if not (e.isascii() and e.isdigit()):
            return _OmpNumThreads(None, False)
        try:
            n = int(e)
        except ValueError:          # more digits than sys.get_int_max_str_digits()
            return _OmpNumThreads(None, False)
        if n < 1:
            return _OmpNumThreads(None, False)
        values.append(n)
    return _OmpNumThreads(values[0], True)


def _omp_num_threads_env() -> Optional[int]:
    """First entry of OMP_NUM_THREADS ("8" or "8,2" for nested), if valid."""
    return _parse_omp_num_threads(os.environ.get("OMP_NUM_THREADS")).first


def _drop_invalid_omp_num_threads() -> None:
    """Remove an OMP_NUM_THREADS that is not a list of positive integers from this
    process's environment, with a RuntimeWarning, before any OpenMP runtime reads it.

    GNU libgomp ignores such a value; LLVM's libomp (clang builds, macOS, the
    Windows wheels) aborts the process on some ("OMP_NUM_THREADS=lots": "Out of
    heap memory", libomp 14).  fastattn ignores it either way (the default then
    follows the usable CPUs), so the process behaves the same on every build.
    Called once by ``import fastattn``, before the kernels are loaded."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if _parse_omp_num_threads(raw).valid:
        return
    import warnings
    shown = repr(raw) if len(raw) <= 40 else f"{raw[:20]!r}... ({len(raw)} characters)"
    warnings.warn(f"OMP_NUM_THREADS={shown} is not a list of positive integers: fastattn ignores it and "
                  "removes it from this process's environment (LLVM's OpenMP runtime would abort on it)",
                  RuntimeWarning, stacklevel=3)
    del os.environ["OMP_NUM_THREADS"]


def _affinity_count() -> int:
    if hasattr(os, "process_cpu_count"):          # Python 3.13+
        n = os.process_cpu_count()
        if n:
            return n
    if hasattr(os, "sched_getaffinity"):
        try:
            return len(os.sched_getaffinity(0)) or 1
        except OSError:
            pass
    return os.cpu_count() or 1


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_mounts(root: str = ""):
    """Yield (version, mount_point, mount_root, super_options) for cgroup mounts."""
    text = _read(root + "/proc/self/mountinfo")
    if not text:
        return
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        fstype = rf[0]
        if fstype == "cgroup2":
            yield 2, root + lf[4], lf[3], ""
        elif fstype == "cgroup":
            yield 1, root + lf[4], lf[3], rf[2]


def _cgroup_dirs(mount_point: str, mount_root: str, cg_path: str):
    """Directories from the process's cgroup up to the mount point (deepest first)."""
    rel = cg_path
    if mount_root not in ("/", "") and (cg_path == mount_root or cg_path.startswith(mount_root + "/")):
        rel = cg_path[len(mount_root):]
    rel = rel.strip("/")
    parts = rel.split("/") if rel else []
    while True:
        yield os.path.join(mount_point, *parts)
        if not parts:
            return
        parts.pop()


def _quota_to_cpus(quota: float, period: float) -> Optional[int]:
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_cpu_limit(root: str = "") -> Optional[int]:
    """CPU limit implied by the cgroup v2 ``cpu.max`` / v1 CFS quota, or None.

    ``root`` prefixes every path read (tests use a fake filesystem tree).
    """
    if not sys.platform.startswith("linux") and not root:
        return None
    cg_text = _read(root + "/proc/self/cgroup") or ""
    v2_path, v1_path = None, None
    for line in cg_text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hid, controllers, path = fields
        if hid == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    limits = []
    seen_v2 = seen_v1 = False
    for version, mnt, mroot, opts in _cgroup_mounts(root):
        if version == 2 and v2_path is not None and not seen_v2:
            seen_v2 = True
            for d in _cgroup_dirs(mnt, mroot, v2_path):
                txt = _read(os.path.join(d, "cpu.max"))
                if txt:
                    q, _, p = txt.partition(" ")
                    if q != "max":
                        try:
                            lim = _quota_to_cpus(float(q), float(p or 100000))
                        except ValueError:
                            lim = None
                        if lim:
                            limits.append(lim)
        elif version == 1 and v1_path is not None and not seen_v1 and "cpu" in opts.split(","):
            seen_v1 = True
            for d in _cgroup_dirs(mnt, mroot, v1_path):
                q = _read(os.path.join(d, "cpu.cfs_quota_us"))
                p = _read(os.path.join(d, "cpu.cfs_period_us"))
                if q and p:
                    try:
                        lim = _quota_to_cpus(float(q), float(p))
                    except ValueError:
                        lim = None
                    if lim:
                        limits.append(lim)
    if not limits:   # no usable mountinfo: try the usual fixed locations
        txt = _read(root + "/sys/fs/cgroup/cpu.max")
        if txt and not txt.startswith("max"):
            q, _, p = txt.partition(" ")
            try:
                lim = _quota_to_cpus(float(q), float(p or 100000))
                if lim:
                    limits.append(lim)
            except ValueError:
                pass
        for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup"):
            q = _read(root + os.path.join(base, "cpu.cfs_quota_us"))
            p = _read(root + os.path.join(base, "cpu.cfs_period_us"))
            if q and p:
                try:
                    lim = _quota_to_cpus(float(q), float(p))
                except ValueError:
                    lim = None
                if lim:
                    limits.append(lim)
                break
    return min(limits) if limits else None


_UNSET = object()
_cgroup_limit_cache: object = _UNSET


def _cgroup_limit_cached() -> Optional[int]:
    # The quota is read once per process (re-read in a fork child); it almost never
    # changes at run time and reading it costs tens of microseconds.
    global _cgroup_limit_cache
    if _cgroup_limit_cache is _UNSET:
        try:
            _cgroup_limit_cache = _cgroup_cpu_limit()
        except Exception:   # never let CPU counting break a computation
            _cgroup_limit_cache = None
    return _cgroup_limit_cache  # type: ignore[return-value]


def cpu_count_available() -> int:
    """CPUs this process may use: min(affinity/os.cpu_count(), cgroup CPU quota)."""
    n = _affinity_count()
    lim = _cgroup_limit_cached()
    if lim is not None:
        n = min(n, lim)
    return max(1, n)


# --------------------------------------------------------------------------- OpenMP runtime

_omp_max_threads_fn = None      # fastattn._kernels._cpu.omp_max_threads once importable
_omp_import_failed = False


def _omp_max_threads() -> Optional[int]:
    """omp_get_max_threads() of the kernels' OpenMP runtime for the calling thread."""
    global _omp_max_threads_fn, _omp_import_failed
    fn = _omp_max_threads_fn
    if fn is None:
        if _omp_import_failed:
            return None
        try:
            from fastattn._kernels import _cpu   # lazy: compiled by the lead's setup.py
            fn = _cpu.omp_max_threads
        except (ImportError, AttributeError):
            _omp_import_failed = True
            return None
        _omp_max_threads_fn = fn
    try:
        n = int(fn())
    except Exception:
        return None
    return n if n >= 1 else None


# OMP_NUM_THREADS + affinity + cgroup quota, cached for _OS_TTL seconds: reading them
# costs ~5 us per call, more than the rest of resolve_num_threads together.  Changes
# (os.environ, os.sched_setaffinity) are seen within _OS_TTL s, at once after
# refresh_cpu_info(), and in a fork child.
_OS_TTL = 1.0
_os_limit_cache = (0, -1e300)   # (value, time.monotonic() when computed)


def refresh_cpu_info() -> None:
    """Forget cached OMP_NUM_THREADS / affinity / cgroup values (re-read on next use)."""
    global _os_limit_cache, _cgroup_limit_cache
    _os_limit_cache = (0, -1e300)
    _cgroup_limit_cache = _UNSET


def _os_limit() -> int:
    global _os_limit_cache
    value, stamp = _os_limit_cache
    now = _monotonic()
    if now - stamp < _OS_TTL:
        return value
    n = cpu_count_available()
    env = _omp_num_threads_env()
    if env is not None:
        n = min(n, env)
    _os_limit_cache = (n, now)
    return n


def effective_num_threads() -> int:
    """Default thread count: min(OMP_NUM_THREADS, usable CPUs, omp_get_max_threads())."""
    n = _os_limit()
    omp = _omp_max_threads()
    if omp is not None:
        n = min(n, omp)
    return max(1, n)


# --------------------------------------------------------------------------- public API

def set_num_threads(n: Optional[int]) -> None:
    """Set the process-wide number of threads for fastattn calls.

    Applies to every Python thread, from the next call on, to the calls that
    pass no ``num_threads=`` and run outside a :func:`threads` block.

    Parameters
    ----------
    n : int or None
        Threads for every later call that passes no ``num_threads=`` (values
        above the CPU count are allowed: oversubscription is the caller's
        choice).  ``None`` restores the default: the smallest of
        ``OMP_NUM_THREADS``, the CPUs this process may run on (affinity and
        cgroup quota) and the OpenMP runtime's ``omp_get_max_threads()``,
        which ``threadpoolctl.threadpool_limits(n, user_api="openmp")`` lowers.

    Returns
    -------
    None
        Nothing: the setting is kept until the next call of this function.

    Raises
    ------
    TypeError
        ``n`` is not an int (a bool, a float or a string).
    ValueError
        ``n < 1`` or ``n >= 2**31``.

    See Also
    --------
    get_num_threads : The thread count a call would use now.
    threads : The same for a ``with`` block of the calling Python thread.

    Notes
    -----
    A call's own ``num_threads=`` and an active ``with fastattn.threads(...)``
    block of the calling thread take precedence over this setting.  Results do
    not depend on the thread count.

    Examples
    --------
    >>> import fastattn
    >>> fastattn.set_num_threads(1)
    >>> fastattn.get_num_threads()
    1
    >>> fastattn.set_num_threads(None)     # back to the default
    """
    global _global_num_threads
    value = None if n is None else _check_num_threads(n)
    with _lock:
        _global_num_threads = value


def _current_setting() -> int:
    override = getattr(_tls, "override", None)
    if override is not None:
        return override
    g = _global_num_threads
    if g is not None:
        return g
    return effective_num_threads()


def get_num_threads() -> int:
    """Number of threads a fastattn call with ``num_threads=None`` would use now.

    The answer depends on the calling Python thread (its :func:`threads`
    blocks) and on the moment: the default follows ``OMP_NUM_THREADS``, the
    CPU affinity and threadpoolctl limits as they change.

    Returns
    -------
    int
        The innermost active :func:`threads` block's count in the calling
        Python thread, else the :func:`set_num_threads` setting, else the
        default (the smallest of ``OMP_NUM_THREADS``, the usable CPUs and
        ``omp_get_max_threads()``).  1 in a forked child whose OpenMP pool
        could not be released before the fork.

    See Also
    --------
    set_num_threads : Change the process-wide setting.
    threads : Change it for a ``with`` block of the calling Python thread.

    Examples
    --------
    >>> import fastattn
    >>> n = fastattn.get_num_threads()
    >>> n >= 1
    True
    >>> with fastattn.threads(2):
    ...     fastattn.get_num_threads()
    2
    >>> fastattn.get_num_threads() == n
    True
    """
    if _forked_single_threaded:
        return 1
    return _current_setting()


@contextlib.contextmanager
def threads(n: Optional[int]) -> Iterator[int]:
    """Temporarily use ``n`` threads in the calling Python thread.

    A context manager: ``with fastattn.threads(4): ...``.  Meant for a part of
    a program (a test, a server's worker thread) that wants its own thread
    count without touching the process-wide setting.

    Parameters
    ----------
    n : int or None
        Threads for the fastattn calls made inside the ``with`` block by this
        Python thread (calls that pass ``num_threads=`` still use their own).
        ``None`` restores the default inside an outer block.

    Yields
    ------
    int
        The thread count that calls inside the block will use (the ``as``
        target).  Leaving the block restores the previous value, even on
        error.  Blocks nest, and blocks in different Python threads neither
        see nor clobber each other; threads started inside a block do not
        inherit it.

    Raises
    ------
    TypeError
        ``n`` is not an int (a bool, a float or a string).
    ValueError
        ``n < 1`` or ``n >= 2**31``.

    See Also
    --------
    set_num_threads : The process-wide setting.
    get_num_threads : The thread count a call would use now.

    Examples
    --------
    >>> import numpy as np
    >>> import fastattn
    >>> x = np.random.default_rng(0).standard_normal((4, 1000))
    >>> with fastattn.threads(1) as n:
    ...     w = fastattn.softmax(x)       # runs on one thread
    ...     print(n, fastattn.get_num_threads())
    1 1
    >>> print(np.allclose(w.sum(axis=-1), 1.0))
    True
    """
    value = None if n is None else _check_num_threads(n)
    prev = getattr(_tls, "override", None)
    _tls.override = value
    try:
        yield get_num_threads()
    finally:
        _tls.override = prev


def resolve_num_threads(num_threads: Optional[int] = None) -> int:
    """Thread count for one kernel call (called by every public entry point).

    ``None`` -> current setting; an explicit value is validated (int >= 1, not bool;
    numpy integers accepted) and used as given.  Always returns 1 in a fork child in
    which the OpenMP pool could not be released before the fork (see module doc).
    """
    n = _current_setting() if num_threads is None else _check_num_threads(num_threads)
    if _forked_single_threaded:
        return 1
    if n > 1:
        _tls.parallel_used = True   # this thread (may) now own an OpenMP pool
    return n


# --------------------------------------------------------------------------- fork safety

def _loaded_libgomp_paths() -> list:
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            i = line.find("/")
            if i < 0:
                continue
            path = line[i:].rstrip("\n")
            base = os.path.basename(path)
            if base.startswith("libgomp") and ".so" in base and path not in paths:
                paths.append(path)
    return paths


_gomp_handles: dict = {}


def _pause_libgomp() -> bool:
    """Release the calling thread's idle libgomp pool(s). True when it is safe to fork."""
    import ctypes
    ok = True
    for path in _loaded_libgomp_paths():
        lib = _gomp_handles.get(path)
        if lib is None:
            lib = ctypes.CDLL(path)   # already mapped: returns the same instance
            _gomp_handles[path] = lib
        pause = getattr(lib, "omp_pause_resource_all", None)
        if pause is None:
            ok = False
            continue
        pause.argtypes = [ctypes.c_int]
        pause.restype = ctypes.c_int
        before = lib.omp_get_max_threads()
        if pause(1) != 0:   # 1 == omp_pause_soft
            ok = False
        if lib.omp_get_max_threads() != before:   # keep e.g. a threadpoolctl limit
            lib.omp_set_num_threads(before)
    return ok


def _before_fork() -> None:
    global _last_fork_pause
    if _forked_single_threaded or not getattr(_tls, "parallel_used", False):
        _last_fork_pause = "not needed"
        return
    try:
        ok = sys.platform.startswith("linux") and _pause_libgomp()
    except Exception:
        ok = False
    if ok:
        _tls.parallel_used = False   # pool released; recreated on the next parallel call
        _last_fork_pause = "paused"
    else:
        _last_fork_pause = "failed"


def _after_in_child() -> None:
    global _forked_single_threaded
    if _last_fork_pause == "failed":
        _forked_single_threaded = True
    refresh_cpu_info()


def fork_state() -> dict:
    """Diagnostics: how the last fork was handled and whether this process is limited."""
    return {
        "mitigation": "os.register_at_fork" if hasattr(os, "register_at_fork") else "none",
        "last_fork": _last_fork_pause,
        "forked_single_threaded": _forked_single_threaded,
    }


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_in_child)
