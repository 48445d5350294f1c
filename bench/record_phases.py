"""Where a recorded command's extra time goes (issue 24): before the command, while it runs,
and after it exits, against the same command unprofiled.

Each repeat runs the command alone, then under `memprof record -q`, and reads the
recording's meta.json, whose times are CLOCK_MONOTONIC like this script's:

- before: from invoking `record` to the recording's start (`start_ns`: the source follows
  the released target) — the profiler's start-up;
- during: from that start to the last recorded process's exit (`processes[].exit_ns`),
  beside the unprofiled command's whole wall time: what the probes and the recorder's work
  beside the command cost it;
- after: from that exit to `record` returning — the teardown's wait for the kernel's last
  frees, the final flush, detaching, and leaving the process;
- bpf: with --bpf-stats, the summed run time of memprof's BPF programs (meta.json's
  prog_ns_per_run × prog_runs), which the "during" part contains.

Medians of REPEATS runs, alternating.

    sudo .venv/bin/python bench/record_phases.py [--repeats R] [--bpf-stats] [-- CMD ...]

The default command is the training bench's: examples/train.py --steps 300 --start-wait 0
--hold 0 under this Python.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import read_meta  # bench/common.py

REPO = Path(__file__).resolve().parents[1]
MEMPROF = [sys.executable, "-m", "memprof"]  # the memprof on sys.path: bench/bpf_before_after.sh sets it per side
DEFAULT_CMD = [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "300", "--start-wait", "0", "--hold", "0"]


def run_alone(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def run_recorded(cmd: list[str], out: Path) -> dict[str, float]:
    """One recorded run's phases, in seconds (bpf: 0 without bpf stats)."""
    t0 = time.monotonic_ns()
    subprocess.run([*MEMPROF, "record", "-q", "-o", str(out), "--", *cmd], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t1 = time.monotonic_ns()
    meta = read_meta(out)
    start = int(meta["start_ns"])
    exit_ns = max(int(p["exit_ns"]) for p in meta["processes"] if p.get("exit_ns"))
    ebpf = (meta.get("sources") or {}).get("ebpf", {})
    detail = ebpf.get("detail", ebpf)
    per_run, runs = detail.get("prog_ns_per_run") or {}, detail.get("prog_runs") or {}
    bpf_ns = sum(ns * runs.get(name, 0) for name, ns in per_run.items())
    return {"whole": (t1 - t0) / 1e9, "before": (start - t0) / 1e9, "during": (exit_ns - start) / 1e9,
            "after": (t1 - exit_ns) / 1e9, "bpf": bpf_ns / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bpf-stats", action="store_true", help="count BPF program run time (kernel.bpf_stats_enabled)")
    ap.add_argument("cmd", nargs="*", help="the command (after --); default: the training bench's")
    args = ap.parse_args()
    cmd = args.cmd or DEFAULT_CMD
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    if args.bpf_stats:
        stats.write_text("1")
    alone, recorded = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="memprof-phases-") as tmp:
            for i in range(args.repeats):
                alone.append(run_alone(cmd))
                recorded.append(run_recorded(cmd, Path(tmp) / f"run-{i}.memprof"))
    finally:
        if args.bpf_stats:
            stats.write_text("0")
    report(alone, recorded)


def report(alone: list[float], recorded: list[dict[str, float]]) -> None:
    med = lambda key: statistics.median(r[key] for r in recorded)  # noqa: E731
    base = statistics.median(alone)
    print(f"command: median of {len(alone)} alternating runs")
    print(f"unprofiled          {base:7.3f} s")
    print(f"recorded, whole     {med('whole'):7.3f} s  {med('whole') / base:.2f}x")
    print(f"  before the command {med('before'):7.3f} s")
    print(f"  during the command {med('during'):7.3f} s  (+{med('during') - base:.3f} s over unprofiled)")
    print(f"  after its exit     {med('after'):7.3f} s  (range {min(r['after'] for r in recorded):.3f}-"
          f"{max(r['after'] for r in recorded):.3f})")
    if med("bpf"):
        print(f"  BPF programs       {med('bpf'):7.3f} s  (inside 'during')")


if __name__ == "__main__":
    main()
