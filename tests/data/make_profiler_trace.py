"""Records tests/data/real_cpu_profiler_trace.json.gz: a real torch.profiler Chrome trace (CPU
only, profile_memory=True, with_stack=True) of 23 calls of `step` (defined on STEP_LINE) that
each keep a 1 MiB tensor and free a 256 KiB temporary, then wait 0.6 s (so the kept tensors are older than
`report leaks`' default --min-age at the end of the window). Not deterministic (addresses,
times, pids): run it by hand with torch installed, and commit the result.

    .venv/bin/python tests/data/make_profiler_trace.py
"""
from __future__ import annotations

import gzip
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "real_cpu_profiler_trace.json.gz"
STEPS = 23
KEPT: list = []
STEP_LINE = 23  # where `step` starts: the line the profiler names; tests/unit/test_import_cli.py checks it


def step(torch) -> float:
    tmp = torch.ones(256, 256)  # 256 KiB, freed when the step returns
    KEPT.append(torch.empty(1 << 20, dtype=torch.uint8))  # 1 MiB, kept: the leak
    return float(tmp.sum())


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        for _ in range(STEPS):
            step(torch)
        time.sleep(0.6)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        OUTPUT.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
