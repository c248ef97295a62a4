#!/usr/bin/env python
"""Prefill time and greedy-generation speed of a transformers model with
``attn_implementation="fastattn"`` against ``"sdpa"`` (torch's CPU attention).

The model is a random-init Llama built from a config (no download).  Default:
4 layers, hidden size 512, 8 query heads and 4 key/value heads of size 64,
MLP 1408, vocabulary 4096 (about 16 M parameters): small enough for a 2-core
box, large enough that the 2048-token prompt's attention is a good part of the
prefill (about a quarter of its FLOPs).

    python bench/transformers_speed.py                         # 2048-token prompt, 2 threads
    python bench/transformers_speed.py --prompt 512 --new-tokens 16 --repeats 1   # a smoke run
    python bench/transformers_speed.py --cache static --json out.json

Each backend runs in its own fresh Python process per repeat (the order
alternates), with torch and fastattn both set to ``--threads`` threads; each
process warms up with one full-size prefill, then times prefills (median) and
greedy ``generate`` calls of 1 and ``--new-tokens`` tokens.  Reported: prefill
time, generate tokens/s (new tokens over the whole generate call) and decode
tokens/s (the tokens after the first, over the difference of the two generate
calls), medians over repeats, and fastattn's speed-up.  The generated token ids of the two backends are compared.

fastattn's OpenMP threads and torch's share the cores within one process;
``--omp-wait-policy passive`` sets ``OMP_WAIT_POLICY`` in the child processes
(idle threads sleep instead of spinning), to see whether that helps.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_model(args):
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt + args.new_tokens + 16)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def child(args):
    """Runs in the child process: time one backend, print one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    if args.backend == "fastattn":
        sys.path.insert(0, REPO)
        import fastattn
        import fastattn.integrations.transformers as fa_hf
        fastattn.set_num_threads(args.threads)
        fa_hf.register()
    model = build_model(args)
    model.set_attn_implementation(args.backend)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)                                    # warm-up
        prefill = []
        for _ in range(args.prefills):
            t = time.perf_counter()
            model(input_ids=ids)
            prefill.append(time.perf_counter() - t)
        times = {}
        for n in (1, args.new_tokens):      # the 1-token call: prefill and generate's own set-up
            t = time.perf_counter()
            tokens = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                    cache_implementation=args.cache, pad_token_id=0)
            times[n] = time.perf_counter() - t
    print(json.dumps({"prefill": statistics.median(prefill), "generate": times[args.new_tokens],
                      "generate_1": times[1], "tokens": tokens[:, args.prompt:].tolist()}))


def run_child(backend, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", backend]
    for name in ("prompt", "new_tokens", "threads", "batch", "layers", "hidden", "heads", "kv_heads", "mlp",
                 "vocab", "prefills", "cache"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = dict(os.environ)
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):    # see BENCHMARKING.md
        env.pop(var, None)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        sys.exit(f"{backend} child failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens (default 2048)")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens to generate (default 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--mlp", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prefills", type=int, default=3, help="timed prefills per process (median)")
    p.add_argument("--repeats", type=int, default=3, help="processes per backend (median)")
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    p.add_argument("--omp-wait-policy", choices=["active", "passive"], default=None)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--child", choices=["fastattn", "sdpa"], dest="backend", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.backend:
        return child(args)

    backends = ["fastattn", "sdpa"]
    runs = {b: [] for b in backends}
    for r in range(args.repeats):
        for b in (backends if r % 2 == 0 else backends[::-1]):
            runs[b].append(run_child(b, args))
    rows = {}
    for b in backends:
        prefill = statistics.median(x["prefill"] for x in runs[b])
        generate = statistics.median(x["generate"] for x in runs[b])
        decode = statistics.median((args.new_tokens - 1) * args.batch / (x["generate"] - x["generate_1"])
                                   for x in runs[b])
        rows[b] = {"prefill_s": prefill, "generate_s": generate,
                   "generate_tok_s": args.new_tokens * args.batch / generate, "decode_tok_s": decode}
    same = runs["fastattn"][0]["tokens"] == runs["sdpa"][0]["tokens"]

    params = f"Llama {args.layers}L h{args.hidden} H{args.heads}/{args.kv_heads} D{args.hidden // args.heads} " \
             f"mlp{args.mlp} vocab{args.vocab}"
    print(f"{params}; B{args.batch} prompt {args.prompt}, {args.new_tokens} new tokens ({args.cache} cache), "
          f"{args.threads} threads, medians of {args.repeats} processes"
          + (f", OMP_WAIT_POLICY={args.omp_wait_policy}" if args.omp_wait_policy else ""))
    print(f"{'':10s} {'prefill s':>10s} {'generate s':>11s} {'gen tok/s':>10s} {'decode tok/s':>13s}")
    for b in backends:
        r = rows[b]
        print(f"{b:10s} {r['prefill_s']:10.3f} {r['generate_s']:11.3f} {r['generate_tok_s']:10.1f} "
              f"{r['decode_tok_s']:13.1f}")
    f, s = rows["fastattn"], rows["sdpa"]
    print(f"{'speed-up':10s} {s['prefill_s'] / f['prefill_s']:9.2f}x {s['generate_s'] / f['generate_s']:10.2f}x "
          f"{f['generate_tok_s'] / s['generate_tok_s']:9.2f}x {f['decode_tok_s'] / s['decode_tok_s']:12.2f}x")
    print(f"identical generated tokens: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": vars(args), "results": rows, "runs": runs, "identical_tokens": same}, fh, indent=1)


if __name__ == "__main__":
    main()
