#!/usr/bin/env bash
# Compile fastattn's extension modules for a Windows x86-64 target, on Linux: the nearest
# check of a Windows build that this machine allows (nothing is linked or run).
#
#   1. the tracked kernel sources are copied to a temp dir, one _attn_<name>.pyx stub is
#      written per x86-64 variant of fastattn/_variants.py (as setup.py writes them) and
#      every module (_cpu + the variants) is cythonized with the host's Cython;
#   2. each generated C file is compiled (-c, no link) for x86_64 Windows with
#        mingw:  x86_64-w64-mingw32-gcc (Debian's MinGW-w64 GCC 12, its libgomp omp.h),
#                every module (_cpu + every variant)
#        clang:  clang --target=x86_64-w64-windows-gnu (Debian's clang, MinGW-w64 headers),
#                _cpu and ONE variant (WIN_CLANG_VARIANTS, default avx2)
#      with the flags setup.py gives that compiler kind (-O3 -fno-math-errno
#      -fno-trapping-math, -ffp-contract=fast for GCC / =on for clang, the variant's
#      -march flags, -fopenmp, FA_ISA_HEADER / FA_VARIANT / FASTATTN_HAVE_OPENMP=1), and
#      -Werror=implicit-function-declaration, so a POSIX-only function without a
#      declaration in the Windows headers fails the compile;
#   3. the objects' undefined symbols (x86_64-w64-mingw32-nm -u) are searched for
#      POSIX-only names (pthread_*, sched_getaffinity, clock_gettime, posix_memalign,
#      aligned_alloc, sysconf, ...): MinGW's winpthreads would hide a pthread call from
#      step 2, and clang-cl / MSVC's CRT has none of them;
#   4. the MinGW objects are linked into .pyd files (see below; WIN_LINK=0 skips it);
#   5. clang-cl (MSVC ABI, setup.py's clang-cl flags) compiles every kernel function of
#      every variant (not the Cython modules: MSVC's CRT headers are not to be had here).
#      Its compiles share step 2's pool of JOBS parallel jobs, longest first.
#
# Why MinGW compiles every variant at -O3 and clang only one (this check took 430 s on
# 2 cores with clang compiling every module too; ~260 s now):
#   - MinGW: its objects are the ones LINKED (step 4), and a link only proves something
#     for the code as shipped: -O3 decides which helpers the objects reference
#     (vectorised loops, outlined OpenMP regions -> GOMP_*, memcpy/memset idioms, libgcc
#     builtins), and each variant's -march flags select its own isa/*.h with its own
#     intrinsics (GCC's always_inline target checks).  -O1 would link different objects.
#   - clang --target=x86_64-w64-windows-gnu: what only it shows is clang on the
#     Windows (MinGW-w64) headers with the Cython-generated module code, and that code
#     is the same for every variant (one _attn_body.pxi; only FA_ISA_HEADER and -march
#     differ).  The per-variant part under clang is covered twice elsewhere: clang-cl
#     (step 5) compiles every kernel function of every variant for Windows, and
#     tools/clang_check.sh builds every variant's module with clang (Linux).  So clang
#     compiles _cpu and one variant here (avx2: intrinsics + the common glue);
#     WIN_CLANG_VARIANTS="baseline avx2 avx512 avx512_bf16" restores the full set.
#
# Python's headers for Windows: CPython's Windows pyconfig.h is not on any registry this
# machine reaches, so the host's Python include directory is copied and its pyconfig.h
# replaced by a small Windows one written below (LLP64 sizes, MS_WINDOWS / MS_WIN64,
# Py_ENABLE_SHARED: the values of CPython's PC/pyconfig.h that the headers read). numpy's
# headers are the host's with their generated _numpyconfig.h given win_amd64 values.
# No python3XY.lib is to be had here: step 4 makes an import library of the C-API
# symbols the modules use and links the MinGW objects into .pyd files against it.
#
# Usage: tools/check_windows_compile.sh
# Environment:
#   WIN_COMPILERS="mingw clang"   which compilers to run (default: mingw clang clang-cl)
#   WIN_VARIANTS="avx2 baseline"  which x86-64 variants (default: all of fastattn/_variants.py)
#   WIN_CLANG_VARIANTS="avx2"     the variants clang (windows-gnu) compiles, besides _cpu
#                                 (default avx2; "all" = every variant of WIN_VARIANTS)
#   WIN_OPT=-O3                   optimisation level (-O1 is ~3x faster, for a quick look)
#   JOBS=2                        parallel compiles
#   WIN_LINK=0                    skip step 4 (the link)
#   KEEP_WORK=1                   keep the temporary directory
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"   # ROOT, PY, T0, die, fa_workdir

