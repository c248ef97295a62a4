"""Static throughput of the kernels' steady-state loops on ARM cores, by llvm-mca.

    python tools/arm/mca_report.py [--mca llvm-mca-19] [--cc aarch64-linux-gnu-gcc]
        [--variant neon|neon_bf16|generic] [--cpus apple-m1,neoverse-n1,neoverse-v1] [--show NAME]

Compiles tools/arm/mca_loops.c with the kernel headers for an AArch64 target (the
flags and target header of a kernel variant), finds in each ``mca_*`` function its
innermost loop with the most vector multiply-adds (the shortest of those, so
not a tail that GCC unrolled), and gives that loop to llvm-mca for each
core model.  Printed per loop and model: cycles per iteration, FLOPs per cycle
against the model's own FMA peak (``mca_fma_peak``: 24 independent FMA chains, so
a model's peak is what it lets a loop reach; by-element FMAs against the peak of
that form, ``mca_fma_peak_lane``), bytes loaded per cycle, and the
resource with the highest pressure (the bottleneck).  ``--show NAME`` prints a loop's
assembly.  No ARM machine is needed; the figures are a model's, not a
measurement (docs/performance.rst, "ARM by simulation").
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KDIR = os.path.join(ROOT, "fastattn", "_kernels")

VARIANTS = {   # name: (-march, target header): as setup.py builds them
    "neon": ("armv8-a", "isa/neon.h"),
    "neon_bf16": ("armv8.2-a+fp16+dotprod+bf16+i8mm", "isa/neon_bf16.h"),
    "generic": ("armv8-a", "isa/generic.h"),
}
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-Wno-unused-function",
         "-Wno-maybe-uninitialized"]
BRANCH = re.compile(r"^\s+(b\.?[a-z]*|cbn?z|tbn?z)\s+(?:[^,]+,\s*)*(\.L\w+)\s*$")
LABEL = re.compile(r"^(\.L\w+):")


def compile_asm(cc, variant):
    march, header = VARIANTS[variant]
    out = os.path.join(tempfile.mkdtemp(prefix="fa_mca_"), "loops.s")
    cmd = [cc, *FLAGS, f"-march={march}", f'-DFA_ISA_HEADER="{header}"', f"-I{KDIR}", "-S",
           os.path.join(HERE, "mca_loops.c"), "-o", out]
    subprocess.run(cmd, check=True)
    return open(out).read().splitlines(), " ".join(cmd)


def functions(lines):
    """{name: [lines]} of every function of the assembly."""
    out, name = {}, None
    for i, ln in enumerate(lines):
        m = re.match(r"^([A-Za-z_][\w.]*):", ln)
        if m and i + 1 < len(lines) and (lines[i + 1].strip().startswith((".LFB", ".cfi_startproc"))
                                         or re.match(r"^\.LFB\d+:", lines[i + 1])):
            name = m.group(1)
            out[name] = []
        elif name and ln.strip().startswith(".size") and name in ln:
            name = None
        elif name:
            out[name].append(ln)
    return out


def reachable(fns, name):
    """name and every function it calls or jumps to, transitively."""
    seen, todo = set(), [name]
    while todo:
        f = todo.pop()
        if f in seen or f not in fns:
            continue
        seen.add(f)
        for ln in fns[f]:
            m = re.match(r"^\s+(bl|b)\s+([A-Za-z_][\w.]*)\s*$", ln)
            if m and m.group(2) in fns:
                todo.append(m.group(2))
    return seen


def innermost_loops(body):
    """(start, end) line ranges of the loops (a label and a later branch back to it)
    that contain no other loop."""
    where = {}
    loops = []
    for i, ln in enumerate(body):
        m = LABEL.match(ln)
        if m:
            where[m.group(1)] = i
        m = BRANCH.match(ln)
        if m and m.group(2) in where:
            loops.append((where[m.group(2)], i))
    return [(a, b) for a, b in loops if not any(a < c and d <= b and (c, d) != (a, b) for c, d in loops)]


def instructions(body, a, b):
    return [ln for ln in body[a + 1:b + 1] if ln.strip() and not ln.strip().startswith((".", "//", "#"))
            and not LABEL.match(ln)]


def count(insns, pattern):
    return sum(1 for x in insns if re.match(pattern, x.strip()))


def flops(insns):
    f = 0
    for x in insns:
        m = re.match(r"(fmla|fmls|bfdot|bfmmla|bfmlal[bt]|fmul|fadd|fsub)\s+v\d+\.(\d+)([sdh])", x.strip())
        if m:
            lanes = int(m.group(2))
            op = m.group(1)
            f += {"fmla": 2 * lanes, "fmls": 2 * lanes, "bfdot": 4 * lanes, "bfmmla": 16,
                  "bfmlalb": 2 * lanes, "bfmlalt": 2 * lanes}.get(op, lanes)
    return f


def load_bytes(insns):
    total = 0
    sizes = {"q": 16, "d": 8, "s": 4, "h": 2, "b": 1, "x": 8, "w": 4}
    for x in insns:
        s = x.strip()
        m = re.match(r"(ldp|ldr|ldur|ldnp)\s+([qdshbxw])\d+", s)
        if m:
            total += sizes[m.group(2)] * (2 if m.group(1) in ("ldp", "ldnp") else 1)
            continue
        m = re.match(r"ld1r?\s+\{([^}]*)\}", s)
        if m:
            regs = m.group(1).split(",")
            lane = re.search(r"\.(\d+)([bhsd])", regs[0])
            esize = {"b": 1, "h": 2, "s": 4, "d": 8}[lane.group(2)]
            total += esize if s.startswith("ld1r") else esize * int(lane.group(1)) * len(regs)
    return total


def run_mca(mca, cpu, insns, iterations=300):
    src = "\n".join(insns) + "\n"
    r = subprocess.run([mca, "-mtriple=aarch64", f"-mcpu={cpu}", f"-iterations={iterations}",
                        "-resource-pressure=true", "-"], input=src, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    total = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    # the resource with the highest pressure per iteration
    lines = r.stdout.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("Resource pressure per iteration:"))
    names = re.findall(r"\[(\d+\.?\d*)\]", lines[i + 1])
    vals = lines[i + 2].split()
    legend = dict(re.findall(r"^\[(\d+\.?\d*)\]\s+-\s+(\S+)", r.stdout, re.M))
    pairs = [(float(v), legend.get(n, n)) for n, v in zip(names, vals) if v != "-"]
    top = max(pairs) if pairs else (0.0, "?")
    return total / iterations, top


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mca", default=shutil.which("llvm-mca-19") or "/usr/lib/llvm-19/bin/llvm-mca")
    ap.add_argument("--cc", default="aarch64-linux-gnu-gcc")
    ap.add_argument("--variant", default="neon", choices=sorted(VARIANTS))
    ap.add_argument("--cpus", default="apple-m1,neoverse-n1,neoverse-v1")
    ap.add_argument("--show", default=None, help="print this function's loop")
    args = ap.parse_args(argv)
    lines, cmd = compile_asm(args.cc, args.variant)
    print(f"# {cmd}")
    fns = functions(lines)
    cpus = args.cpus.split(",")
    loops = {}
    for name in [f for f in fns if f.startswith("mca_")]:
        cands = []
        for f in reachable(fns, name):
            body = fns[f]
            cands += [(count(instructions(body, a, b), r"(fmla|bfdot|bfmmla|bfmlal[bt])\s+v"),
                       -len(instructions(body, a, b)), f, a, b) for a, b in innermost_loops(body)]
        if cands:
            _, _, f, a, b = max(cands)
            loops[name] = instructions(fns[f], a, b)
    if args.show:
        print("\n".join(loops[args.show]))
        return 0
    peaks = {form: {cpu: flops(loops[fn]) / run_mca(args.mca, cpu, loops[fn])[0] for cpu in cpus}
             for form, fn in (("vector", "mca_fma_peak"), ("lane", "mca_fma_peak_lane"))}
    for form in peaks:
        print(f"# {args.variant}; model FMA peak ({form} form), FLOPs/cycle: "
              + ", ".join(f"{c} {peaks[form][c]:.0f}" for c in cpus))
    print(f"{'loop':18s} {'insns':>5s} {'flops':>5s} {'bytes':>5s}  " +
          "  ".join(f"{c:>34s}" for c in cpus))
    print(f"{'':18s} {'':>5s} {'':>5s} {'':>5s}  " + "  ".join(f"{'cyc  %peak  B/cyc  bottleneck':>34s}" for _ in cpus))
    for name, insns in loops.items():
        if name.startswith("mca_fma_peak"):
            continue
        f, nb = flops(insns), load_bytes(insns)
        # the peak of the FMA form the loop uses most (by element or vector by vector)
        lane = count(insns, r"fmla\s+v\d+\.\d+s,\s*v\d+\.\d+s,\s*v\d+\.s\[")
        peak = peaks["lane" if 2 * lane > count(insns, r"fmla\s+v") else "vector"]
        cols = []
        for cpu in cpus:
            cyc, (press, res) = run_mca(args.mca, cpu, insns)
            cols.append(f"{cyc:5.2f} {100 * f / cyc / peak[cpu]:5.0f}% {nb / cyc:6.1f}  {res[:14]:>14s}")
        print(f"{name[4:]:18s} {len(insns):5d} {f:5d} {nb:5d}  " + "  ".join(f"{c:>34s}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
