"""Attention at a sweep of sequence lengths: for each L of SEQ_LENS, one self-attention over
random queries, keys and values of shape (batch, heads, L, head_dim), on the CPU or a GPU,
with the configuration marked before it runs:

    memprof.mark("config", seq_len=L, batch=B, heads=H)

Written out (the default), attention materialises the L × L scores: `q @ k.transpose(-2, -1)`
is a batch × heads × L × L tensor, the softmax another of the same size while the first is
alive, so the peak holds 2 × batch × heads × L² × 4 bytes of scores (float32): 2 × 1 × 8 ×
1024² × 4 = 64 MiB at L = 1024 with the defaults, a quarter of that at each halving of L.

With --sdpa, torch.nn.functional.scaled_dot_product_attention computes the same output; on
the CPU in float32 it runs a blockwise (flash) kernel that never holds the L × L matrix.

    memprof record -- python examples/attention_sweep.py [--sdpa]
    memprof report regions
    memprof report advice
"""
from __future__ import annotations

import argparse
import math
import time

try:
    import memprof  # importable when this runs with memprof's Python, as under `memprof record`
    mark = memprof.mark
except ImportError:  # elsewhere the sweep still runs, with no marks: nothing records it anyway
    def mark(label: str = "mark", **values: float) -> None:
        """memprof.mark's stand-in where memprof is not installed: does nothing."""

SEQ_LENS = (128, 256, 512, 1024)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--sdpa", action="store_true", help="scaled_dot_product_attention instead of the written-out one")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def scores_bytes(args: argparse.Namespace, seq_len: int, dtype_bytes: int = 4) -> int:
    """One L × L scores tensor: batch × heads × L² × dtype bytes."""
    return args.batch * args.heads * seq_len * seq_len * dtype_bytes


def naive_attention(q, k, v):
    """softmax(q kᵀ / √d) v, written out: the scores and their softmax are L × L each."""
    import torch
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    return weights @ v


def sdpa_attention(q, k, v):
    """The same attention by torch's fused kernel."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    torch.manual_seed(0)
    attention = sdpa_attention if args.sdpa else naive_attention
    started = time.monotonic()
    for seq_len in args.seq_lens:
        shape = (args.batch, args.heads, seq_len, args.head_dim)
        q, k, v = (torch.randn(shape, device=args.device) for _ in range(3))
        mark("config", seq_len=seq_len, batch=args.batch, heads=args.heads)  # after the inputs
        with torch.no_grad():
            out = attention(q, k, v)
        del out, q, k, v
    print(f"configs={len(args.seq_lens)} sdpa={args.sdpa} largest_scores_bytes="
          f"{scores_bytes(args, max(args.seq_lens))} seconds={time.monotonic() - started:.2f}", flush=True)


if __name__ == "__main__":
    main()