JOBS="${JOBS:-2}"
OPT="${WIN_OPT:--O3}"
COMPILERS="${WIN_COMPILERS:-mingw clang clang-cl}"
fa_workdir wincheck     # kept on failure or with KEEP_WORK=1

# the toolchains (Debian packages), installed when missing and running as root
missing=()
command -v x86_64-w64-mingw32-gcc >/dev/null || missing+=(gcc-mingw-w64-x86-64 mingw-w64-x86-64-dev)
command -v x86_64-w64-mingw32-nm >/dev/null || missing+=(binutils-mingw-w64-x86-64)
[[ " $COMPILERS " != *" clang"* ]] || command -v clang >/dev/null || missing+=(clang libomp-dev)
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "missing Debian packages: ${missing[*]}" >&2; exit 2
    fi
    echo "== apt-get install ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# -- 1. sources, stubs, cythonize ------------------------------------------------------
cd "$ROOT"
mkdir -p "$WORK/src"
git ls-files -z fastattn/_kernels fastattn/_variants.py | xargs -0 cp --parents -t "$WORK/src"
K="$WORK/src/fastattn/_kernels"

# the variant table: "name|header|flags" per x86-64 variant; stubs written as setup.py does
"$PY" - "$WORK/src" "${WIN_VARIANTS:-}" >"$WORK/variants.txt" <<'EOF'
import importlib.util, os, sys
src, only = sys.argv[1], sys.argv[2].split()
spec = importlib.util.spec_from_file_location("v", os.path.join(src, "fastattn", "_variants.py"))
vt = importlib.util.module_from_spec(spec); spec.loader.exec_module(vt)
table = vt.variants_to_build(vt.arch_of("win-amd64"), "win-amd64")   # no AMX variant off Linux
unknown = set(only) - {v.name for v in table}
if unknown:
    sys.exit(f"WIN_VARIANTS: unknown {sorted(unknown)}; x86_64 has {[v.name for v in table]}")
for v in table:
    if only and v.name not in only:
        continue
    with open(os.path.join(src, "fastattn", "_kernels", f"_attn_{v.name}.pyx"), "w") as f:
        f.write(f'# cython: language_level=3\n"""fastattn kernels compiled for the {v.name} variant."""\n'
                f'include "_attn_body.pxi"\n')
    print(f"{v.name}|{v.header}|{' '.join(v.flags)}")
EOF
mapfile -t VARIANT_LINES <"$WORK/variants.txt"
MODULES=(_cpu)
for line in "${VARIANT_LINES[@]}"; do MODULES+=("_attn_${line%%|*}"); done
echo "== cythonize ${MODULES[*]} (Cython $("$PY" -c 'import Cython; print(Cython.__version__)'))"
DIRECTIVES="boundscheck=False,wraparound=False,cdivision=True,initializedcheck=False,embedsignature=True"
printf '%s\n' "${MODULES[@]}" | (cd "$K" && xargs -P "$JOBS" -I{} \
    "$PY" -m cython -3 -X "$DIRECTIVES" --module-name "fastattn._kernels.{}" -o {}.c {}.pyx)

