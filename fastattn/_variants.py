"""The kernel variants: one table, read by setup.py (which compiles them) and by the dispatcher.

One kernel source (``fastattn/_kernels``) is compiled once per variant into the module
``fastattn._kernels._attn_<name>``, with the variant's target header
(``fastattn/_kernels/isa/<header>``) and compiler flags.  At import the dispatcher
loads the last variant of the running architecture whose CPU features are all present
(and, for a variant with ``auto_vendors``, only on those vendors' CPUs unless
``FASTATTN_ISA`` names it).  A new target is one header plus one entry here.

setup.py loads this file by path (it must not import the package), so it imports
nothing but the standard library.
"""
import re
from collections import namedtuple

Variant = namedtuple("Variant", "name header flags requires auto_vendors description")
Variant.__doc__ = """One compiled kernel variant.

name: module suffix (``_attn_<name>``) and the value of ``FASTATTN_ISA`` that forces it.
header: the target header under ``fastattn/_kernels/isa/``.
flags: GCC / clang flags that select the instruction set (no -march=native, ever).
requires: CPU features (names of ``fastattn._kernels._cpu.cpu_features()``) it needs.
auto_vendors: if not empty, chosen automatically only on these CPU vendors.
description: one line for show_config() and the docs.
"""

_X86_V3 = ("avx", "avx2", "fma", "f16c", "bmi2")
_X86_V4 = _X86_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_V4_FLAGS = ("-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512")

