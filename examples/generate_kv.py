"""LLM inference whose memory grows with every token: a HuggingFace `transformers` GPT-2
(random weights: nothing is downloaded) generating TOKENS tokens greedily, on the CPU or a GPU.

The growth is the KV cache: every layer keeps each token's key and value, so per generated
token the cache grows by

    2 (key and value) × layers × batch × hidden × dtype bytes
    = 2 × 6 × 2 × 512 × 4 = 48 KiB with the defaults.

There is no optimizer: memprof counts one step per outermost forward (one per token).

    memprof record -- python examples/generate_kv.py [--tokens 800] [--device cuda]
    memprof report growth --against tokens
"""
from __future__ import annotations

import argparse
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=800, help="tokens to generate (default 800)")
    p.add_argument("--prompt", type=int, default=8, help="prompt length in tokens (default 8)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def kv_bytes_per_token(args: argparse.Namespace, dtype_bytes: int = 4) -> int:
    return 2 * args.layers * args.batch * args.hidden * dtype_bytes


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                        n_positions=args.prompt + args.tokens + 8)
    model = GPT2LMHeadModel(config).to(args.device).eval()
    prompt = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device=args.device)
    started = time.monotonic()
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
                             min_new_tokens=args.tokens, do_sample=False, use_cache=True,
                             pad_token_id=config.eos_token_id)
    print(f"generated={out.shape[1] - args.prompt} batch={args.batch} "
          f"kv_bytes_per_token={kv_bytes_per_token(args)} seconds={time.monotonic() - started:.2f}", flush=True)


if __name__ == "__main__":
    main()
