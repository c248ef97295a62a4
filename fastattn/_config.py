"""``fastattn.show_config()``: what was built, what runs, and with how many threads.

Everything here is diagnostic and defensive: each piece of information comes from
an optional source (the compiled ``fastattn._kernels._cpu`` module, the
``fastattn._dispatch`` module, threadpoolctl) and a missing or failing source is
reported as such instead of raising.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from typing import Any, Dict, List, Optional, TextIO

__all__ = ["show_config", "get_config", "get_version"]

_DIST_NAME = "fastattn"


def _source_version() -> Optional[str]:
    """Version from the pyproject.toml next to the package (source checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "pyproject.toml")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        import tomllib   # Python 3.11+
        data = tomllib.loads(text)
        if data.get("project", {}).get("name") == _DIST_NAME:
            v = data["project"].get("version")
            return str(v) if v else None
        return None
    except ImportError:
        pass
    except Exception:
        return None
    m = re.search(r'(?ms)^\[project\].*?^version\s*=\s*"([^"]+)"', text)
    return m.group(1) if m else None


def get_version() -> str:
    """Installed distribution version; else the source tree's; else ``0+unknown``.

    ``fastattn/__init__.py`` should use this for ``__version__`` so that it always
    equals ``importlib.metadata.version("fastattn")`` for an installed package.
    """
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(_DIST_NAME)
        except PackageNotFoundError:
            pass
    except ImportError:   # pragma: no cover
        pass
    return _source_version() or "0+unknown"


# --------------------------------------------------------------------------- gathering

