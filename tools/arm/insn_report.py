"""Instructions executed per FLOP of whole kernel calls: aarch64 variants under qemu
against the x86-64 variants under callgrind.

    python tools/arm/insn_report.py --a64-tree DIR --sysroot A64 [--x86-tree DIR]
        [--a64-variants baseline,neon,neon_bf16] [--x86-variants avx2] [--cases ...]

DIR is a built checkout (for aarch64: the standard cross build, docs/install.rst);
A64 the aarch64 sysroot of tools/aarch64_sysroot.sh (root/ and site/).  Each case
runs in a fresh process twice, with the inputs made and one warm-up call, then with
REPS more calls; the difference of the two instruction counts over REPS is the
instructions of one call (interpreter start, imports and input generation cancel).
One thread (the counters are per process, and one thread keeps the count exact).
aarch64: QEMU's TCG plugin tools/arm/insn_count.c (guest instructions executed;
Debian's dynamic qemu-aarch64 loads plugins, qemu-aarch64-static does not);
x86-64: valgrind --tool=callgrind's "Collected" instruction count (valgrind runs
AVX2 but not AVX-512, hence the AVX2 build as the x86 reference).  Counts
instructions, not time: a NEON instruction and an AVX2 one move 16 and 32 bytes.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name: (setup code defining `call`, FLOPs of one call)
CASES = {
    "prefill f32 H4 L256 D64": (
        "q = rng.standard_normal((1, 4, 256, 64), dtype=np.float32); k = rng.standard_normal(q.shape, dtype=np.float32)\n"
        "v = rng.standard_normal(q.shape, dtype=np.float32)\ncall = lambda: fa.attention(q, k, v)",
        4 * 4 * 256 * 256 * 64),
    "prefill bf16 H4 L256 D64": (
        "import ml_dtypes\nb = ml_dtypes.bfloat16\n"
        "q = rng.standard_normal((1, 4, 256, 64), dtype=np.float32).astype(b); k = rng.standard_normal(q.shape, dtype=np.float32).astype(b)\n"
        "v = rng.standard_normal(q.shape, dtype=np.float32).astype(b)\ncall = lambda: fa.attention(q, k, v)",
        4 * 4 * 256 * 256 * 64),
    "decode f32 H8 Lk2048 D128": (
        "q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32); k = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)\n"
        "v = rng.standard_normal(k.shape, dtype=np.float32)\ncall = lambda: fa.attention(q, k, v)",
        4 * 8 * 2048 * 128),
    "decode f16 cache H8 Lk2048 D128": (
        "q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32); k = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32).astype(np.float16)\n"
        "v = rng.standard_normal(k.shape, dtype=np.float32).astype(np.float16)\ncall = lambda: fa.attention(q, k, v)",
        4 * 8 * 2048 * 128),
    "decode int8 cache H8 Lk2048 D128": (
        "q = rng.standard_normal((1, 8, 1, 128), dtype=np.float32); k = rng.integers(-127, 128, (1, 8, 2048, 128), dtype=np.int8)\n"
        "v = rng.integers(-127, 128, k.shape, dtype=np.int8)\ncall = lambda: fa.attention(q, k, v, k_scale=0.01, v_scale=0.01)",
        4 * 8 * 2048 * 128),
}

SCRIPT = """import sys
import numpy as np
import fastattn as fa
fa.set_num_threads(1)
rng = np.random.default_rng(0)
{setup}
call()
for _ in range({reps}):
    call()
"""


def _run_a64(tree, sysroot, variant, code, plugin, cpu):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "count")
        env = dict(os.environ, PYTHONPATH=f"{tree}:{sysroot}/site", FASTATTN_ISA=variant, OMP_NUM_THREADS="1",
                   PYTHONDONTWRITEBYTECODE="1")
        cmd = ["qemu-aarch64", "-L", f"{sysroot}/root", "-cpu", cpu, "-plugin", f"{plugin},out={out}",
               f"{sysroot}/root/usr/bin/python3.11", "-c", code]
        subprocess.run(cmd, env=env, check=True, cwd=tmp)
        with open(out) as f:
            return int(f.read().split()[0])


def _run_x86(tree, variant, code):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=tree, FASTATTN_ISA=variant, OMP_NUM_THREADS="1")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable, "-c", code]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
        if r.returncode:
            raise RuntimeError(r.stderr[-2000:])
        m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
        return int(m.group(1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a64-tree", required=True)
    ap.add_argument("--sysroot", required=True)
    ap.add_argument("--x86-tree", default=ROOT)
    ap.add_argument("--a64-variants", default="baseline,neon,neon_bf16")
    ap.add_argument("--x86-variants", default="avx2")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args(argv)
    plugin = os.path.join(tempfile.gettempdir(), "fastattn_insn_count.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", os.path.join(HERE, "insn_count.c"), "-o", plugin], check=True)
    cols = [("aarch64", v) for v in args.a64_variants.split(",") if v] + \
           [("x86-64", v) for v in args.x86_variants.split(",") if v]
    print("| case | " + " | ".join(f"{v} ({a})" for a, v in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name in args.cases.split(","):
        setup, flops = CASES[name]
        row = []
        for arch, variant in cols:
            counts = []
            for reps in (0, args.reps):
                code = SCRIPT.format(setup=setup, reps=reps)
                if arch == "aarch64":
                    counts.append(_run_a64(args.a64_tree, args.sysroot, variant, code, plugin, "max,sve=off"))
                else:
                    counts.append(_run_x86(args.x86_tree, variant, code))
            row.append((counts[1] - counts[0]) / args.reps / flops)
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in row) + " |", flush=True)
    print("\ninstructions executed per FLOP of one call (4*Lq*Lk*D per head), one thread")


if __name__ == "__main__":
    main()
