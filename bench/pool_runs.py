"""Pool the rounds of several `train_overhead.py --json` runs into one ratio for a profiled run.

One run's ratio on this host moves with the hour (the unprofiled loop itself took 0.27–0.50 s
on different days), so the bar's verdict is better read from several runs together. For each
file: the run's ratio of medians (RUN over BASE) with its paired-bootstrap interval; then all
of them pooled (bench/common.py `pooled_ratio`: the runs' ratios' geometric mean weighted by
rounds) with a bootstrap interval that redraws rounds within each run.

    .venv/bin/python bench/pool_runs.py [--run memprof] [--base baseline] [--bar 1.10] RUN.json…
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import pooled_ratio, pooled_ratio_interval, ratio_of_medians, ratio_of_medians_interval  # bench/common.py


def paired_loops(path: Path, run: str, base: str) -> tuple[list[float], list[float]]:
    """The loop seconds of `run` and `base`, round by round, from one --json file."""
    data = json.loads(path.read_text())
    missing = [name for name in (run, base) if name not in data]
    if missing:
        raise SystemExit(f"pool_runs: {path} has no {' or '.join(missing)} run (it has: {', '.join(data)})")
    return [r["loop"] for r in data[run]], [r["loop"] for r in data[base]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path, metavar="RUN.json")
    ap.add_argument("--run", default="memprof", help="the profiled run to pool (default: memprof)")
    ap.add_argument("--base", default="baseline", help="its unprofiled run (default: baseline)")
    ap.add_argument("--bar", type=float, default=1.10)
    args = ap.parse_args()
    runs = []
    for path in args.files:
        try:
            values, base = paired_loops(path, args.run, args.base)
            low, high = ratio_of_medians_interval(values, base)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"pool_runs: cannot use {path}: {e}")
        print(f"{path}: {len(values)} rounds, {args.run} {ratio_of_medians(values, base):.3f}x "
              f"(95% interval {low:.3f}-{high:.3f})")
        runs.append((values, base))
    point = pooled_ratio(runs)
    low, high = pooled_ratio_interval(runs)
    verdict = "under the bar" if high <= args.bar else "over the bar" if low > args.bar else "at the bar"
    print(f"pooled, {sum(len(v) for v, _ in runs)} rounds in {len(runs)} runs: {args.run} {point:.3f}x "
          f"(95% interval {low:.3f}-{high:.3f}, rounds redrawn within each run), bar {args.bar:.2f}x: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
