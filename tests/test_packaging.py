"""Packaging checks: typing (py.typed + stubs), version metadata, shipped modules.

Runs against whichever ``fastattn`` is importable: the source tree (after
``python setup.py build_ext --inplace``) or an installed wheel
(``tools/check_wheel.sh`` runs the suite from outside the source tree).
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import platform
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest


def _package_dir() -> Path:
    # find_spec does not execute fastattn/__init__.py, so the typing tests run even
    # when the compiled kernels are missing.
    spec = importlib.util.find_spec("fastattn")
    assert spec is not None and spec.submodule_search_locations, "fastattn is not importable"
    return Path(list(spec.submodule_search_locations)[0]).resolve()


PKG = _package_dir()

PUBLIC = [
    "attention", "scaled_dot_product_attention", "softmax", "log_softmax",
    "merge_attention", "set_num_threads", "get_num_threads", "threads",
    "show_config", "reference", "__version__",
]


def _installed_from_site_packages() -> bool:
    import sysconfig
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return any(Path(r).resolve() == PKG.parent for r in roots)


def test_typing_files_present():
    assert (PKG / "py.typed").is_file(), "fastattn/py.typed missing (PEP 561 marker)"
    assert (PKG / "__init__.pyi").is_file()
    assert (PKG / "reference.pyi").is_file()


def test_stub_names_exist_at_runtime():
    import fastattn

    tree = ast.parse((PKG / "__init__.pyi").read_text())
    stub_names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stub_names.add(node.name)
        elif isinstance(node, ast.Assign):
            stub_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub_names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and node.module is None:
            stub_names.update(a.asname or a.name for a in node.names)
    stub_names = {n for n in stub_names if not n.startswith("_") or n == "__version__"}
    missing = sorted(n for n in stub_names if not hasattr(fastattn, n))
    assert not missing, f"names in __init__.pyi but not in the fastattn module: {missing}"
    undeclared = sorted(n for n in PUBLIC if n not in stub_names)
    assert not undeclared, f"public names without a stub: {undeclared}"
    runtime_all = getattr(fastattn, "__all__", None)
    if runtime_all is not None:
        unstubbed = sorted(set(runtime_all) - stub_names)
        assert not unstubbed, f"fastattn.__all__ names missing from __init__.pyi: {unstubbed}"


def _stub_params(func_name: str) -> list[list[str]]:
    tree = ast.parse((PKG / "__init__.pyi").read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func_name:
            a = node.args
            out.append([x.arg for x in a.posonlyargs + a.args + a.kwonlyargs])
    return out


@pytest.mark.parametrize("name", ["attention", "attention_backward", "softmax", "log_softmax",
                                  "merge_attention", "set_num_threads", "threads", "show_config"])
def test_stub_parameters_match_runtime(name):
    import fastattn

    try:
        sig = inspect.signature(getattr(fastattn, name))
    except (TypeError, ValueError):
        pytest.skip(f"no introspectable signature for fastattn.{name}")
    runtime = [p.name for p in sig.parameters.values()
               if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for params in _stub_params(name):
        assert params == runtime, f"{name}: stub parameters {params} != runtime {runtime}"


def test_version_matches_metadata():
    import fastattn

    try:
        dist_version = importlib.metadata.version("fastattn")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fastattn is not installed (source-tree run); nothing to compare")
    assert isinstance(fastattn.__version__, str)
    assert fastattn.__version__ == dist_version


def test_compiled_modules_shipped():
    from fastattn import _variants

    arch = _variants.arch_of(platform.machine())
    names = ["fastattn._kernels._cpu"] + [f"fastattn._kernels._attn_{v.name}" for v in _variants.variants_to_build(arch, sysconfig.get_platform())]
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    assert not missing, f"compiled modules missing: {missing}"
    import fastattn._kernels._cpu as cpu   # baseline-compiled: imports on any CPU

    assert isinstance(cpu.cpu_features(), dict)
    assert cpu.omp_max_threads() >= 1


def test_show_config_smoke(capsys):
    import io

    import fastattn

    buf = io.StringIO()
    text = fastattn.show_config(file=buf)
    assert text == buf.getvalue()
    assert fastattn.__version__ in text
    assert "variant in use" in text
    text2 = fastattn.show_config()
    assert capsys.readouterr().out == text2


# --------------------------------------------------------------------------- mypy

GOOD_SCRIPT = """
from typing import Any

