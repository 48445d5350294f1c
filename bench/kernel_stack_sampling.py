"""Are sampled kernel stacks honest? Per-chain counts at the default stack sampling against
an unsampled recording of the same workload, and what the sampling saves on kernel churn.

Records each workload REPEATS times at the default sampling (`--stack-every 64`) and REPEATS
times unsampled (`--stack-every 1 --page-stack-every 1 --user-stack-every 1`), alternating,
and prints for every kernel chain `report leaks` names (one row per chain of kernel frames)
its live count in each run. The unsampled run is the truth: every allocation took its own
stack. A chain whose sampled count strays from the unsampled one by more than --tolerance
(default 10 %) is marked `<-`. The workloads (examples/), each holding what it allocates:

  kernel_leak      N pipes (`-n`, 101), while churning pipes and socketpairs it closes: a
                   pipe's two files come through alloc_empty_file at one call site
  socket_per_step  a socket pair per step (`--steps`, 101), from Python: a pair's two sockets
                   come through the same functions, called twice from __sys_socketpair
  two_sites        200 pipes from two C functions calling pipe() at one stack depth, held 1 s

With --churn ITERATIONS it also runs examples/bin/kernel_churn alone and under the default
recording, alternating, and prints the loop-time ratio (median over median): the cost that
sampling keeps down. (bench/bpf_before_after.sh compares two revisions of bpf/ on that ratio.)
Exits 1 when any chain strays.

    sudo .venv/bin/python bench/kernel_stack_sampling.py [--workloads kernel_leak,socket_per_step,two_sites]
        [--pipes 101] [--repeats 3] [--churn 100000]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import run  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
LEAK = ROOT / "examples" / "bin" / "kernel_leak"
SOCKETS = ROOT / "examples" / "socket_per_step.py"
TWO_SITES = ROOT / "examples" / "bin" / "two_sites"
CHURN = ROOT / "examples" / "bin" / "kernel_churn"
MEMPROF = [sys.executable, "-m", "memprof"]
UNSAMPLED = ["--stack-every", "1", "--page-stack-every", "1", "--user-stack-every", "1"]


def chain_counts(recording: Path) -> dict[tuple[str, ...], int]:
    """Live count per chain of kernel frames (layer first) in `report leaks`: every finding,
    held to exit or not. Findings that differ only in their user frames are summed."""
    out = subprocess.run(MEMPROF + ["report", "leaks", str(recording), "--format", "json",
                                    "--top", "100000"],
                         capture_output=True, text=True, check=True).stdout
    counts: dict[tuple[str, ...], int] = {}
    for f in json.loads(out)["findings"]:
        if not f["layer"].startswith("kernel"):
            continue
        chain = (f["layer"], *[x["function"] or "?" for x in f["stack"] if x["kind"] == "kernel"])
        counts[chain] = counts.get(chain, 0) + int(f["live_count"])
    return counts


def record(tmp: Path, name: str, extra: list[str], workload: list[str]) -> dict[tuple[str, ...], int]:
    rec = tmp / f"{name}.memprof"
    subprocess.run(MEMPROF + ["record", "-q", "-o", str(rec), *extra, "--", *workload],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return chain_counts(rec)
    finally:
        shutil.rmtree(rec, ignore_errors=True)


def median_counts(runs: list[dict]) -> dict[tuple[str, ...], float]:
    chains = set().union(*runs)
    return {c: statistics.median(r.get(c, 0) for r in runs) for c in chains}


def short(chain: tuple[str, ...], frames: int) -> str:
    return f"{chain[0]}: " + " <- ".join(chain[1:1 + frames])


def workload_argv(name: str, args) -> list[str]:
    """The command line of workload `name` (see the module docstring)."""
    if name == "kernel_leak":
        return [str(LEAK), "-n", str(args.pipes), "-c", str(args.churn_in_leak)]
    if name == "socket_per_step":
        return [sys.executable, str(SOCKETS), "--steps", str(args.pipes)]
    if name == "two_sites":
        return [str(TWO_SITES), "-t", "1000"]  # held a second: older than the leak report's 500 ms
    raise SystemExit(f"unknown workload {name!r}: kernel_leak, socket_per_step or two_sites")


def report_counts(title: str, sampled: list[dict], unsampled: list[dict], args) -> int:
    """Print the table; return how many chains stray beyond the tolerance (in any run)."""
    s, u = median_counts(sampled), median_counts(unsampled)
    rows = sorted(set(s) | set(u), key=lambda c: (-u.get(c, 0), -s.get(c, 0)))
    rows = [c for c in rows if max(u.get(c, 0), s.get(c, 0)) >= args.min_count]
    print(f"{title}: live count per kernel chain, "
          f"median of {args.repeats} runs each (per run in brackets: unsampled/sampled)")
    print(f"{'unsampled':>10}{'sampled':>10}{'worst':>8}  chain")
    strays = 0
    for c in rows:
        truth, got = u.get(c, 0), s.get(c, 0)
        # The worst run, not the median: two runs off by +40 % and -40 % make a fine median.
        err = max(((r.get(c, 0) - truth) / truth if truth else float("inf") for r in sampled), key=abs)
        stray = abs(err) > args.tolerance
        strays += stray
        runs = "/".join(",".join(str(r.get(c, 0)) for r in side) for side in (unsampled, sampled))
        print(f"{truth:>10g}{got:>10g}{err:>+8.0%}  {short(c, args.frames)} [{runs}]{'  <-' if stray else ''}")
    print(f"{strays} of {len(rows)} chains (>= {args.min_count} objects) off by more than {args.tolerance:.0%} "
          f"in some sampled run ('worst': that run's error against the unsampled median)")
    return strays


def churn_ratio(args, tmp: Path) -> None:
    base, rec = [], []
    workload = [str(CHURN), str(args.churn)]
    for i in range(args.repeats):
        base.append(run(workload)[0])
        out = tmp / f"churn-{i}.memprof"
        rec.append(run(MEMPROF + ["record", "-q", "-o", str(out), "--", *workload])[0])
        shutil.rmtree(out, ignore_errors=True)
    ratio = statistics.median(rec) / statistics.median(base)
    print(f"kernel_churn {args.churn}: loop {statistics.median(base):.3f} s alone, "
          f"{statistics.median(rec):.3f} s recorded (default sampling): {ratio:.2f}x "
          f"(median of {args.repeats} alternating runs each)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipes", type=int, default=101)
    ap.add_argument("--churn-in-leak", type=int, default=2000, help="kernel_leak's -c")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--min-count", type=int, default=20, help="chains with fewer objects are not shown")
    ap.add_argument("--frames", type=int, default=5, help="kernel frames shown per chain")
    ap.add_argument("--churn", type=int, default=0, help="also the churn cost ratio, with this many iterations")
    ap.add_argument("--workloads", default="kernel_leak,socket_per_step,two_sites",
                    help="comma-separated: kernel_leak, socket_per_step, two_sites")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memprof-kstack-"))
    strays = 0
    try:
        for name in args.workloads.split(","):
            workload = workload_argv(name, args)
            sampled, unsampled = [], []
            for i in range(args.repeats):
                sampled.append(record(tmp, f"{name}-sampled-{i}", [], workload))
                unsampled.append(record(tmp, f"{name}-unsampled-{i}", UNSAMPLED, workload))
            program_args = workload[2:] if workload[0] == sys.executable else workload[1:]
            strays += report_counts(" ".join([name, *program_args]), sampled, unsampled, args)
            print()
        if args.churn:
            churn_ratio(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if strays else 0)


if __name__ == "__main__":
    main()