VARIANTS = {
    "x86_64": (
        Variant("baseline", "x86_sse2.h", (), ("sse2",), (),
                "x86-64 baseline: SSE2, 16-byte vectors"),
        Variant("avx2", "x86_avx2.h", ("-march=x86-64-v3", "-mtune=generic"), _X86_V3, (),
                "x86-64-v3: AVX2 + FMA + F16C, 32-byte vectors"),
        Variant("avx512", "x86_avx512.h", _V4_FLAGS, _X86_V4, (),
                "x86-64-v4: AVX-512 F/BW/CD/DQ/VL, 64-byte vectors"),
        # VDPBF16PS issues on one port of an Intel core where FMA has two: the bfloat16
        # Q.K^T measured slower there (docs/kernels.rst), so only AMD's cores (Zen 4/5)
        # get it by default; FASTATTN_ISA=avx512_bf16 forces it anywhere it runs.
        Variant("avx512_bf16", "x86_avx512_bf16.h", _V4_FLAGS + ("-mavx512bf16",),
                _X86_V4 + ("avx512bf16",), ("AuthenticAMD",),
                "x86-64-v4 + AVX512_BF16: bfloat16 Q.K^T and P.V by VDPBF16PS pair dot products"),
        # AMX tiles (Sapphire Rapids and later Xeons; Linux, which grants the tile state)
        Variant("avx512_amx", "x86_avx512_amx.h", _V4_FLAGS + ("-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
                _X86_V4 + ("avx512bf16", "amx_bf16"), (),
                "x86-64-v4 + AVX512_BF16 + AMX: bfloat16 Q.K^T and P.V of long inputs by TDPBF16PS tiles"),
    ),
    "aarch64": (
        Variant("baseline", "generic.h", (), (), (),
                "portable 16-byte GNU C vectors (no NEON intrinsics): the fallback"),
        Variant("neon", "neon.h", ("-march=armv8-a",), ("asimd",), (),
                "ARMv8.0-A NEON: float16 by FCVTL, bfloat16 by SHLL, int8 by SXTL, 32 registers"),
        Variant("neon_bf16", "neon_bf16.h", ("-march=armv8.2-a+fp16+dotprod+bf16+i8mm",),
                ("asimd", "asimdhp", "asimddp", "bf16", "i8mm"), (),
                "ARMv8.6-class NEON (Graviton3/4, Neoverse N2/V1/V2, Apple M2+): "
                "bfloat16 Q.K^T by BFDOT"),
    ),
}
# any other architecture: the portable build only
OTHER = (Variant("baseline", "generic.h", (), (), (), "portable 16-byte GNU C vectors"),)

_ARCH_ALIASES = {
    "x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "em64t": "x86_64",
    "aarch64": "aarch64", "arm64": "aarch64", "armv8": "aarch64", "aarch64_be": None,
}


def arch_of(platform_tag):
    """The table's architecture for a platform tag or machine name.

    Accepts ``sysconfig.get_platform()`` strings (``linux-x86_64``, ``linux-aarch64``,
    ``macosx-11.0-arm64``, ``win-amd64``, ``win-arm64``, ``mingw_x86_64_ucrt``), GCC
    target triples (``aarch64-linux-gnu``, ``x86_64-w64-mingw32``) and
    ``platform.machine()`` names.  Returns ``"x86_64"``, ``"aarch64"`` or ``None``
    (another architecture, or ``universal2``: no single answer).
    """
    tag = platform_tag.strip().lower()
    if tag.startswith("mingw_"):
        rest = tag[len("mingw_"):]
        for machine in sorted(_ARCH_ALIASES, key=len, reverse=True):
            if rest == machine or rest.startswith(machine + "_"):
                return _ARCH_ALIASES[machine]
        return None
    parts = tag.split("-")
    for machine in (parts[0], parts[-1]):      # a triple starts with it, a platform ends with it
        if machine in _ARCH_ALIASES:
            return _ARCH_ALIASES[machine]
    return None


def variants_for(arch):
    """The variants of an architecture (``arch_of``'s answer), worst first."""
    return VARIANTS.get(arch, OTHER) if arch else OTHER


# Variants built for Linux targets only: AMX's tile state must be requested from the
# kernel (arch_prctl), which the CPU-feature module does only on Linux.
LINUX_ONLY = ("avx512_amx",)


def variants_to_build(arch, platform_tag):
    """The variants setup.py compiles for ``arch`` on ``sysconfig.get_platform()``'s
    ``platform_tag`` (those of ``LINUX_ONLY`` for ``linux-*`` tags alone), worst first."""
    linux = platform_tag.strip().lower().startswith("linux")
    return tuple(v for v in variants_for(arch) if linux or v.name not in LINUX_ONLY)


def supported(arch, features, vendor=""):
    """(executable, automatic): the variant names this CPU can run, and those the
    dispatcher may choose by itself (``auto_vendors`` honoured), worst first."""
    can = [v for v in variants_for(arch) if all(features.get(f) for f in v.requires)]
    auto = [v.name for v in can if not v.auto_vendors or vendor in v.auto_vendors]
    return [v.name for v in can], auto


def target_arch(plat, archflags="", host_machine=""):
    """The architecture an extension is built FOR (not the one setup.py runs on).

    ``plat`` is ``sysconfig.get_platform()``, which honours ``_PYTHON_HOST_PLATFORM``
    (the cross-build convention of crossenv and cibuildwheel).  A macOS ``universal2``
    interpreter builds for the single ``-arch`` of ``archflags`` (ARCHFLAGS) or, without
    one, for the host's machine, which then becomes ARCHFLAGS: one set of -march flags
    cannot serve two architectures.  Returns ``(arch, archflags_to_set or None)``.
    """
    if plat.endswith("universal2"):
        archs = sorted(set(re.findall(r"-arch\s+(\S+)", archflags or "")))
        if len(archs) == 1:
            return arch_of(archs[0]), None
        if archs:
            raise SystemExit(f"fastattn: ARCHFLAGS={archflags!r} asks for several architectures; the "
                             "kernels are compiled per architecture: build one wheel per -arch "
                             "(ARCHFLAGS='-arch arm64' or '-arch x86_64')")
        machine = "arm64" if arch_of(host_machine or "") == "aarch64" else "x86_64"
        return arch_of(machine), f"-arch {machine}"
    return arch_of(plat), None
