"""Cost of judging leak trends per process (issue 23, item 3): `chain_trends` on the
analysis_speed.py recording (10^7 events, ~5·10^6 allocations, 20 step marks, one process)
read at one clock of steps, against the same allocations spread over RANKS processes, each
read at its own step marks (Checkpoints.by_pid), as a torchrun job's ranks are.

    .venv/bin/python bench/leaks_ranks_speed.py [--recording PATH] [--ranks 8] [--repeats 5]

PATH defaults to the recording analysis_speed.py keeps under $TMPDIR/memprof-bench-analysis
(run that bench first). The allocations and checkpoints are built once; each repeat times
`chain_trends` alone (best and median of --repeats), one process, one thread of numpy.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def _timed(call, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recording", type=Path,
                    default=Path(tempfile.gettempdir()) / "memprof-bench-analysis" / "analysis-10000000-s6-v2.memprof")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from memprof.analysis.chain_trends import chain_trends
    from memprof.analysis.chains import with_canonical_stacks
    from memprof.analysis.checkpoints import find_checkpoints
    from memprof.analysis.trend import MIN_POINTS
    from memprof.api import analyse

    analysed = analyse(args.recording)
    allocations = with_canonical_stacks(analysed.lifetimes.allocations, analysed.canonical)
    one = find_checkpoints(analysed.events, start_ns=analysed.rec.meta.start_ns, end_ns=analysed.span.end_ns,
                           min_points=MIN_POINTS)
    # The same allocations made by RANKS processes, round robin; rank r steps r·period/RANKS later.
    pids = 1_000 + np.arange(len(allocations)) % args.ranks
    spread = allocations.assign(pid=pids.astype(allocations["pid"].dtype))
    lag = int(one.period_ns) // args.ranks
    own = replace(one, by_pid={1_000 + r: one.times_ns + r * lag for r in range(args.ranks)})
    single = _timed(lambda: chain_trends(allocations, one), args.repeats)
    ranks = _timed(lambda: chain_trends(spread, own), args.repeats)
    print(f"{len(allocations):,} allocations, {len(one.times_ns)} checkpoints")
    for name, times in (("one clock of steps", single), (f"{args.ranks} processes, own steps", ranks)):
        print(f"chain_trends, {name:<26} s  best {min(times):.3f}  median {statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