# -- Python headers for a Windows x64 target ---------------------------------------------
PYINC_HOST="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
NPINC_HOST="$("$PY" -c 'import numpy; print(numpy.get_include())')"
cp -r "$PYINC_HOST" "$WORK/pyinc"
cat >"$WORK/pyinc/pyconfig.h" <<'EOF'
/* A Windows x64 pyconfig.h for a compile check (tools/check_windows_compile.sh): the
 * values of CPython's PC/pyconfig.h that Python.h reads, for MinGW-w64 GCC and clang. */
#ifndef Py_CONFIG_H
#define Py_CONFIG_H
#if !defined(_WIN64)
#  error "this pyconfig.h is for 64-bit Windows targets only"
#endif
#include <io.h>
#include <float.h>
#include <basetsd.h>
#define MS_WIN32
#define MS_WIN64
#define MS_WINDOWS
#define NT_THREADS
#define WITH_THREAD
#define PLATFORM "win32"
#define COMPILER "[gcc]"
#define PYD_PLATFORM_TAG "win_amd64"
#define Py_ENABLE_SHARED 1
#define MS_COREDLL
#define HAVE_DECLSPEC_DLL
#define PY_LONG_LONG long long
#define PY_LLONG_MIN LLONG_MIN
#define PY_LLONG_MAX LLONG_MAX
#define PY_ULLONG_MAX ULLONG_MAX
/* LLP64: long is 32 bits on Windows */
#define SIZEOF_SHORT 2
#define SIZEOF_INT 4
#define SIZEOF_LONG 4
#define SIZEOF_LONG_LONG 8
#define SIZEOF_DOUBLE 8
#define SIZEOF_FLOAT 4
#define SIZEOF_VOID_P 8
#define SIZEOF_SIZE_T 8
#define SIZEOF_TIME_T 8
#define SIZEOF_OFF_T 4
#define SIZEOF_FPOS_T 8
#define SIZEOF_HKEY 8
#define SIZEOF_WCHAR_T 2
#define SIZEOF__BOOL 1
#define SIZEOF_PID_T SIZEOF_INT
#define LONG_BIT 32
#define WORD_BIT 32
#define HAVE_SSIZE_T 1
#define HAVE_UINTPTR_T 1
#define HAVE_INTPTR_T 1
#define HAVE_LARGEFILE_SUPPORT
#define HAVE_COPYSIGN 1
#define HAVE_ROUND 1
#define HAVE_DECL_ISINF 1
#define HAVE_DECL_ISNAN 1
#define HAVE_ERRNO_H 1
#define HAVE_FCNTL_H 1
#define HAVE_PROCESS_H 1
#define HAVE_SIGNAL_H 1
#define HAVE_STDDEF_H 1
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_WCHAR_H 1
#define HAVE_STDARG_PROTOTYPES
#define HAVE_DYNAMIC_LOADING
#define STDC_HEADERS 1
#define WITH_DOC_STRINGS 1
#define WITH_PYMALLOC 1
#define DOUBLE_IS_LITTLE_ENDIAN_IEEE754 1
#define _PYTHONFRAMEWORK ""
/* no unistd.h, sys/time.h, pthreads, dlfcn.h: left undefined, as on Windows */
#endif
EOF

# numpy: the host's headers, with _numpyconfig.h (generated by numpy's build for its
# platform) given the values of numpy's win_amd64 wheels (no endian.h, LLP64, 2-byte wchar_t)
cp -r "$NPINC_HOST" "$WORK/npinc"
sed -i -e '/NPY_HAVE_ENDIAN_H/d' \
    -e 's/^#define NPY_SIZEOF_LONG .*/#define NPY_SIZEOF_LONG 4/' \
    -e 's/^#define NPY_SIZEOF_WCHAR_T .*/#define NPY_SIZEOF_WCHAR_T 2/' \
    -e 's/^#define NPY_SIZEOF_OFF_T .*/#define NPY_SIZEOF_OFF_T 4/' \
    -e 's/^#define NPY_SIZEOF_LONGDOUBLE .*/#define NPY_SIZEOF_LONGDOUBLE 8/' \
    -e 's/^#define NPY_SIZEOF_COMPLEX_LONGDOUBLE .*/#define NPY_SIZEOF_COMPLEX_LONGDOUBLE 16/' \
    -e 's/^#define NPY_VISIBILITY_HIDDEN .*/#define NPY_VISIBILITY_HIDDEN/' \
    "$WORK/npinc/numpy/_numpyconfig.h"
