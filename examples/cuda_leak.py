"""cuda_leak: the known PyTorch CUDA leak, for the GPU check (scripts/gpu_check.sh).

On cuda:0 it keeps KEEP = 23 tensors of exactly 1 MiB (262144 float32) in the module-level
list ``kept`` and, interleaved with them, allocates and frees CHURN = 100 others of 1 MiB.
Then it synchronizes, prints what PyTorch's caching allocator holds, and sleeps --hold ms
with everything still allocated, so samplers (nvidia-smi, NVML) can read it while it holds.

What the layers should see (PyTorch 2.x caching allocator, default settings):
- cuda_block: 123 allocations of 1048576 bytes, 23 live at exit;
- cuda_driver: segments from the driver (cuMemAlloc); a 1 MiB request is in the small pool,
  served from 2 MiB segments, so about 12 segments (24 MiB) are reserved. The printed
  reserved_bytes is the number to compare with, whatever the allocator settings
  (PYTORCH_CUDA_ALLOC_CONF) make it. The CUDA context's own memory is not a cuMemAlloc.

usage: cuda_leak.py [--hold MS] [--snapshot PATH]
prints "pid=N", then "reserved_bytes=B allocated_bytes=B" (after synchronize), then holds.
Exits 2 with a message when CUDA is not available.
"""
import argparse
import os
import sys
import time

import torch

KEEP, CHURN = 23, 100
ELEMENTS = 262144  # float32: exactly 1 MiB
TENSOR_BYTES = ELEMENTS * 4

kept = []  # the leak: KEEP tensors of 1 MiB, never released


def interleaved_order(keep: int, churn: int) -> list[bool]:
    """keep + churn flags, True for a tensor to keep, spread evenly among the churned ones."""
    total = keep + churn
    return [(i + 1) * keep // total > i * keep // total for i in range(total)]


def run() -> None:
    for keep in interleaved_order(KEEP, CHURN):
        tensor = torch.full((ELEMENTS,), 1.0, dtype=torch.float32, device="cuda")
        if keep:
            kept.append(tensor)
        del tensor  # the churned ones go back to the caching allocator here
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hold", type=int, default=1500, metavar="MS")
    parser.add_argument("--snapshot", metavar="PATH",
                        help="also save torch.cuda.memory._dump_snapshot(PATH) at the end (records the history "
                             "itself unless memprof's agent already does)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"cuda_leak: CUDA is not available to torch {torch.__version__} "
              f"(built for CUDA {torch.version.cuda}); needs an NVIDIA GPU and a CUDA build of torch",
              file=sys.stderr)
        return 2
    torch.cuda.set_device(0)
    print(f"pid={os.getpid()}", flush=True)
    if args.snapshot and not os.environ.get("MEMPROF_AGENT_DIR"):
        torch.cuda.memory._record_memory_history(max_entries=10000)
    run()
    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
    stats = torch.cuda.memory_stats()
    print(f"reserved_bytes={stats['reserved_bytes.all.current']} "
          f"allocated_bytes={stats['allocated_bytes.all.current']}", flush=True)
    time.sleep(args.hold / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
