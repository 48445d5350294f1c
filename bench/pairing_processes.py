"""What pairing allocations within their process costs pair_lifetimes on a many-process
recording: 10^7 synthetic events (tests/factories.random_lifetimes, 5·10^6 allocations and
their frees) over 8 processes, each address always in one process (as a fork's workers'
heaps are; an address two processes share is what the pid scope is for), timed with the
tree at REV (its memprof/ unpacked by `git archive`) and with the working tree, alternating,
each run in a fresh process.

    .venv/bin/python bench/pairing_processes.py [--rev 8fe7e83] [--rounds 3] [--events 5000000]

Prints each run's seconds and the medians; the one-process case is bench/analysis_speed.py's.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
from tests.factories import random_lifetimes
from memprof.analysis.lifetimes import pair_lifetimes
events = random_lifetimes(int(sys.argv[3]), seed=1)
addr = events["addr"].to_numpy().astype(np.uint64)
events["pid"] = (4100 + (addr >> np.uint64(4)) % np.uint64(8)).astype(np.int32)
events["tid"] = events["pid"]
start = time.perf_counter()
pair_lifetimes(events)
print(time.perf_counter() - start)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="8fe7e83")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=5_000_000, help="allocations (about twice as many events)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "archive", args.rev, "memprof"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "xf", "-", "-C", old], input=archive.stdout, check=True)
        times: dict[str, list[float]] = {args.rev: [], "tree": []}
        for _ in range(args.rounds):
            for label, tree in ((args.rev, old), ("tree", str(ROOT))):
                out = subprocess.run([sys.executable, "-c", CHILD, tree, str(ROOT), str(args.events)],
                                     capture_output=True, text=True, check=True)
                times[label].append(float(out.stdout))
                print(f"{label:>8}: {times[label][-1]:.2f} s", flush=True)
    for label, seconds in times.items():
        print(f"median {label}: {statistics.median(seconds):.2f} s ({min(seconds):.2f}–{max(seconds):.2f})")


if __name__ == "__main__":
    main()
