#!/usr/bin/env bash
# Build fastattn with clang + LLVM's OpenMP (libomp) instead of GCC and run the test suite
# against that build: the nearest check of Apple clang (every macOS build) that a Linux
# box allows.
#
#   1. the tracked files of the checkout (working-tree contents) are copied to a temp dir,
#      so the checkout's own in-place (GCC) build is neither used nor overwritten;
#   2. every kernel variant of the target is built there with CC=clang (setup.py gives
#      clang -ffp-contract=on and links with -fopenmp, i.e. libomp);
#   3. it is checked that clang and libomp were really used: the build info of
#      fastattn.show_config(), the .comment section of every module, and that every module
#      links libomp and not GCC's libgomp;
#   4. the test suite runs from the copy (its fastattn first on sys.path) but for the
#      files that exercise no compiled code of their own (CLANG_SKIP: the transformers,
#      torch and dask integrations, the CLI, the README / docstring / packaging checks,
#      the pure-Python reference): what a compiler can change -- every kernel test, the
#      accuracy and hypothesis tests, and the OpenMP runtime (threads, fork, interrupt,
#      stress) under libomp -- all runs, and the skipped files run against the GCC build
#      in .ci/run step 1 (146 s -> ~85 s); then the correctness files once more on every
#      other variant this CPU runs (FASTATTN_ISA) but avx512 when the default is avx512_bf16 / _amx.
#   The modules are built with -g0 (no debug info: a faster compile, same code).
#
# Usage: tools/clang_check.sh
# Environment:
#   PYTHON=python3                interpreter (needs setuptools, Cython, numpy + the test deps)
#   CLANG=clang                   the compiler (clang-14, clang-19, ...)
#   PYTEST_ARGS="..."             instead of the default "tests" less CLANG_SKIP
#   CLANG_SKIP="..."              test files left out of the default run ("" = none)
#   VARIANT_TESTS="..."           the files run per other variant ("" skips that step)
#   KEEP_WORK=1                   keep the temporary directory
# Installs clang and libomp-dev with apt-get when they are missing (as root).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

CLANG="${CLANG:-clang}"
fa_workdir clang    # kept on failure or with KEEP_WORK=1

omp_ok() {   # clang compiles and links an OpenMP program
    printf '#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n' >"$WORK/omp.c"
    "$CLANG" -fopenmp "$WORK/omp.c" -o "$WORK/omp" >/dev/null 2>&1
}
if ! command -v "$CLANG" >/dev/null || ! omp_ok; then
    echo "== installing clang + libomp-dev"
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "need $CLANG with libomp (Debian: apt-get install clang libomp-dev)" >&2; exit 2
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libomp-dev >/dev/null
    omp_ok || { echo "$CLANG still cannot build an OpenMP program" >&2; exit 2; }
fi
echo "== $("$CLANG" --version | head -1), OpenMP runtime: $(ldd "$WORK/omp" | grep -oE 'lib(g?omp)[^ ]*' | head -1)"

echo "== copy the tracked tree to $WORK/src"
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -z | xargs -0 cp --parents -t "$WORK/src" 2>/dev/null) || \
    (cd "$ROOT" && git ls-files -z | while IFS= read -r -d '' f; do
        [[ -e "$f" ]] && cp --parents -t "$WORK/src" "$f"; done)   # a deleted, uncommitted file
cd "$WORK/src"

echo "== build every variant with CC=$CLANG"
t=$SECONDS
# LDSHARED too: Python's own (gcc -shared ...) would link with GCC and libgomp
ldshared="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LDSHARED") or "")')"
ldshared="$CLANG ${ldshared#* }"
CC="$CLANG" LDSHARED="$ldshared" CFLAGS="${CFLAGS:-} -g0" "$PY" setup.py build_ext --inplace -j 2 >"$WORK/build.log" 2>&1 || {
    tail -30 "$WORK/build.log"; exit 1; }
echo "   built in $((SECONDS - t))s: $(ls fastattn/_kernels/*.so | xargs -n1 basename | tr '\n' ' ')"

echo "== clang and libomp were used"
"$PY" - <<'EOF'
import fastattn
from fastattn._kernels import _cpu
info = _cpu.build_info()
print("   build info:", {k: info.get(k) for k in ("compiler_kind", "compiler", "compiler_version",
                                                   "openmp", "openmp_flags", "compiler_flags")})
assert fastattn.__file__.startswith(__import__("os").getcwd()), fastattn.__file__
assert info.get("compiler_kind") == "clang", info
assert info["compiler_version"].startswith("clang"), info
assert info["openmp"] and "-ffp-contract=on" in info["compiler_flags"], info
text = fastattn.show_config(file=__import__("io").StringIO())
print("   show_config:", "; ".join(l.strip() for l in text.splitlines()
                                    if any(w in l.lower() for w in ("variant", "openmp", "compiler")))[:600])
EOF
for so in fastattn/_kernels/*.so; do
    comment=$(readelf -p .comment "$so" 2>/dev/null | grep -oE '(clang|GCC)[^]]*' | sort -u | tr '\n' ';')
    libs=$(ldd "$so" | grep -oE 'lib(g?omp)[^ ]*' | sort -u | tr '\n' ' ')
    echo "   $(basename "$so"): libs [$libs] .comment [$comment]"
    [[ "$libs" == *libomp* && "$libs" != *libgomp* ]] || { echo "   $so does not link libomp alone" >&2; exit 1; }
    [[ "$comment" == *clang* ]] || { echo "   $so: no clang in .comment" >&2; exit 1; }
done

echo "== test suite against the clang build"
t=$SECONDS
SKIP="${CLANG_SKIP-test_transformers_backend test_transformers_zoo test_torch_integration test_dask
      test_cli test_example_train test_readme test_docstrings test_packaging test_smoke_tool
      test_reference test_reference_backward test_reference_sinks}"
IGNORE=()
for f in $SKIP; do
    [[ -e "tests/$f.py" ]] || { echo "CLANG_SKIP: no tests/$f.py" >&2; exit 1; }
    IGNORE+=("--ignore=tests/$f.py")
done
if [[ -n "${PYTEST_ARGS:-}" ]]; then IGNORE=(); fi
echo "   (left out, compiler-independent: ${SKIP//$'\n'/ })"
# shellcheck disable=SC2086
"$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} ${IGNORE[@]+"${IGNORE[@]}"}
echo "   suite: $((SECONDS - t))s"

VT="${VARIANT_TESTS-tests/test_seed.py tests/test_attention.py tests/test_semantics.py tests/test_storage.py tests/test_backward.py tests/test_varlen.py}"
if [[ -n "$VT" ]]; then
    # Not the variant the default one extends by bfloat16 dot products or tiles alone
    # (avx512 under avx512_bf16 / avx512_amx): the same source, every float32 / float64 path the same code,
    # which the suite above ran under clang (~25 s saved; GCC's build of it runs these
    # files in .ci/run step 2)
    others=$("$PY" -c "from fastattn import _dispatch as d; print(' '.join(v for v in d.available_variants() if v != d.VARIANT and not (v == 'avx512' and d.VARIANT.startswith('avx512_'))))")
    for isa in $others; do
        echo "== FASTATTN_ISA=$isa (clang build)"
        # shellcheck disable=SC2086
        FASTATTN_ISA=$isa "$PY" -m pytest -q -p no:cacheprovider $VT
    done
fi
echo "clang_check.sh: OK ($((SECONDS - T0))s)"
