"""A sweep of sequence length × batch: a transformers GPT-2 (random weights: nothing is
downloaded) runs one forward pass with its KV cache (use_cache=True) for each (seq_len, batch)
of SEQ_LENS × BATCHES, on the CPU or a GPU, and marks each configuration before it runs:

    memprof.mark("config", seq_len=L, batch=B)

Each mark with numbers begins a region that lasts until the next one, so memprof gives the
peak of every layer per configuration, and with two quantities a table of peaks by seq_len
(rows) and batch (columns): the memory surface.

    memprof record -- python examples/sweep_kv.py
    memprof report regions
    memprof report html        (the surface as a heatmap)

The KV cache of one configuration is 2 (key and value) × layers × batch × seq_len × hidden ×
dtype bytes (2 × 4 × 4 × 256 × 256 × 4 = 8 MiB at the largest with the defaults); activations
and logits grow with batch × seq_len too, so every layer's peak rises along both axes.
"""
from __future__ import annotations

import argparse
import time

try:
    import memprof  # importable when this runs with memprof's Python, as under `memprof record`
    mark = memprof.mark
except ImportError:  # elsewhere the sweep still runs, with no marks: nothing records it anyway
    def mark(label: str = "mark", **values: float) -> None:
        """memprof.mark's stand-in where memprof is not installed: does nothing."""

SEQ_LENS = (64, 128, 256)
BATCHES = (1, 2, 4)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def kv_bytes(args: argparse.Namespace, seq_len: int, batch: int, dtype_bytes: int = 4) -> int:
    """The KV cache of one configuration: 2 × layers × batch × seq_len × hidden × dtype bytes."""
    return 2 * args.layers * batch * seq_len * args.hidden * dtype_bytes


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads, vocab_size=1000,
                        bos_token_id=0, eos_token_id=0, n_positions=max(args.seq_lens))
    model = GPT2LMHeadModel(config).to(args.device).eval()
    started = time.monotonic()
    for seq_len in args.seq_lens:
        for batch in args.batches:
            ids = torch.randint(0, config.vocab_size, (batch, seq_len), device=args.device)
            mark("config", seq_len=seq_len, batch=batch)  # after the input: the region is the forward's
            with torch.no_grad():
                out = model(ids, use_cache=True)
            del out  # the cache and the logits go before the next configuration begins
    print(f"configs={len(args.seq_lens) * len(args.batches)} largest_kv_bytes="
          f"{kv_bytes(args, max(args.seq_lens), max(args.batches))} seconds={time.monotonic() - started:.2f}",
          flush=True)


if __name__ == "__main__":
    main()
