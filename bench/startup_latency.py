"""Start-up latency of `memprof record`: from invoking it to the command's first instruction.

The command is `date +%s%N`, which prints CLOCK_REALTIME as soon as it runs; the latency is
that time minus the moment we invoked memprof. The same is measured for the command run
directly (the floor: fork + exec). Median of REPEATS runs.

    sudo .venv/bin/python bench/startup_latency.py [--repeats R]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATE = shutil.which("date")


def latency(prefix: list[str]) -> float:
    t0 = time.time_ns()
    out = subprocess.run([*prefix, DATE, "+%s%N"], capture_output=True, text=True, check=True).stdout
    started = int(out.strip().splitlines()[0])
    return (started - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memprof-startup-"))
    direct, recorded = [], []
    for i in range(args.repeats):
        direct.append(latency([]))
        recorded.append(latency([sys.executable, "-m", "memprof", "record", "-q", "-o", str(tmp / f"s{i}.memprof"), "--"]))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"start-up latency, median of {args.repeats}: direct {statistics.median(direct) * 1e3:.1f} ms, "
          f"memprof record {statistics.median(recorded) * 1e3:.0f} ms "
          f"(min {min(recorded) * 1e3:.0f}, max {max(recorded) * 1e3:.0f})")


if __name__ == "__main__":
    main()
