# cython: language_level=3
"""CPU feature detection and OpenMP facts, independent of the kernel variants.

Compiled with baseline flags only, so it imports on any CPU and can tell the
dispatcher which of the per-ISA kernel modules the CPU can execute.
"""

cdef extern from *:
    """
    #if FASTATTN_HAVE_OPENMP
    #include <omp.h>
    static int fa_omp_max_threads(void) { return omp_get_max_threads(); }
    static int fa_omp_enabled(void) { return 1; }
    #else
    static int fa_omp_max_threads(void) { return 1; }
    static int fa_omp_enabled(void) { return 0; }
    #endif
    #if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    static int fa_cpu_has(const char *name) {
        __builtin_cpu_init();
        if (!strcmp(name, "sse2")) return __builtin_cpu_supports("sse2");
        if (!strcmp(name, "avx")) return __builtin_cpu_supports("avx");
        if (!strcmp(name, "avx2")) return __builtin_cpu_supports("avx2");
        if (!strcmp(name, "fma")) return __builtin_cpu_supports("fma");
        if (!strcmp(name, "f16c")) return __builtin_cpu_supports("f16c");
        if (!strcmp(name, "bmi2")) return __builtin_cpu_supports("bmi2");
        if (!strcmp(name, "avx512f")) return __builtin_cpu_supports("avx512f");
        if (!strcmp(name, "avx512bw")) return __builtin_cpu_supports("avx512bw");
        if (!strcmp(name, "avx512cd")) return __builtin_cpu_supports("avx512cd");
        if (!strcmp(name, "avx512dq")) return __builtin_cpu_supports("avx512dq");
        if (!strcmp(name, "avx512vl")) return __builtin_cpu_supports("avx512vl");
        if (!strcmp(name, "avx512bf16")) return __builtin_cpu_supports("avx512bf16");
        return 0;
    }
    #define FA_X86 1
    #else
    static int fa_cpu_has(const char *name) { (void)name; return 0; }
    #define FA_X86 0
    #endif
    #include <string.h>
    """
    int fa_omp_max_threads() nogil
    int fa_omp_enabled() nogil
    int fa_cpu_has(const char *name) nogil
    int FA_X86

X86_FEATURES = ("sse2", "avx", "avx2", "fma", "f16c", "bmi2",
                "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512bf16")


def cpu_features():
    """Dict of the x86 features fastattn cares about (empty on other CPUs)."""
    if not FA_X86:
        return {}
    return {name: bool(fa_cpu_has(name.encode())) for name in X86_FEATURES}


def supported_variants():
    """Kernel variants this CPU can execute, best last."""
    feats = cpu_features()
    out = ["baseline"]
    if feats.get("avx2") and feats.get("fma") and feats.get("f16c") and feats.get("bmi2"):
        out.append("avx2")
        if all(feats.get(f) for f in ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512bf16")):
            out.append("avx512")
            if feats.get("avx512bf16"):
                out.append("avx512_bf16")
    return out


def omp_max_threads():
    """``omp_get_max_threads()`` of the OpenMP runtime we link (1 without OpenMP)."""
    return fa_omp_max_threads()


def openmp_enabled():
    """True when the kernels were built with OpenMP."""
    return bool(fa_omp_enabled())


cdef extern from *:
    """
    #ifndef FASTATTN_BUILD_INFO
    #define FASTATTN_BUILD_INFO "{}"
    #endif
    #if defined(__clang__)
    #define FA_COMPILER_VERSION "clang " __clang_version__
    #elif defined(__GNUC__)
    #define FA_COMPILER_VERSION "gcc " __VERSION__
    #elif defined(_MSC_VER)
    #define FA_XSTR(x) #x
    #define FA_STR(x) FA_XSTR(x)
    #define FA_COMPILER_VERSION "msvc " FA_STR(_MSC_FULL_VER)
    #else
    #define FA_COMPILER_VERSION "unknown"
    #endif
    #if FASTATTN_HAVE_OPENMP && defined(_OPENMP)
    #define FA_OPENMP_SPEC _OPENMP
    #else
    #define FA_OPENMP_SPEC 0
    #endif
    """
    const char *FASTATTN_BUILD_INFO
    const char *FA_COMPILER_VERSION
    int FA_OPENMP_SPEC


def build_info():
    """How this copy of fastattn was compiled (dict; shown by fastattn.show_config())."""
    import ast
    info = ast.literal_eval(FASTATTN_BUILD_INFO.decode())
    info["compiler_version"] = FA_COMPILER_VERSION.decode()
    info["openmp"] = bool(fa_omp_enabled())
    info["openmp_spec"] = int(FA_OPENMP_SPEC)   # _OPENMP date, e.g. 201511 = OpenMP 4.5
    return info
