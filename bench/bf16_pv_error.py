"""Would a bfloat16 P.V (P rounded to bfloat16 for VDPBF16PS / BFDOT) keep the
output error at or below torch's bfloat16 SDPA?  Relative RMS error against float64
on the same bfloat16 inputs, outputs rounded to bfloat16 as the caller receives them.

    python bench/bf16_pv_error.py [--trials 3]

Prints, per trial: fastattn (float32 P.V), the same computation with P rounded to
bfloat16 before P.V (NumPy emulation of a pair-dot P.V: float32 scores and sums), and
torch's scaled_dot_product_attention in bfloat16 (if torch is installed).
docs/kernels.rst ("bfloat16 dot products") quotes it.
"""
import argparse

import ml_dtypes
import numpy as np

import fastattn

BF16 = ml_dtypes.bfloat16


def rel_rms(out, ref):
    out = np.asarray(out, dtype=np.float64)
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--shape", default="1,8,1024,64", help="B,H,L,D")
    args = ap.parse_args()
    B, H, L, D = map(int, args.shape.split(","))
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    print(f"B{B} H{H} L{L} D{D} bfloat16 q, k, v; relative RMS error against float64")
    print("trial | fastattn (float32 P.V) | P rounded to bfloat16 | torch bfloat16 SDPA")
    for t in range(args.trials):
        q, k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32).astype(BF16) for _ in range(3))
        q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
        s = q32.astype(np.float64) @ k32.astype(np.float64).transpose(0, 1, 3, 2) / np.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p @ v32.astype(np.float64)) / p.sum(-1, keepdims=True)
        ours = fastattn.attention(q, k, v)
        s32 = (q32 @ k32.transpose(0, 1, 3, 2)) / np.float32(np.sqrt(D))
        p32 = np.exp(s32 - s32.max(-1, keepdims=True))
        rounded = ((p32.astype(BF16).astype(np.float32) @ v32) / p32.sum(-1, keepdims=True)).astype(BF16)
        theirs = "--"
        if torch is not None:
            tt = [torch.from_numpy(x).to(torch.bfloat16) for x in (q32, k32, v32)]
            theirs = f"{rel_rms(torch.nn.functional.scaled_dot_product_attention(*tt).float().numpy(), ref):.3e}"
        print(f"{t} | {rel_rms(ours, ref):.3e} | {rel_rms(rounded, ref):.3e} | {theirs}")


if __name__ == "__main__":
    main()
