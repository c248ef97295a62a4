"""The one-line message for a fastattn whose compiled kernels are missing.

The usual way to get here is ``python -m fastattn`` (or ``python -c "import
fastattn"``) run in a source checkout that was never built in place: ``-m`` and
``-c`` put the working directory first on ``sys.path``, so the checkout's
``fastattn/`` -- Python files and Cython sources, no compiled modules -- shadows
any installed copy, and the first compiled import fails with ``cannot import
name '_cpu'``.  ``fastattn/__init__.py`` calls :func:`raise_if_unbuilt` when its
first import fails.  This module uses the standard library only, so that it
works in exactly that state.
"""
import importlib.machinery
import os
import platform
import shlex
import sys

# Every build compiles this module (the ISA variants depend on the platform), so
# its absence means "not built for this interpreter".
_PROBE = "_cpu"


def compiled_kernels_present(pkg_dir):
    """True when ``pkg_dir/_kernels`` holds the compiled ``_cpu`` module for this Python."""
    kernels = os.path.join(pkg_dir, "_kernels")
    return any(os.path.isfile(os.path.join(kernels, _PROBE + suffix))
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _built_for_other_pythons(pkg_dir):
    """Names of compiled ``_cpu`` modules this interpreter cannot load (a build for
    another Python version), sorted."""
    try:
        names = os.listdir(os.path.join(pkg_dir, "_kernels"))
    except OSError:
        return []
    return sorted(n for n in names
                  if n.startswith(_PROBE + ".") and n.endswith((".so", ".pyd")))


def source_root(pkg_dir):
    """The checkout that holds ``pkg_dir``, or None when it is not a source tree."""
    root = os.path.dirname(os.path.abspath(pkg_dir))
    if all(os.path.isfile(os.path.join(root, f)) for f in ("setup.py", "pyproject.toml")):
        return root
    return None


def installed_copy(pkg_dir, path=None):
    """Directory of another fastattn on ``path`` (default ``sys.path``) that is
    built for this Python, or None."""
    here = os.path.realpath(pkg_dir)
    for entry in sys.path if path is None else path:
        candidate = os.path.join(entry or os.getcwd(), "fastattn")
        if (os.path.realpath(candidate) != here
                and os.path.isfile(os.path.join(candidate, "__init__.py"))
                and compiled_kernels_present(candidate)):
            return candidate
    return None


def unbuilt_message(pkg_dir, installed=None, command=None):
    """The one-line explanation and what to run instead.

    Parameters
    ----------
    pkg_dir : str
        The ``fastattn`` package directory that was imported.
    installed : str or None
        Another, built fastattn on ``sys.path`` (see :func:`installed_copy`).
    command : str or None
        The console command equivalent to what the user ran (``"fastattn bench"``)
        when it was ``python -m fastattn ...``; None for a plain import.

    Returns
    -------
    str
        One line starting with ``"fastattn: "``.
    """
    python = f"{platform.python_implementation()} {platform.python_version()}"
    other = _built_for_other_pythons(pkg_dir)
    missing = (f"no compiled kernels for {python} in {os.path.join(pkg_dir, '_kernels')}"
               + (f" (only {', '.join(other)}, built for another Python)" if other else ""))
    root = source_root(pkg_dir)
    if root is None:
        return (f"fastattn: {missing}: this installation is incomplete; reinstall it "
                f"(`pip install --force-reinstall fastattn`)")
    build = "or build in place with `python setup.py build_ext --inplace`"
    if installed and command:
        return (f"fastattn: `python -m fastattn` in the checkout {root} runs its unbuilt source "
                f"tree (the current directory comes first on sys.path), not the installed "
                f"fastattn in {installed}; run `{command}` instead, or run Python from another "
                f"directory, {build}")
    if installed:
        return (f"fastattn: Python imported the unbuilt source tree in {root} (the current "
                f"directory comes first on sys.path) instead of the installed fastattn in "
                f"{installed}; start Python outside the checkout, {build}")
    return (f"fastattn: this source tree is not built ({missing}); "
            f"run `pip install .` and then `fastattn` (or Python started outside the "
            f"checkout), {build}")


def _dash_m_module():
    """The module named after ``-m`` on this interpreter's command line, or None."""
    argv = getattr(sys, "orig_argv", [])
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m"):
            return arg[2:]
    return None


def raise_if_unbuilt(exc, pkg_dir):
    """Replace ``exc`` (the package's first import failing) by the one-line message
    when ``pkg_dir`` has no compiled kernels; return quietly when it has them (then
    ``exc`` is the real problem and the caller re-raises it).

    Raises
    ------
    SystemExit
        During ``python -m fastattn``: an ImportError raised while runpy locates
        ``fastattn.__main__`` would reach the user as a traceback; SystemExit
        prints just the message and exits with status 1.
    ImportError
        Otherwise, with the message (``exc`` as its cause).
    """
    if compiled_kernels_present(pkg_dir):
        return
    # While `python -m` locates the module to run, sys.argv[0] is "-m" and the
    # rest of sys.argv is the command's arguments (documented under -m).
    via_dash_m = sys.argv[:1] == ["-m"]
    command = (shlex.join(["fastattn", *sys.argv[1:]])
               if via_dash_m and _dash_m_module() == "fastattn" else None)
    message = unbuilt_message(pkg_dir, installed_copy(pkg_dir), command)
    if via_dash_m:
        raise SystemExit(message)
    raise ImportError(message) from exc
