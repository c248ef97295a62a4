"""How accurate is the bfloat16 P.V (P rounded to bfloat16 for VDPBF16PS) against
torch's bfloat16 SDPA?  Relative RMS error against float64 on the same bfloat16
inputs, outputs rounded to bfloat16 as the caller receives them.

    python bench/bf16_pv_error.py [--trials 3] [--shape B,H,L,D] [--causal] [--qscale 1]

Prints, per trial: fastattn as built (on avx512_bf16, P.V by pair dot products with
P against each tile's max; elsewhere a float32 P.V), three NumPy emulations of a
P.V with P rounded to bfloat16 (float32 scores and sums; the row sum l of the
unrounded P): P against the row's max (one pass), against a running max over
blocks of 512 keys (torch's CPU flash attention), and against each 128-key tile's
own max (fastattn's tiles); then torch's scaled_dot_product_attention in bfloat16
(if torch is installed) and fastattn / torch.  --qscale multiplies q: > 1 for
peaked attention, < 1 for flat.  docs/kernels.rst ("bfloat16 dot products")
quotes it.
"""
import argparse

import ml_dtypes
import numpy as np

import fastattn
from fastattn import _dispatch

BF16 = ml_dtypes.bfloat16


def rel_rms(out, ref):
    out = np.asarray(out, dtype=np.float64)
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))


def emulate(s32, v32, block, per_tile):
    """Online softmax over key blocks, P rounded to bfloat16 before P.V: P against
    the running max (per_tile False) or against the block's own max, the block's
    sums scaled by exp(block max - running max)."""
    Lk = s32.shape[-1]
    ot = np.zeros(s32.shape[:-1] + (v32.shape[-1],), np.float32)
    m = np.full(s32.shape[:-1] + (1,), -np.inf, np.float32)
    l = np.zeros_like(m)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(0, Lk, block):
            sb = s32[..., j:j + block]
            mt = sb.max(-1, keepdims=True)
            mn = np.maximum(m, mt)
            mns = np.where(np.isneginf(mn), 0, mn).astype(np.float32)
            ref = np.where(np.isneginf(mt), 0, mt).astype(np.float32) if per_tile else mns
            f = np.exp(ref - mns).astype(np.float32)
            a = np.exp(m - mns).astype(np.float32)
            p = np.exp(sb - ref).astype(np.float32)
            pr = p.astype(BF16).astype(np.float32)
            l = l * a + f * p.sum(-1, keepdims=True)
            ot = ot * a + f * (pr @ v32[..., j:j + block, :])
            m = mn
    return (ot / l).astype(BF16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--shape", default="1,8,1024,64", help="B,H,L,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--qscale", type=float, default=1.0)
    args = ap.parse_args()
    B, H, L, D = map(int, args.shape.split(","))
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    tri = np.tril(np.ones((L, L), bool)) if args.causal else None
    print(f"B{B} H{H} L{L} D{D}{' causal' if args.causal else ''} q*{args.qscale:g}, bfloat16 q, k, v; "
          f"relative RMS error against float64; fastattn variant {_dispatch.VARIANT}")
    print("trial | fastattn | P rounded: row max | running max, blocks of 512 | tile max, tiles of 128 "
          "| torch bfloat16 SDPA | fastattn / torch")
    for t in range(args.trials):
        q = (rng.standard_normal((B, H, L, D)) * args.qscale).astype(np.float32).astype(BF16)
        k, v = (rng.standard_normal((B, H, L, D)).astype(np.float32).astype(BF16) for _ in range(2))
        q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
        s = q32.astype(np.float64) @ k32.astype(np.float64).transpose(0, 1, 3, 2) / np.sqrt(D)
        s32 = (q32 @ k32.transpose(0, 1, 3, 2)) / np.float32(np.sqrt(D))
        if tri is not None:
            s = np.where(tri, s, -np.inf)
            s32 = np.where(tri, s32, np.float32(-np.inf))
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p @ v32.astype(np.float64)) / p.sum(-1, keepdims=True)
        ours = rel_rms(fastattn.attention(q, k, v, causal=args.causal), ref)
        emus = [rel_rms(emulate(s32, v32, L, False), ref), rel_rms(emulate(s32, v32, 512, False), ref),
                rel_rms(emulate(s32, v32, 128, True), ref)]
        theirs, ratio = "--", "--"
        if torch is not None:
            tt = [torch.from_numpy(x).to(torch.bfloat16) for x in (q32, k32, v32)]
            with torch.no_grad():
                e = rel_rms(torch.nn.functional.scaled_dot_product_attention(*tt, is_causal=args.causal)
                            .float().numpy(), ref)
            theirs, ratio = f"{e:.4e}", f"{ours / e:.3f}"
        print(f"{t} | {ours:.4e} | " + " | ".join(f"{x:.4e}" for x in emus) + f" | {theirs} | {ratio}")


if __name__ == "__main__":
    main()
