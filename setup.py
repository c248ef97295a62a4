"""Build script for fastattn's compiled kernels.

One kernel source (the ``.pxi`` and ``.h`` files of ``fastattn/_kernels``) is compiled
several times, once per instruction-set level, into modules named
``fastattn._kernels._attn_<isa>``.  ``fastattn._dispatch`` picks the best one the
running CPU supports at import.  Nothing here uses ``-march=native`` or
``-ffast-math``: the wheel must run on any CPU of its architecture and keep IEEE
semantics (inf/NaN, no flush-to-zero).

Environment variables:

``FASTATTN_SANITIZE=1``  build with AddressSanitizer + UndefinedBehaviorSanitizer.
``FASTATTN_NO_OPENMP=1`` build without OpenMP even when the compiler has it.
``FASTATTN_VARIANTS=avx512,baseline`` build only these kernel variants (a faster
build while developing; the dispatcher uses the best variant that was built).
"""
import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KDIR = os.path.join("fastattn", "_kernels")

# Per-ISA variants: module suffix -> extra compiler flags.  x86-64 levels follow
# the psABI micro-architecture levels (v3 = AVX2+FMA+F16C, v4 = AVX-512 F/BW/CD/DQ/VL).
MACHINE = platform.machine().lower()
if MACHINE in ("x86_64", "amd64"):
    ISA_VARIANTS = {
        "baseline": [],
        "avx2": ["-march=x86-64-v3", "-mtune=generic"],
        "avx512": ["-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"],
        "avx512_bf16": ["-march=x86-64-v4", "-mavx512bf16", "-mtune=generic", "-mprefer-vector-width=512"],
    }
else:
    # aarch64 (NEON is part of the base ISA) and anything else: one build.
    ISA_VARIANTS = {"baseline": []}
ISA_HEADERS = {"baseline": "x86_sse2.h" if MACHINE in ("x86_64", "amd64") else "generic.h",
               "avx2": "x86_avx2.h", "avx512": "x86_avx512.h",
               "avx512_bf16": "x86_avx512_bf16.h"}
_only = [v.strip() for v in os.environ.get("FASTATTN_VARIANTS", "").split(",") if v.strip()]
if _only:
    _unknown = sorted(set(_only) - set(ISA_VARIANTS))
    if _unknown:
        raise SystemExit(f"FASTATTN_VARIANTS: unknown variant(s) {', '.join(_unknown)}; "
                         f"this target has {', '.join(ISA_VARIANTS)}")
    ISA_VARIANTS = {k: v for k, v in ISA_VARIANTS.items() if k in _only}


def _compiler_accepts(compiler, flags, source):
    """Return True when the compiler builds and links ``source`` with ``flags``."""
    tmp = tempfile.mkdtemp()
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        objs = compiler.compile([src], output_dir=tmp, extra_postargs=flags)
        compiler.link_executable(objs, "probe", output_dir=tmp, extra_postargs=flags)
        return True
    except Exception:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


OPENMP_PROBE = "#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n"


class BuildExt(build_ext):
    """Pick OpenMP and ISA flags for the compiler actually used."""

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        if ctype == "msvc":
            base = ["/O2", "/fp:precise"]
            omp_c, omp_l = ["/openmp"], []
            isa_flags = {"baseline": [], "avx2": ["/arch:AVX2"], "avx512": ["/arch:AVX512"]}
        else:
            base = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast",
                    "-Wno-unused-function", "-Wno-unreachable-code"]
            if sys.platform == "darwin":
                omp_c, omp_l = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
            else:
                omp_c, omp_l = ["-fopenmp"], ["-fopenmp"]
            isa_flags = ISA_VARIANTS
        use_omp = os.environ.get("FASTATTN_NO_OPENMP", "") in ("", "0")
        if use_omp and ctype != "msvc":
            use_omp = _compiler_accepts(self.compiler, omp_c + omp_l, OPENMP_PROBE)
        if not use_omp:
            warnings.warn("fastattn: building WITHOUT OpenMP; kernels will run single-threaded")
            omp_c, omp_l = [], []
        sanitize = []
        if os.environ.get("FASTATTN_SANITIZE", "") not in ("", "0"):
            sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1"]
        for ext in self.extensions:
            isa = ext.name[len("fastattn._kernels._attn_"):] if ext.name.startswith("fastattn._kernels._attn_") else None
            flags = list(base) + omp_c + (isa_flags.get(isa, []) if isa else [])
            ext.extra_compile_args = flags + sanitize
            ext.extra_link_args = omp_l + sanitize
            ext.define_macros = list(ext.define_macros or []) + [
                ("FASTATTN_HAVE_OPENMP", "1" if use_omp else "0"),
            ] + ([("FA_ISA_HEADER", f'"isa/{ISA_HEADERS[isa]}"'), ("FA_VARIANT", f'"{isa}"')] if isa else []) + [
                ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
            ]
        info = {
            "compiler_type": ctype,
            "compiler": " ".join(getattr(self.compiler, "compiler_so", None) or [ctype]),
            "openmp": bool(use_omp),
            "openmp_flags": omp_c + omp_l,
            "compiler_flags": list(base) + sanitize,
            "isa_flags": {isa: list(isa_flags.get(isa, [])) for isa in ISA_VARIANTS},
            "machine": MACHINE,
        }
        literal = repr(info).replace("\\", "\\\\").replace('"', '\\"')
        for ext in self.extensions:
            if ext.name == "fastattn._kernels._cpu":
                ext.define_macros.append(("FASTATTN_BUILD_INFO", f'"{literal}"'))
        super().build_extensions()


def extensions():
    inc = [np.get_include(), KDIR]
    exts = [Extension("fastattn._kernels._cpu", [os.path.join(KDIR, "_cpu.pyx")], include_dirs=inc)]
    for isa in ISA_VARIANTS:
        exts.append(Extension(f"fastattn._kernels._attn_{isa}",
                              [os.path.join(KDIR, f"_attn_{isa}.pyx")], include_dirs=inc,
                              depends=sorted(glob.glob(os.path.join(KDIR, "*.pxi")) + glob.glob(os.path.join(KDIR, "*.h")) + glob.glob(os.path.join(KDIR, "isa", "*.h")))))
    return cythonize(exts, language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "cdivision": True,
        "initializedcheck": False, "embedsignature": True,
    })


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
