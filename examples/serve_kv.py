"""An inference loop: REQUESTS requests to a transformers GPT-2 (random weights: nothing is
downloaded), each generating TOKENS tokens. Each request's KV cache grows per token and is
freed when `generate` returns: growth within each request, nothing kept across them.

With --keep, the loop keeps every request's cache in a list (as a server that stores
the cache for reuse and never evicts them would): memory grows request after
request, a leak.

    memprof record -- python examples/serve_kv.py [--requests 4] [--tokens 48] [--keep]
    memprof report leaks
"""
from __future__ import annotations

import argparse

from generate_kv import kv_bytes_per_token


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48, help="tokens generated per request")
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--keep", action="store_true", help="keep every request's KV cache (the leak)")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads, vocab_size=1000,
                        bos_token_id=0, eos_token_id=0, n_positions=args.prompt + args.tokens + 8)
    model = GPT2LMHeadModel(config).to(args.device).eval()
    kept = []
    for request in range(args.requests):
        prompt = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device=args.device)
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
                                 min_new_tokens=args.tokens, do_sample=False, use_cache=True,
                                 pad_token_id=config.eos_token_id, return_dict_in_generate=True)
        if args.keep:
            kept.append(out.cache)
    print(f"requests={args.requests} tokens={args.tokens} kept={len(kept)} "
          f"kv_bytes_per_token={kv_bytes_per_token(args)}", flush=True)


if __name__ == "__main__":
    main()