grep -q 'NPY_SIZEOF_LONG 4' "$WORK/npinc/numpy/_numpyconfig.h" || { echo "numpy's _numpyconfig.h: unexpected layout" >&2; exit 2; }

# -- 5. clang-cl: every kernel function, with setup.py's clang-cl flags (set up here; compiled in step 2's pool)
# clang-cl (clang's MSVC driver; what setup.py and the cibuildwheel config use on Windows)
# targets the MSVC ABI and needs MSVC's CRT headers, which are not here (MinGW's headers do
# not work in MSVC mode), so the Cython modules themselves are not compiled with it.  What
# differs in MSVC mode -- -fms-compatibility, the intrinsics headers' MSVC gating, the
# LLP64 types -- matters in the kernels, so every kernel header is compiled in one
# translation unit for each variant, with `static` / `inline` defined away after the system
# headers so that every kernel function is compiled into the object, not only parsed.  The
# CRT is a declarations-only stand-in written below (the prototypes of the UCRT functions
# the kernels call; clang supplies stdint.h, stddef.h, immintrin.h and omp.h).
if [[ " $COMPILERS " == *" clang-cl "* ]]; then
    CL=(clang --driver-mode=cl --target=x86_64-pc-windows-msvc)
    mkdir -p "$WORK/clcl/crt"
    cat >"$WORK/clcl/crt/stdlib.h" <<'EOF2'
#pragma once
#include <stddef.h>
void *__cdecl malloc(size_t); void *__cdecl calloc(size_t, size_t);
void *__cdecl realloc(void *, size_t); void __cdecl free(void *); void __cdecl abort(void);
int __cdecl abs(int); void *__cdecl _aligned_malloc(size_t, size_t); void __cdecl _aligned_free(void *);
EOF2
    printf '#pragma once\n#include <stdlib.h>\n' >"$WORK/clcl/crt/malloc.h"
    printf '#pragma once\ntypedef int jmp_buf[16];\n' >"$WORK/clcl/crt/setjmp.h"
    cat >"$WORK/clcl/crt/string.h" <<'EOF2'
#pragma once
#include <stddef.h>
void *__cdecl memcpy(void *, const void *, size_t); void *__cdecl memmove(void *, const void *, size_t);
void *__cdecl memset(void *, int, size_t); int __cdecl memcmp(const void *, const void *, size_t);
int __cdecl strcmp(const char *, const char *); size_t __cdecl strlen(const char *);
EOF2
    cat >"$WORK/clcl/crt/math.h" <<'EOF2'
#pragma once
double __cdecl exp(double); float __cdecl expf(float); double __cdecl log(double); float __cdecl logf(float);
double __cdecl tanh(double); float __cdecl tanhf(float); double __cdecl sqrt(double); float __cdecl sqrtf(float);
double __cdecl fabs(double); float __cdecl fabsf(float); double __cdecl floor(double); double __cdecl ceil(double);
double __cdecl ldexp(double, int); double __cdecl frexp(double, int *);
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VAL __builtin_huge_val()
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)
EOF2
    cat >"$WORK/clcl/kernels.c" <<'EOF2'
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>
#include <omp.h>
#define static
#define inline
#include "simd.h"
#include "backward_kernels.h"
#include "ceilings.h"
EOF2
    # setup.py's clang-cl flags (BuildExt.build_extensions) after setuptools' own MSVC ones
    CLFLAGS=(/nologo /O2 /W3 /GL /DNDEBUG /MD -Wno-unused-function /clang:-fno-math-errno
             /clang:-fno-trapping-math /clang:-ffp-contract=on /openmp -DFASTATTN_HAVE_OPENMP=1
             -Werror=unknown-argument -Wno-unused-command-line-argument -Wno-pass-failed
             -Werror=implicit-function-declaration -imsvc "$WORK/clcl/crt" -I"$K")
    CLCL_VERSION="$("${CL[@]}" --version | head -1)"
    export CL_STR="${CL[*]}" CLFLAGS_STR="${CLFLAGS[*]}"
