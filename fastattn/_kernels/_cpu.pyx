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
    #include <string.h>
    #if defined(__x86_64__) || defined(_M_X64)
    /* x86: CPUID and XGETBV (the OS must save the YMM / ZMM state), no compiler builtin:
       clang rejects __builtin_cpu_supports("f16c"), and MSVC-ABI compilers have none. */
    #define FA_ARCH "x86_64"
    #if (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
    #include <cpuid.h>
    static void fa_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
        __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    }
    static unsigned long long fa_xcr0(void) {
        unsigned lo, hi;
        __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));   /* xgetbv */
        return ((unsigned long long)hi << 32) | lo;
    }
    #else
    #include <intrin.h>   /* MSVC and clang-cl (whose <cpuid.h> clashes with <intrin.h>) */
    static void fa_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
        int t[4]; __cpuidex(t, (int)leaf, (int)sub);
        r[0] = (unsigned)t[0]; r[1] = (unsigned)t[1]; r[2] = (unsigned)t[2]; r[3] = (unsigned)t[3];
    }
    static unsigned long long fa_xcr0(void) { return _xgetbv(0); }
    #endif
    #if defined(__linux__)
    #include <unistd.h>
    #include <sys/syscall.h>
    /* Linux gives a process the AMX tile data state only when asked
       (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), kernel 5.16+); a tile
       instruction before that faults.  Asked once; every later thread has it. */
    static int fa_amx_granted = -1;
    static int fa_amx_permit(void) {
        if (fa_amx_granted < 0)
            fa_amx_granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                     18 /* XFEATURE_XTILEDATA */) == 0;
        return fa_amx_granted;
    }
    #else
    /* elsewhere the tiles are not used (no tested way to ask for their state) */
    static int fa_amx_permit(void) { return 0; }
    #endif
    static char fa_vendor_buf[13];
    static const char *fa_cpu_vendor(void) {
        unsigned r[4]; fa_cpuid(0, 0, r);
        memcpy(fa_vendor_buf, &r[1], 4); memcpy(fa_vendor_buf + 4, &r[3], 4); memcpy(fa_vendor_buf + 8, &r[2], 4);
        fa_vendor_buf[12] = 0;
        return fa_vendor_buf;
    }
    static int fa_cpu_has(const char *name) {
        unsigned r0[4], r1[4], r7[4] = {0, 0, 0, 0}, r71[4] = {0, 0, 0, 0};
        fa_cpuid(0, 0, r0);
        unsigned maxleaf = r0[0];
        fa_cpuid(1, 0, r1);
        if (maxleaf >= 7) {
            fa_cpuid(7, 0, r7);
            if (r7[0] >= 1) fa_cpuid(7, 1, r71);
        }
        int osxsave = (r1[2] >> 27) & 1;
        unsigned long long xcr0 = osxsave ? fa_xcr0() : 0;
        int os_avx = osxsave && (xcr0 & 0x6) == 0x6;              /* XMM + YMM state */
        int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;          /* opmask + ZMM state */
        if (!strcmp(name, "sse2")) return (r1[3] >> 26) & 1;
        if (!strcmp(name, "avx")) return os_avx && ((r1[2] >> 28) & 1);
        if (!strcmp(name, "fma")) return os_avx && ((r1[2] >> 12) & 1);
        if (!strcmp(name, "f16c")) return os_avx && ((r1[2] >> 29) & 1);
        if (!strcmp(name, "avx2")) return os_avx && ((r7[1] >> 5) & 1);
        if (!strcmp(name, "bmi2")) return (r7[1] >> 8) & 1;
        if (!strcmp(name, "avx512f")) return os_avx512 && ((r7[1] >> 16) & 1);
        if (!strcmp(name, "avx512dq")) return os_avx512 && ((r7[1] >> 17) & 1);
        if (!strcmp(name, "avx512cd")) return os_avx512 && ((r7[1] >> 28) & 1);
        if (!strcmp(name, "avx512bw")) return os_avx512 && ((r7[1] >> 30) & 1);
        if (!strcmp(name, "avx512vl")) return os_avx512 && ((r7[1] >> 31) & 1);
        if (!strcmp(name, "avx512bf16")) return os_avx512 && ((r71[0] >> 5) & 1);
        /* AMX-TILE (EDX bit 24) with AMX-BF16 (bit 22), the OS saving the tile
           configuration and data (XCR0 bits 17, 18), and the process granted them */
        if (!strcmp(name, "amx_bf16"))
            return ((r7[3] >> 24) & 1) && ((r7[3] >> 22) & 1) && (xcr0 & 0x60000) == 0x60000 && fa_amx_permit();
        return 0;
    }
    #elif defined(__aarch64__) || defined(_M_ARM64)
    #define FA_ARCH "aarch64"
    static const char *fa_cpu_vendor(void) { return ""; }
    #if defined(__linux__)
    /* the kernel's HWCAP bits (arch/arm64/include/uapi/asm/hwcap.h) */
    #include <sys/auxv.h>
    #ifndef AT_HWCAP2
    #define AT_HWCAP2 26
    #endif
    static int fa_cpu_has(const char *name) {
        unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
        if (!strcmp(name, "asimd")) return (h >> 1) & 1;
        if (!strcmp(name, "asimdhp")) return (h >> 10) & 1;
        if (!strcmp(name, "asimddp")) return (h >> 20) & 1;
        if (!strcmp(name, "sve")) return (h >> 22) & 1;
        if (!strcmp(name, "sve2")) return (h2 >> 1) & 1;
        if (!strcmp(name, "i8mm")) return (h2 >> 13) & 1;
        if (!strcmp(name, "bf16")) return (h2 >> 14) & 1;
        return 0;
    }
    #elif defined(__APPLE__)
    #include <sys/types.h>
    #include <sys/sysctl.h>
    static int fa_sysctl_flag(const char *key) {
        int v = 0; size_t n = sizeof v;
        return sysctlbyname(key, &v, &n, NULL, 0) == 0 && v != 0;
    }
    static int fa_cpu_has(const char *name) {
        if (!strcmp(name, "asimd")) return 1;
        if (!strcmp(name, "asimdhp")) return fa_sysctl_flag("hw.optional.arm.FEAT_FP16");
        if (!strcmp(name, "asimddp")) return fa_sysctl_flag("hw.optional.arm.FEAT_DotProd");
        if (!strcmp(name, "i8mm")) return fa_sysctl_flag("hw.optional.arm.FEAT_I8MM");
        if (!strcmp(name, "bf16")) return fa_sysctl_flag("hw.optional.arm.FEAT_BF16");
        return 0;
    }
    #else
    /* another OS (Windows on Arm, the BSDs): NEON is part of ARMv8-A; nothing else is assumed */
    static int fa_cpu_has(const char *name) { return !strcmp(name, "asimd"); }
    #endif
    #else
    #define FA_ARCH "other"
    static const char *fa_cpu_vendor(void) { return ""; }
    static int fa_cpu_has(const char *name) { (void)name; return 0; }
    #endif
    """
    int fa_omp_max_threads() nogil
    int fa_omp_enabled() nogil
    int fa_cpu_has(const char *name) nogil
    const char *fa_cpu_vendor() nogil
    const char *FA_ARCH

FEATURES = {
    "x86_64": ("sse2", "avx", "avx2", "fma", "f16c", "bmi2",
               "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512bf16", "amx_bf16"),
    "aarch64": ("asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2"),
}
X86_FEATURES = FEATURES["x86_64"]


def target_arch():
    """The architecture this module was compiled for: 'x86_64', 'aarch64' or 'other'."""
    return FA_ARCH.decode()


def cpu_features():
    """Dict of the CPU features fastattn's variants care about (empty on other CPUs).

    x86: CPUID, with the AVX / AVX-512 features reported only when the OS saves their
    registers (XGETBV).  aarch64: Linux's HWCAP / HWCAP2, macOS's hw.optional.arm.*.
    """
    return {name: bool(fa_cpu_has(name.encode())) for name in FEATURES.get(target_arch(), ())}


def cpu_vendor():
    """The x86 vendor string (``GenuineIntel``, ``AuthenticAMD``, ...); '' elsewhere."""
    return fa_cpu_vendor().decode("ascii", "replace")


def supported_variants():
    """Kernel variants this CPU can execute, best last (from fastattn/_variants.py)."""
    from fastattn import _variants
    arch = target_arch()
    return _variants.supported(None if arch == "other" else arch, cpu_features(), cpu_vendor())[0]


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
