"""cuda_fragment: fragments PyTorch's CUDA caching allocator, for the GPU check of the
`allocator-fragmentation` advice (scripts/gpu_check.py, issue 22).

On cuda:0 it allocates BLOCKS tensors of varied sizes, 2..9 MiB (under 10 MiB: the allocator
serves them from 20 MiB segments, several per segment), keeps every other one and frees the
rest — holes inside segments that stay reserved — then allocates LARGE tensors of 24 MiB,
which no hole fits, so they take new segments. It synchronizes, prints what the allocator
holds, and sleeps --hold ms with everything still allocated (NVML samples it there).

With default settings about half of the small blocks' bytes stay cached free, spread over
most of their segments: the advice should fire and suggest expandable_segments:True.

usage: cuda_fragment.py [--hold MS]
prints "pid=N", then "reserved_bytes=B allocated_bytes=B" (after synchronize), then holds.
Exits 2 with a message when CUDA is not available.
"""
import argparse
import os
import sys
import time

import torch

MiB = 1 << 20
BLOCKS, LARGE, LARGE_BYTES = 400, 8, 24 * MiB

kept = []


def run() -> None:
    blocks = [torch.empty((2 + i % 8) * MiB, dtype=torch.uint8, device="cuda") for i in range(BLOCKS)]
    kept.extend(blocks[1::2])
    del blocks  # every other block goes back to the cache, a hole in its segment
    kept.extend(torch.empty(LARGE_BYTES, dtype=torch.uint8, device="cuda") for _ in range(LARGE))
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=int, default=2000, metavar="MS")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_fragment: CUDA is not available", file=sys.stderr)
        return 2
    print(f"pid={os.getpid()}", flush=True)
    run()
    print(f"reserved_bytes={torch.cuda.memory_reserved()} allocated_bytes={torch.cuda.memory_allocated()}", flush=True)
    time.sleep(args.hold / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
