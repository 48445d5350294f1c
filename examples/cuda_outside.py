"""cuda_outside: GPU memory held outside PyTorch's caching allocator, growing per step (the
GPU check of the `memory-outside-pytorch` advice: scripts/gpu_check.py).

PyTorch makes its CUDA context and one caching-allocator segment (a 4 MiB tensor); then each
of STEPS steps calls the driver's cuMemAlloc_v2 directly through ctypes for MIB MiB, keeps it,
and marks a step (memprof.mark): STEPS x MIB MiB of driver memory that is none of PyTorch's
segments, as a library that allocates on its own (NCCL, a custom kernel's workspace) would.
Prints "kept_bytes=N reserved_bytes=R steps=S", holds HOLD_MS, frees nothing and exits.

usage: cuda_outside.py [--mib 32] [--steps 16] [--hold-ms 800]   (needs CUDA)
"""
import argparse
import ctypes
import time

import torch

import memprof


def keep_driver_buffer(libcuda, nbytes):
    """cuMemAlloc_v2 on the current (PyTorch's primary) context, outside the caching allocator."""
    pointer = ctypes.c_uint64(0)
    rc = libcuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise SystemExit(f"cuMemAlloc_v2 failed (CUresult {rc})")
    return pointer.value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--hold-ms", type=int, default=800)
    args = ap.parse_args()
    tensor = torch.ones(1 << 20, device="cuda")  # PyTorch's own segment; makes the context current
    torch.cuda.synchronize()
    libcuda = ctypes.CDLL("libcuda.so.1")
    kept = []
    for _ in range(args.steps):
        kept.append(keep_driver_buffer(libcuda, args.mib << 20))
        time.sleep(0.02)
        memprof.mark("step")
    print(f"kept_bytes={len(kept) * (args.mib << 20)} reserved_bytes={torch.cuda.memory_reserved()} "
          f"steps={args.steps} tensor={tensor.numel()}", flush=True)
    time.sleep(args.hold_ms / 1000)


if __name__ == "__main__":
    main()
