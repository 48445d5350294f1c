"""One leaking rank in a job of several: run under torchrun, each rank trains a small model
for STEPS steps; the rank given by --leak-rank also keeps one 256 KiB tensor per step (a
cache that is never cleared), the others keep nothing. No process group is made: the ranks
need not talk for memprof to tell them apart (it reads RANK from each process's environment).

    memprof record -- torchrun --standalone --nproc_per_node 4 examples/ranks_leak.py --leak-rank 2
    memprof report                      # "rank 2 … grows 256.0 KiB per step where the other ranks' median is 0 B"
    memprof report top --by rank        # each rank's live bytes

prints "rank=R steps=N kept=K" at the end.
"""
from __future__ import annotations

import argparse
import os
import sys

KEPT_BYTES = 256 * 1024  # per step, on the leaking rank: 64 Ki float32


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--leak-rank", type=int, default=2, help="the rank that keeps a tensor per step (-1: none)")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(args.steps):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == args.leak_rank:
            kept.append(torch.ones(KEPT_BYTES // 4))
    # One write of the whole line: print() writes the text and its newline apart, and four
    # workers share this stdout.
    sys.stdout.write(f"rank={rank} steps={args.steps} kept={len(kept)}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
