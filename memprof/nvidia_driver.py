"""Whether this host has an NVIDIA driver loaded (light: `record` asks before it imports
anything heavy).

Where a kernel has an NVIDIA driver loaded (open or proprietary modules) it lists it in
/proc and makes its control device; WSL2 passes GPUs through /dev/dxg instead. With none of
them no CUDA call can allocate and NVML cannot start. So where there is none, NVML is not
asked (samplers.py: importing pynvml cost 38 ms of the recorder's CPU for that answer), and
the default sources leave the cuda family's probes out (ebpf/options.py: ~0.1 s of a first
run's compile, bench/RESULTS.md).
"""
from __future__ import annotations

import os

SIGNS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def present() -> bool:
    """Whether any sign of a loaded NVIDIA driver exists here."""
    return any(os.path.exists(path) for path in SIGNS)


def absence() -> str:
    """Why there is taken to be no driver, for notes: which signs were looked for."""
    return f"no NVIDIA driver (none of {', '.join(SIGNS)} exists)"
