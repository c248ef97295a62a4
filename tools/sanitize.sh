#!/usr/bin/env bash
# Build fastattn with AddressSanitizer + UndefinedBehaviorSanitizer in a scratch copy
# of the source tree (the checkout's own .so files are never touched), then run
# tools/smoke.py under every kernel variant this CPU supports and a smoke subset of
# the test suite.  Fails when a test fails or any sanitizer report mentions fastattn.
#
# Only the variants this CPU can execute are built: sanitizers check at run time, and a
# module this CPU cannot import (avx512 on an AVX2 machine) would only cost build time
# (its plain compile is checked by the other CI steps).  They are chosen from the
# checkout's variant table and the CPU features that an installed fastattn reports
# (CI installs it from the checkout first); without one, every variant is built.  After
# the build its own dispatcher must find every variant this CPU executes (a missed one
# is built then).
#
#   tools/sanitize.sh [extra pytest args]
#
# Environment:
#   SANITIZE_TESTS   test files to run (default: a smoke subset, see below)
#   SANITIZE_KEEP=1  keep the scratch directory (printed at the end)
#   FASTATTN_VARIANTS=a,b  build exactly these variants (default: those this CPU executes)
#   SANITIZE_UB_ALL=1  UBSan in every module; by default the vector variants get ASan alone
#                    and baseline and _cpu both: UBSan's checks are most of a sanitized
#                    compile (the avx512_bf16 module: 620 s with both on one core, 223 s
#                    with ASan alone), and its integer and index arithmetic is the shared
#                    source that the baseline module compiles too
#   PYTHON           interpreter (default: python3)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

CC_=${CC:-gcc}
fa_workdir sanitize SANITIZE_KEEP     # removed at exit unless SANITIZE_KEEP=1 (set below on a failure)
LOGDIR="$WORK/logs"
mkdir -p "$WORK/src" "$LOGDIR"

echo "== copying the source tree (tracked + untracked, not ignored) to $WORK/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done \
    | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

ASAN_LIB=$("$CC_" -print-file-name=libasan.so)
UBSAN_LIB=$("$CC_" -print-file-name=libubsan.so)
[ -e "$ASAN_LIB" ] || { echo "sanitize: libasan not found ($ASAN_LIB)"; exit 1; }
PRELOAD="$ASAN_LIB"
[ -e "$UBSAN_LIB" ] && PRELOAD="$PRELOAD:$UBSAN_LIB"