fi

# -- 2. compile for Windows (and step 5's clang-cl compiles, in one pool) --------------
GNU_BASE=(-c "$OPT" -fno-math-errno -fno-trapping-math -Wno-unused-function -Wno-unreachable-code
          -fopenmp -DFASTATTN_HAVE_OPENMP=1 -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION
          -I"$WORK/pyinc" -I"$WORK/npinc" -I"$K" -Werror=implicit-function-declaration -Werror=implicit-int
          -Wno-unknown-pragmas)
declare -A CCMD=(
    [mingw]="x86_64-w64-mingw32-gcc -ffp-contract=fast"
    [clang]="clang --target=x86_64-w64-windows-gnu -ffp-contract=on -Wno-unused-command-line-argument"
)
CLANG_ONLY="${WIN_CLANG_VARIANTS:-avx2}"
[[ "$CLANG_ONLY" != all ]] || CLANG_ONLY=""
# the job list, longest first (xargs starts them in order): the variants from the last
# (the widest ISA, the slowest compile) to the first, MinGW, then clang, then clang-cl,
# then the small _cpu modules
JOBLIST="$WORK/jobs.txt"; : >"$JOBLIST"
MODCC=""
for cc in $COMPILERS; do
    [[ "$cc" != clang-cl ]] || continue
    [[ -n "${CCMD[$cc]:-}" ]] || { echo "WIN_COMPILERS: unknown '$cc' (mingw, clang, clang-cl)" >&2; exit 2; }
    MODCC+=" $cc"
    mkdir -p "$WORK/obj/$cc"
