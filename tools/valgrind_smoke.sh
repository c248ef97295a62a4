#!/usr/bin/env bash
# valgrind memcheck over tools/smoke.py (every public function and option, small shapes).
#
#   tools/valgrind_smoke.sh            # builds a scratch copy of the tree with -g (default)
#   VALGRIND_USE_CHECKOUT=1 tools/valgrind_smoke.sh   # use the checkout's in-place build
#
# PYTHONMALLOC=malloc makes CPython allocate with malloc so memcheck sees every
# block; CPython's own noise is filtered with valgrind's python3.supp when present.
# Fails when any "Invalid read" / "Invalid write" / uninitialised-value error has a
# fastattn frame in its stack (errors entirely inside CPython/NumPy are counted and
# listed but do not fail the run).  Runs every kernel variant valgrind can execute
# (valgrind has no AVX-512, so the CPU it emulates never offers the avx512 kernels).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

PY=$("$PY" -c 'import sys; print(sys.executable)')   # the real binary, not a pyenv/venv shim script
command -v valgrind >/dev/null || { echo "valgrind_smoke: valgrind not installed"; exit 1; }
fa_workdir valgrind VALGRIND_KEEP     # removed at exit unless VALGRIND_KEEP=1 (set below on a failure)

if [ "${VALGRIND_USE_CHECKOUT:-0}" = 1 ]; then
    SRC=$ROOT
else
    SRC=$WORK/src
    mkdir -p "$SRC"
    echo "== copying the source tree to $SRC and building with -g"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done \
        | tar --null -T - -cf -) | tar -xf - -C "$SRC"
    (cd "$SRC" && CFLAGS="-g" "$PY" setup.py -q build_ext --inplace -j 2 >"$WORK/build.log" 2>&1) \
        || { tail -40 "$WORK/build.log"; echo "valgrind_smoke: BUILD FAILED"; exit 1; }
fi

SUPP=()
for s in /usr/lib/valgrind/python3.supp /usr/lib/x86_64-linux-gnu/valgrind/python3.supp \
         "$(dirname "$(command -v valgrind)")/../lib/valgrind/python3.supp"; do
    [ -f "$s" ] && { SUPP=(--suppressions="$s"); break; }
done

# valgrind cannot execute AVX-512 instructions: never run the avx512 kernels under it
VARIANTS=$(cd "$SRC" && "$PY" -c \
    "from fastattn import _dispatch; print(' '.join(v for v in _dispatch.available_variants() if v != 'avx512'))")
echo "== kernel variants under valgrind: $VARIANTS"

STATUS=0
TOTAL_OURS=0
for isa in $VARIANTS; do
    LOG=$WORK/memcheck-$isa.log
    echo "== memcheck, FASTATTN_ISA=$isa"
    set +e
    (cd "$SRC" && PYTHONMALLOC=malloc FASTATTN_ISA=$isa OMP_NUM_THREADS=2 \
        valgrind --tool=memcheck --error-limit=no --num-callers=40 --track-origins=yes \
                 "${SUPP[@]}" --log-file="$LOG" "$PY" tools/smoke.py --quick)
    rc=$?
    set -e
    [ $rc -ne 0 ] && { echo "   smoke.py exited with $rc"; STATUS=1; }
    # split the log into error blocks (a header line up to the next blank "==PID== " line)
    read -r ALL OURS < <(awk '
        /^==[0-9]+== (Invalid (read|write|free)|Conditional jump or move depends on uninitialised|Use of uninitialised|Syscall param .* uninitialised|Mismatched free)/ {
            inblk = 1; n++; blk = $0; next }
        inblk && /^==[0-9]+== *$/ { if (blk ~ /fastattn|_attn_|simd_body|simd\.h/) { m++; print blk > "/dev/stderr" } inblk = 0; next }
        inblk { blk = blk "\n" $0 }
        END { print n + 0, m + 0 }' "$LOG" 2>"$WORK/ours-$isa.txt")
    SUMMARY=$(grep "ERROR SUMMARY" "$LOG" | tail -1 | sed 's/^==[0-9]*== //' || true)
    echo "   $SUMMARY"
    echo "   invalid-access / uninitialised errors: $ALL total, $OURS with a fastattn frame"
    if [ "$OURS" -ne 0 ]; then
        head -80 "$WORK/ours-$isa.txt"
        STATUS=1
        # shellcheck disable=SC2034  # read at exit by fa_workdir's trap
        VALGRIND_KEEP=1
    fi
    TOTAL_OURS=$((TOTAL_OURS + OURS))
done
if [ $STATUS -ne 0 ]; then
    echo "valgrind_smoke: FAILED ($TOTAL_OURS error(s) in fastattn; logs in $WORK)"
    exit 1
fi
echo "valgrind_smoke: OK"