import numpy as np
from numpy.typing import NDArray
from typing_extensions import assert_type

import fastattn
from fastattn import reference

F = NDArray[np.floating[Any]]
q = np.zeros((2, 4, 8), dtype=np.float32)
mask = np.ones((4, 4), dtype=bool)

out = fastattn.attention(q, q, q)
assert_type(out, F)
out = fastattn.attention(q, q, q, scale=0.5, causal=True, mask=mask, bias=None,
                         window=(3, None), kv_lengths=[4, 3], softcap=30.0,
                         alibi_slopes=None, out=np.empty_like(q), num_threads=2)
out = fastattn.attention(q, q, q, causal="bottom_right", window=2)
o1, w1 = fastattn.attention(q, q, q, return_weights=True)
assert_type(o1, F)
o2, lse = fastattn.attention(q, q, q, return_lse=True)
assert_type(lse, F)
o3, w3, l3 = fastattn.attention(q, q, q, return_weights=True, return_lse=True)
flag = bool(q.size)
r = fastattn.attention(q, q, q, return_lse=flag)
assert_type(r, F | tuple[F, ...])
o4 = fastattn.scaled_dot_product_attention(q, q, q, mask, is_causal=False, scale=0.5)
assert_type(o4, F)
m, mlse = fastattn.merge_attention([o2, o2], [lse, lse])
assert_type(m, F)
s = fastattn.softmax(q)
s = fastattn.softmax(q, axis=None, num_threads=1)
ls = fastattn.log_softmax([1.0, 2.0], -1, out=np.empty(2))
fastattn.set_num_threads(4)
fastattn.set_num_threads(None)
n: int = fastattn.get_num_threads()
with fastattn.threads(2) as k:
    assert_type(k, int)
txt: str = fastattn.show_config()
v: str = fastattn.__version__
ref = reference.attention(q, q, q, causal=True)
assert_type(ref, NDArray[np.float64])
rs = reference.softmax(q, axis=0)
"""

# (line fragment, expected mypy error code)
BAD_LINES = [
    ("fastattn.softmax(q, axis='a')", "arg-type"),
    ("fastattn.attention(q, q, q, causal='top')", "call-overload"),
    ("fastattn.attention(q, q, q, windw=3)", "call-overload"),
    ("fastattn.set_num_threads(2.5)", "arg-type"),
    ("bad: int = fastattn.attention(q, q, q)", "assignment"),
    ("o, lse = fastattn.attention(q, q, q, return_lse=True); lse.no_attr", "attr-defined"),
    ("fastattn.no_such_function()", "attr-defined"),
]


@pytest.fixture(scope="module")
def mypy_env(tmp_path_factory):
    pytest.importorskip("mypy")
    cache = tmp_path_factory.mktemp("mypy_cache")
    env = dict(os.environ)
    if not _installed_from_site_packages():
        # source checkout / inplace build: point mypy at the tree explicitly
        env["MYPYPATH"] = str(PKG.parent)
    return env, cache


def _mypy(script: Path, env, cache) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
           "--show-error-codes", "--cache-dir", str(cache),
           "--python-executable", sys.executable, str(script)]
    return subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True,
                          text=True, timeout=600)


def test_mypy_accepts_public_api_usage(tmp_path, mypy_env):
    env, cache = mypy_env
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(GOOD_SCRIPT))
    res = _mypy(script, env, cache)
    assert res.returncode == 0, f"mypy failed:\n{res.stdout}\n{res.stderr}"


def test_mypy_rejects_misuse(tmp_path, mypy_env):
    env, cache = mypy_env
    head = "import numpy as np\nimport fastattn\nq = np.zeros((2, 3))\n"
    script = tmp_path / "bad_script.py"
    script.write_text(head + "\n".join(line for line, _ in BAD_LINES) + "\n")
    res = _mypy(script, env, cache)
    assert res.returncode == 1, f"mypy should fail:\n{res.stdout}\n{res.stderr}"
    first = head.count("\n") + 1
    for i, (line, code) in enumerate(BAD_LINES):
        tag = f"bad_script.py:{first + i}:"
        hits = [ln for ln in res.stdout.splitlines() if tag in ln and "error" in ln]
        errors = "\n".join(ln for ln in res.stdout.splitlines() if ": error:" in ln)
        assert hits, f"mypy did not flag line {first + i}: {line!r}\n{errors}"
        assert any(f"[{code}]" in h for h in hits), f"{line!r}: expected [{code}], got {hits}"