def _try(fn, *args, **kwargs):
    """(value, None) or (None, "ExcType: message")."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:   # diagnostics must never raise
        return None, f"{type(exc).__name__}: {exc}"


def _import(name: str):
    import importlib
    return importlib.import_module(name)


def _module_file(mod) -> Optional[str]:
    return getattr(mod, "__file__", None)


def get_config() -> Dict[str, Any]:
    """Return the information shown by :func:`show_config` as a dict."""
    cfg: Dict[str, Any] = {}
    cfg["version"] = get_version()
    cfg["python"] = f"{platform.python_implementation()} {platform.python_version()}"
    cfg["platform"] = f"{sys.platform} {platform.machine()}"
    np_mod, err = _try(_import, "numpy")
    cfg["numpy"] = getattr(np_mod, "__version__", None) if np_mod else f"unavailable ({err})"

    # ---- compiled helper module
    cpu, cpu_err = _try(_import, "fastattn._kernels._cpu")
    cfg["cpu_module"] = _module_file(cpu) if cpu else f"not importable ({cpu_err})"
    feats = None
    if cpu is not None and hasattr(cpu, "cpu_features"):
        feats, err = _try(cpu.cpu_features)
        if err:
            feats = f"error ({err})"
    cfg["cpu_features"] = feats
    supported = None
    if cpu is not None and hasattr(cpu, "supported_variants"):
        supported, err = _try(cpu.supported_variants)
        if err:
            supported = f"error ({err})"
    cfg["cpu_supported_variants"] = supported
    build = None
    if cpu is not None and hasattr(cpu, "build_info"):
        build, err = _try(cpu.build_info)
        if err:
            build = f"error ({err})"
    cfg["build_info"] = build
    omp_enabled = None
    if cpu is not None and hasattr(cpu, "openmp_enabled"):
        omp_enabled, _ = _try(cpu.openmp_enabled)
    cfg["openmp_enabled"] = omp_enabled

    # ---- dispatcher
    disp, disp_err = _try(_import, "fastattn._dispatch")
    if disp is not None:
        cfg["variant"] = getattr(disp, "VARIANT", None)
        try:
            from . import _variants
            table = {v.name: v for v in _variants.variants_for(None if disp.ARCH == "other" else disp.ARCH)}
            cfg["variant_description"] = table[cfg["variant"]].description
            cfg["variants_not_automatic"] = {
                v.name: "chosen automatically only on " + ", ".join(v.auto_vendors) + " CPUs"
                for v in table.values() if v.auto_vendors}
        except Exception as exc:   # show_config must never fail
            cfg["variant_description"] = f"unknown ({type(exc).__name__}: {exc})"
        avail = None
        if hasattr(disp, "available_variants"):
            avail, err = _try(disp.available_variants)
            if err:
                avail = f"error ({err})"
        cfg["available_variants"] = avail
    else:
        cfg["variant"] = f"unknown (fastattn._dispatch not importable: {disp_err})"
        cfg["available_variants"] = None
    cfg["FASTATTN_ISA"] = os.environ.get("FASTATTN_ISA")
    mem, _ = _try(_import, "fastattn._memory")
    if mem is not None:
        cfg["last_level_cache_bytes"], _ = _try(mem.last_level_cache_bytes)
        cfg["stream_min_bytes"], _ = _try(mem.stream_min_bytes)
        if cpu is not None and hasattr(mem, "prefetch_wide"):      # cpu: the helper module above
            vendor, _ = _try(cpu.cpu_vendor)
            cfg["prefetch_wide"], _ = _try(mem.prefetch_wide, vendor or "")
            if hasattr(mem, "prefetch_l2"):
                cfg["prefetch_l2"], _ = _try(mem.prefetch_l2, vendor or "")

    # ---- OpenMP runtimes actually loaded (threadpoolctl), after importing the kernels
    tpc, tpc_err = _try(_import, "threadpoolctl")
    if tpc is not None:
        info, err = _try(tpc.threadpool_info)
        if err:
            cfg["openmp_runtimes"] = f"threadpoolctl error ({err})"
        else:
            cfg["openmp_runtimes"] = [
                {k: d.get(k) for k in ("prefix", "filepath", "version", "num_threads")}
                for d in info if d.get("user_api") == "openmp"
            ]
            cfg["blas_runtimes"] = [
                {k: d.get(k) for k in ("internal_api", "filepath", "version", "num_threads")}
                for d in info if d.get("user_api") == "blas"
            ]
    else:
        cfg["openmp_runtimes"] = None   # threadpoolctl not installed

    # ---- threads
    try:
        from . import _threads
        cfg["threads"] = {
            "get_num_threads": _threads.get_num_threads(),
            "effective_default": _threads.effective_num_threads(),
            "set_num_threads": _threads._global_num_threads,
            "cpus_available": _threads.cpu_count_available(),
            "os.cpu_count": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "omp_get_max_threads": _threads._omp_max_threads(),
            "fork": _threads.fork_state(),
        }
    except Exception as exc:
        cfg["threads"] = f"error ({type(exc).__name__}: {exc})"
    return cfg


# --------------------------------------------------------------------------- formatting

def _fmt_features(feats) -> str:
    if feats is None:
        return "unknown (fastattn._kernels._cpu.cpu_features unavailable)"
    if isinstance(feats, str):
        return feats
    if not feats:
        return "none reported (not an x86 CPU)"
    have = [k for k, v in feats.items() if v]
    lack = [k for k, v in feats.items() if not v]
    s = " ".join(have) if have else "(none)"
    if lack:
        s += "   [missing: " + " ".join(lack) + "]"
    return s


def _fmt_list(x) -> str:
    if x is None:
        return "unknown"
    if isinstance(x, (list, tuple)):
        return ", ".join(map(str, x)) if x else "(none)"
    return str(x)


def _format(cfg: Dict[str, Any]) -> str:
    lines: List[str] = []
    add = lines.append
    add(f"fastattn {cfg['version']}")
    add(f"  python   : {cfg['python']} on {cfg['platform']}")
    add(f"  numpy    : {cfg['numpy']}")
    add("kernels")
    add(f"  variant in use      : {cfg['variant']}")
    add(f"  built variants      : {_fmt_list(cfg.get('available_variants'))}")
    add(f"  CPU can run         : {_fmt_list(cfg.get('cpu_supported_variants'))}")
    if cfg.get("variant_description"):
        add(f"  variant             : {cfg['variant_description']}")
    for name, why in (cfg.get("variants_not_automatic") or {}).items():
        add(f"  {name:<20}: {why} (FASTATTN_ISA={name} forces it)")
    add(f"  FASTATTN_ISA        : {cfg['FASTATTN_ISA'] or '(not set)'}")
    add(f"  helper module       : {cfg['cpu_module']}")
    if "stream_min_bytes" in cfg:
        llc, smin = cfg.get("last_level_cache_bytes"), cfg.get("stream_min_bytes")
        rule = (f"softmax out= of {smin >> 10} KiB or more written by streaming stores" if smin
                else "softmax out= never written by streaming stores")
        env = " (FASTATTN_STREAM_MIN_BYTES)" if os.environ.get("FASTATTN_STREAM_MIN_BYTES") else ""
        add(f"  last-level cache    : {f'{llc >> 10} KiB' if llc else 'unknown'}; {rule}{env}")
    if cfg.get("prefetch_wide") is not None:
        env = " (FASTATTN_PREFETCH_WIDE)" if os.environ.get("FASTATTN_PREFETCH_WIDE", "").strip() else ""
        add(f"  prefetch hints      : float32 / float64 rows of one-row decode units "
            f"{'prefetched' if cfg['prefetch_wide'] else 'left to the hardware prefetchers'}{env}")
    if cfg.get("prefetch_l2") is not None:
        env = " (FASTATTN_PREFETCH_L2)" if os.environ.get("FASTATTN_PREFETCH_L2", "").strip() else ""
        add(f"  prefetch level      : decode and query-vectorised key / value rows requested into "
            f"{'L2 (prefetcht1)' if cfg['prefetch_l2'] else 'L1 (prefetcht0)'}{env}")
    add(f"CPU features          : {_fmt_features(cfg['cpu_features'])}")
    add("OpenMP")
    oe = cfg["openmp_enabled"]
    add(f"  built with OpenMP   : {'unknown' if oe is None else ('yes' if oe else 'no (single-threaded kernels)')}")
    rts = cfg["openmp_runtimes"]
    if rts is None:
        add("  runtimes loaded     : unknown (install threadpoolctl to see them)")
    elif isinstance(rts, str):
        add(f"  runtimes loaded     : {rts}")
    elif not rts:
        add("  runtimes loaded     : none")
    else:
        for i, rt in enumerate(rts):
            head = "  runtimes loaded     : " if i == 0 else "                        "
            add(f"{head}{rt['prefix']} {rt['version'] or ''} num_threads={rt['num_threads']}  {rt['filepath']}")
        if len(rts) > 1:
            add("  WARNING: several OpenMP runtimes are loaded in this process; see the"
                " README section on mixing OpenMP runtimes.")
    blas = cfg.get("blas_runtimes")
    if blas:
        add("  BLAS (not used by fastattn kernels): " + "; ".join(
            f"{b['internal_api']} {b['version'] or ''} num_threads={b['num_threads']}" for b in blas))
    add("threads")
    th = cfg["threads"]
    if isinstance(th, dict):
        add(f"  in use (get_num_threads) : {th['get_num_threads']}")
        add(f"  set_num_threads          : {th['set_num_threads'] if th['set_num_threads'] is not None else '(default)'}")
        add(f"  effective default        : {th['effective_default']}"
            f"  = min(OMP_NUM_THREADS={th['OMP_NUM_THREADS'] or 'unset'},"
            f" usable CPUs={th['cpus_available']} of {th['os.cpu_count']},"
            f" omp_get_max_threads={th['omp_get_max_threads'] if th['omp_get_max_threads'] is not None else 'n/a'})")
        fk = th["fork"]
        add(f"  fork safety              : {fk['mitigation']}; last fork: {fk['last_fork'] or 'none'}"
            + ("; THIS IS A FORK CHILD LIMITED TO 1 THREAD" if fk["forked_single_threaded"] else ""))
    else:
        add(f"  {th}")
    add("build")
    b = cfg["build_info"]
    if b is None:
        add("  (fastattn._kernels._cpu.build_info unavailable)")
    elif isinstance(b, dict):
        for k, v in b.items():
            if isinstance(v, dict):
                v = "; ".join(f"{kk}: {(' '.join(map(str, vv)) or '(none)') if isinstance(vv, (list, tuple)) else vv}"
                              for kk, vv in v.items())
            elif isinstance(v, (list, tuple)):
                v = " ".join(map(str, v))
            add(f"  {k:<20}: {v}")
    else:
        add(f"  {b}")
    return "\n".join(lines) + "\n"


def show_config(file: Optional[TextIO] = None) -> str:
    """Print fastattn's build and runtime configuration; also return it as a string.

    Shows the versions (fastattn, Python, NumPy), the kernel variant in use and
    the variants built, the CPU features seen, the OpenMP runtimes loaded (with
    a warning when there are several) and the thread settings.  Include this
    output in bug reports (``fastattn info`` prints it too).

    Parameters
    ----------
    file : file-like, optional
        Where to print (anything with a ``write`` method).  Default
        ``sys.stdout``.

    Returns
    -------
    str
        The text printed.

    See Also
    --------
    get_num_threads : The thread count alone.

    Examples
    --------
    >>> import io
    >>> import fastattn
    >>> buf = io.StringIO()
    >>> text = fastattn.show_config(file=buf)
    >>> text == buf.getvalue()
    True
    >>> print(text.splitlines()[0] == "fastattn " + fastattn.__version__)
    True
    >>> "variant in use" in text
    True
    """
    text = _format(get_config())
    out = sys.stdout if file is None else file
    if out is not None:
        print(text, end="", file=out)
    return text


if __name__ == "__main__":   # python -m fastattn._config
    show_config()