done
NCLANG=0
for cc in $COMPILERS; do
    for ((i = ${#VARIANT_LINES[@]} - 1; i >= 0; i--)); do
        IFS='|' read -r name header flags <<<"${VARIANT_LINES[$i]}"
        if [[ "$cc" == clang && -n "$CLANG_ONLY" && " $CLANG_ONLY " != *" $name "* ]]; then continue; fi
        [[ "$cc" != clang ]] || NCLANG=$((NCLANG + 1))
        if [[ "$cc" == clang-cl ]]; then
            echo "$cc|kernels|$header|$flags|$name" >>"$JOBLIST"
        else
            echo "$cc|_attn_$name|$header|$flags|$name" >>"$JOBLIST"
        fi
    done
done
if [[ " $MODCC " == *" clang "* && $NCLANG -eq 0 ]]; then
    echo "WIN_CLANG_VARIANTS: none of '$CLANG_ONLY' is a variant of WIN_VARIANTS" >&2; exit 2
fi
for cc in $MODCC; do echo "$cc|_cpu|||" >>"$JOBLIST"; done
export WORK K OPT
export CCMD_mingw="${CCMD[mingw]}" CCMD_clang="${CCMD[clang]}" GNU_BASE_STR="${GNU_BASE[*]}"
compile_one() {
    IFS='|' read -r cc mod header flags name <<<"$1"
    local t=$SECONDS
    if [[ "$cc" == clang-cl ]]; then
        local vflags=() f nfun
        for f in $flags; do vflags+=("/clang:$f"); done
        # shellcheck disable=SC2086
        if $CL_STR $CLFLAGS_STR "${vflags[@]}" "-DFA_ISA_HEADER=\"isa/$header\"" "-DFA_VARIANT=\"$name\"" \
                /c "$WORK/clcl/kernels.c" "/Fo$WORK/clcl/$name.obj" >"$WORK/clcl/$name.log" 2>&1; then
            nfun=$(llvm-nm "$WORK/clcl/$name.obj" 2>/dev/null | grep -c ' T ' || true)
            [[ -z "$nfun" || "$nfun" -gt 50 ]] || { echo "   clang-cl $name: only $nfun functions compiled" >&2; return 1; }
            echo "   ok   clang-cl $name ($((SECONDS - t))s, ${nfun:-?} kernel functions) ${vflags[*]}"
        else
            echo "   FAIL clang-cl $name: $(grep -m3 error "$WORK/clcl/$name.log")"
            return 1
        fi
        return 0
    fi
    local ccvar="CCMD_$cc" defs=()
    [[ -z "$header" ]] || defs=("-DFA_ISA_HEADER=\"isa/$header\"" "-DFA_VARIANT=\"$name\"")
    # shellcheck disable=SC2086
    if ${!ccvar} $GNU_BASE_STR $flags "${defs[@]}" "$K/$mod.c" -o "$WORK/obj/$cc/$mod.o" \
            >"$WORK/obj/$cc/$mod.log" 2>&1; then
        echo "   ok   $cc $mod ($((SECONDS - t))s) ${flags:-(baseline flags)}"
    else
        echo "   FAIL $cc $mod: $(grep -m3 -E 'error' "$WORK/obj/$cc/$mod.log" || tail -3 "$WORK/obj/$cc/$mod.log")"
        return 1
    fi
}
export -f compile_one
echo "== compile for x86_64 Windows ($OPT, $JOBS jobs): $(grep -vc '^clang-cl' "$JOBLIST") objects" \
     "+ $(grep -c '^clang-cl' "$JOBLIST" || true) clang-cl kernel objects"
for cc in $MODCC; do echo "   $cc: $(${CCMD[$cc]%% *} --version | head -1)"; done
[[ -z "${CLCL_VERSION:-}" ]] || echo "   clang-cl: $CLCL_VERSION, every kernel function, MSVC ABI (step 5)"
t2=$SECONDS
if ! xargs -P "$JOBS" -I{} -d '\n' bash -c 'compile_one "$@"' _ {} <"$JOBLIST"; then
    echo "some Windows compiles failed (logs in $WORK/obj/*/*.log, $WORK/clcl/*.log)" >&2
    exit 1
fi
echo "   compiled in $((SECONDS - t2))s"

# -- 3. no POSIX-only symbol left ------------------------------------------------------
POSIX_RE='^(pthread_[a-z_]+|sched_[a-z_]+|clock_gettime|clock_getres|nanosleep|usleep|gettimeofday|posix_memalign|aligned_alloc|memalign|valloc|sysconf|getauxval|mmap|munmap|madvise|getpid|getrlimit|sigaction|dlopen|dlsym|alloca)$'
bad=0
for cc in $MODCC; do
    for o in "$WORK"/obj/"$cc"/*.o; do
        hits=$(x86_64-w64-mingw32-nm -u "$o" | awk '{print $NF}' | grep -E "$POSIX_RE" || true)
        if [[ -n "$hits" ]]; then
            echo "   POSIX-only symbols in $cc/$(basename "$o"): $(echo $hits)"; bad=1
        fi
    done
done
[[ $bad -eq 0 ]] || { echo "unguarded POSIX-only calls (see above)" >&2; exit 1; }
echo "   no POSIX-only undefined symbol in $(ls "$WORK"/obj/*/*.o | wc -l) objects"
for cc in $MODCC; do   # the parallel loops really were compiled as OpenMP (not silently serial)
    omp=$(x86_64-w64-mingw32-nm -u "$WORK"/obj/"$cc"/_attn_*.o | awk '{print $NF}' \
          | grep -cE '^(GOMP_|__kmpc_|omp_)' || true)
    [[ $omp -gt 0 ]] || { echo "   $cc: no OpenMP runtime call in the kernel objects" >&2; exit 1; }
    echo "   $cc: $omp OpenMP runtime references ($(x86_64-w64-mingw32-nm -u "$WORK"/obj/"$cc"/_attn_*.o \
          | awk '{print $NF}' | grep -m1 -E '^(GOMP_|__kmpc_)'), ...)"
done

# -- 4. link (MinGW-w64 GCC) ------------------------------------------------------------
# No python3XY.dll / import library is to be had here, so one is made: the Python C-API
# symbols the objects import are checked to be exported by the host's libpython (the
# same public API as python3XY.dll's exports), written to a .def file and turned into an
# import library by dlltool.  Every other symbol must then resolve against MinGW-w64's
# CRT, kernel32 and libgomp: the link fails on anything else.
LINKED=""
if [[ " $COMPILERS " == *" mingw "* && "${WIN_LINK:-1}" == 1 ]]; then
    PYVER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
    LIBPY="$("$PY" -c 'import os, sysconfig as s; print(os.path.join(s.get_config_var("LIBDIR") or "", s.get_config_var("LDLIBRARY") or ""))')"
    [[ -f "$LIBPY" && "$LIBPY" == *.so* ]] || LIBPY="$(readlink -f "$(command -v "$PY")")"   # a static build: the executable exports them
    nm -D --defined-only "$LIBPY" | awk '{print $2, $3}' >"$WORK/host_exports.txt"
    x86_64-w64-mingw32-nm -u "$WORK"/obj/mingw/*.o | awk '{print $NF}' | sed 's/^__imp_//' | grep -E '^_?Py' | sort -u >"$WORK/imports.txt"
    {
        echo "LIBRARY python$PYVER.dll"; echo "EXPORTS"
        while read -r sym; do
            kind=$(awk -v s="$sym" '$2 == s {print $1; exit}' "$WORK/host_exports.txt")
            case "$kind" in
                T|W|i) echo "    $sym" ;;
                D|B|R|V) echo "    $sym DATA" ;;
                *) echo "$sym" >>"$WORK/not_exported.txt" ;;
            esac
        done <"$WORK/imports.txt"
    } >"$WORK/python$PYVER.def"
    if [[ -s "$WORK/not_exported.txt" ]]; then
        echo "   imported but not exported by Python: $(tr '\n' ' ' <"$WORK/not_exported.txt")" >&2; exit 1
    fi
    x86_64-w64-mingw32-dlltool -d "$WORK/python$PYVER.def" -D "python$PYVER.dll" -l "$WORK/libpython$PYVER.a"
    echo "== link with MinGW-w64 GCC against python$PYVER.dll ($(grep -c '^    ' "$WORK/python$PYVER.def") C-API imports)"
    for o in "$WORK"/obj/mingw/*.o; do
        mod=$(basename "$o" .o)
        x86_64-w64-mingw32-gcc -shared -fopenmp -o "$WORK/obj/mingw/$mod.pyd" "$o" -L"$WORK" -lpython"$PYVER" \
            >"$WORK/obj/mingw/$mod.link.log" 2>&1 || {
            echo "   FAIL link $mod: $(grep -m3 -E 'undefined|error' "$WORK/obj/mingw/$mod.link.log")"; exit 1; }
        pe=$(x86_64-w64-mingw32-objdump -p "$WORK/obj/mingw/$mod.pyd")
        dlls=$(sed -n 's/^\s*DLL Name: //p' <<<"$pe" | sort -u | tr '\n' ' ')
        grep -qE "^\s*\[ *[0-9]+\] PyInit_$mod\$" <<<"$pe" || {
            echo "   $mod.pyd does not export PyInit_$mod" >&2; exit 1; }
        echo "   ok   $mod.pyd: exports PyInit_$mod; imports from $dlls"
    done
    LINKED="; linked with MinGW-w64 GCC against a generated python$PYVER import library"
fi

echo "check_windows_compile.sh: OK (${#MODULES[@]} modules by MinGW, _cpu + $NCLANG variant(s) by clang," \
     "$((SECONDS - T0))s; compiled$LINKED; kernel headers compiled by clang-cl; not run)"