build() {  # build FASTATTN_VARIANTS=$1 ("" = every variant; in place, up-to-date modules kept)
    local asan_only=""
    if [ "${SANITIZE_UB_ALL:-0}" != 1 ]; then
        asan_only=$(echo "$1" | tr ',' '\n' | grep -v -x -e baseline -e '' | paste -sd, -) || true
    fi
    echo "== building with FASTATTN_SANITIZE=1 FASTATTN_VARIANTS=${1:-<every variant>}" \
         "(ASan alone: ${asan_only:-none})"
    (cd "$WORK/src" && FASTATTN_SANITIZE=1 FASTATTN_SANITIZE_ADDRESS_ONLY="$asan_only" FASTATTN_VARIANTS="$1" \
        "$PY" setup.py -q build_ext --inplace -j 2 \
        >>"$LOGDIR/build.log" 2>&1) || { tail -50 "$LOGDIR/build.log"; echo "sanitize: BUILD FAILED"; exit 1; }
}
# the variants this CPU executes ("" = every variant: no installed fastattn to ask)
cpu_variants() {
    (cd / && "$PY" - "$WORK/src/fastattn/_variants.py" 2>/dev/null <<'EOF'
import runpy, sys
from fastattn._kernels import _cpu
arch = _cpu.target_arch()
t = runpy.run_path(sys.argv[1])
print(",".join(t["supported"](None if arch == "other" else arch, _cpu.cpu_features(), _cpu.cpu_vendor())[0]))
EOF
    ) || true
}
WANT=${FASTATTN_VARIANTS:-$(cpu_variants)}
build "$WANT"
if [ -z "${FASTATTN_VARIANTS:-}" ]; then
    MISSING=$(cd "$WORK/src" && ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$PRELOAD" PYTHONPATH="$WORK/src" "$PY" -c \
        "from fastattn import _dispatch as d; print(','.join(v for v in d._supported()[0] if not d._built(v)))") \
        || { echo "sanitize: the sanitized build does not import"; exit 1; }
    if [ -n "$MISSING" ]; then
        echo "   this CPU also executes: $MISSING"
        rm -f "$WORK"/src/fastattn/_kernels/_cpu.*.so     # rebuilt: its build info lists the variants
        build "$WANT,$MISSING"
    fi
fi

# detect_leaks=0: CPython leaks by design.  allocator_may_return_null=1: the tests
# check that impossible allocations raise MemoryError instead of aborting.
# Reports go to per-process files in $LOGDIR (log_path) as well as to stderr.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:halt_on_error=1:log_path=$LOGDIR/asan:print_summary=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$LOGDIR/ubsan"
export PYTHONPATH="$WORK/src"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONFAULTHANDLER=1

run() {  # run CMD... with the sanitizer runtime preloaded; output kept in a log
    local name=$1; shift
    echo "== $name"
    set +e
    (cd "$WORK/src" && LD_PRELOAD="$PRELOAD" "$@") >"$LOGDIR/$name.out" 2>&1
    local rc=$?
    set -e
    tail -3 "$LOGDIR/$name.out"
    if [ $rc -ne 0 ]; then
        echo "   -> exit status $rc"
        FAILED="$FAILED $name"
    fi
}
FAILED=""

# the scratch build, not the checkout, must be the one imported
(cd "$WORK/src" && LD_PRELOAD="$PRELOAD" "$PY" -c "import fastattn, sys; f = fastattn.__file__; print('fastattn from', f); sys.exit(not f.startswith('$WORK/src'))") \
    || { echo "sanitize: the sanitized build is not the one imported"; exit 1; }

VARIANTS=$(cd "$WORK/src" && LD_PRELOAD="$PRELOAD" "$PY" -c "from fastattn import _dispatch; print(' '.join(_dispatch.available_variants()))")
for isa in $VARIANTS; do
    run "smoke-$isa" env FASTATTN_ISA="$isa" "$PY" tools/smoke.py
done

TESTS=${SANITIZE_TESTS:-"tests/test_attention.py tests/test_errors.py tests/test_softmax.py tests/test_semantics.py tests/test_hardening.py"}
# shellcheck disable=SC2086
run pytest "$PY" -m pytest -q -x -p no:cacheprovider $TESTS -k "not speedup and not rss" "$@"
if [ -e "$WORK/src/tests/test_hypothesis.py" ]; then
    run hypothesis env FASTATTN_HYPOTHESIS_PROFILE=${FASTATTN_HYPOTHESIS_PROFILE:-ci} \
        "$PY" -m pytest -q -x -p no:cacheprovider tests/test_hypothesis.py
fi

# every sanitizer report; fail on those that mention fastattn
shopt -s nullglob
REPORTS=("$LOGDIR"/asan.* "$LOGDIR"/ubsan.*)
OURS=0
for r in "${REPORTS[@]}"; do
    if grep -q "fastattn\|_attn_\|simd_body\|simd\.h" "$r"; then
        OURS=$((OURS + 1))
        echo "---- sanitizer report in fastattn: $r"
        head -60 "$r"
    else
        echo "---- sanitizer report outside fastattn (ignored): $r"
        head -15 "$r"
    fi
done
INLINE=$(cat "$LOGDIR"/*.out | grep -c "runtime error:\|ERROR: AddressSanitizer" || true)

echo "== summary: ${#REPORTS[@]} sanitizer report file(s), $OURS mentioning fastattn," \
     "$INLINE report line(s) in test output; failed steps:${FAILED:- none}"
if [ "$OURS" -ne 0 ] || [ -n "$FAILED" ]; then
    # shellcheck disable=SC2034  # read at exit by fa_workdir's trap
    SANITIZE_KEEP=1
    echo "sanitize: FAILED (logs in $LOGDIR)"
    exit 1
fi
echo "sanitize: OK"
