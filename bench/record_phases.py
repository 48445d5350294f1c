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
  prog_ns_per_run × prog_runs), which the "during" part contains; and for the programs
  that took the most, each one's nanoseconds a run and runs;
- CPU: user and system seconds of `record` and all it waited for (the command among them;
  wait4's rusage), against the command's alone: what recording costs the machine, the BPF
  programs included (they run in the command's context). Less noisy than the wall times on
  a shared host. The recorder's own share (meta.json's recorder_cpu_ns, where the recorder
  writes it) by phase: before its loop, while the command runs, after its exit.

Medians of REPEATS runs, alternating.

    sudo .venv/bin/python bench/record_phases.py [--repeats R] [--bpf-stats] [-- CMD ...]

The default command is the training bench's: examples/train.py --steps 300 --start-wait 0
--hold 0 under this Python.
"""
from __future__ import annotations

import argparse
import os
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


def run_alone(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s: user and system of the command and what it waited for)."""
    t0 = time.monotonic()
    cpu = _run_for_cpu(cmd, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0, cpu


def _run_for_cpu(cmd: list[str], **popen) -> float:
    """Run `cmd` to its end: its CPU seconds, user and system, with its waited-for children's
    (wait4's rusage). Raises CalledProcessError on a nonzero exit, as check=True would."""
    proc = subprocess.Popen(cmd, **popen)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return usage.ru_utime + usage.ru_stime


def run_recorded(cmd: list[str], out: Path) -> dict[str, float]:
    """One recorded run's phases, in seconds (bpf: 0 without bpf stats)."""
    t0 = time.monotonic_ns()
    cpu = _run_for_cpu([*MEMPROF, "record", "-q", "-o", str(out), "--", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t1 = time.monotonic_ns()
    meta = read_meta(out)
    start = int(meta["start_ns"])
    exit_ns = max(int(p["exit_ns"]) for p in meta["processes"] if p.get("exit_ns"))
    ebpf = (meta.get("sources") or {}).get("ebpf", {})
    detail = ebpf.get("detail", ebpf)
    per_run, runs = detail.get("prog_ns_per_run") or {}, detail.get("prog_runs") or {}
    bpf_ns = sum(ns * runs.get(name, 0) for name, ns in per_run.items())
    own = meta.get("recorder_cpu_ns") or {}
    return {"whole": (t1 - t0) / 1e9, "before": (start - t0) / 1e9, "during": (exit_ns - start) / 1e9,
            "after": (t1 - exit_ns) / 1e9, "bpf": bpf_ns / 1e9, "cpu": cpu,
            **{f"ns_a_run:{name}": ns for name, ns in per_run.items()},
            **{f"runs:{name}": runs.get(name, 0) for name in per_run},
            **{f"own_{phase}": own[phase] / 1e9 for phase in ("before", "during", "after") if phase in own}}


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


def report(alone: list[tuple[float, float]], recorded: list[dict[str, float]]) -> None:
    med = lambda key: statistics.median(r[key] for r in recorded)  # noqa: E731
    base = statistics.median(wall for wall, _ in alone)
    base_cpu = statistics.median(cpu for _, cpu in alone)
    print(f"command: median of {len(alone)} alternating runs")
    print(f"unprofiled          {base:7.3f} s")
    print(f"recorded, whole     {med('whole'):7.3f} s  {med('whole') / base:.2f}x")
    print(f"  before the command {med('before'):7.3f} s")
    print(f"  during the command {med('during'):7.3f} s  (+{med('during') - base:.3f} s over unprofiled)")
    print(f"  after its exit     {med('after'):7.3f} s  (range {min(r['after'] for r in recorded):.3f}-"
          f"{max(r['after'] for r in recorded):.3f})")
    if med("bpf"):
        print(f"  BPF programs       {med('bpf'):7.3f} s  (inside 'during')")
        _report_programs(recorded)
    print(f"CPU, recorded       {med('cpu'):7.3f} s  (+{med('cpu') - base_cpu:.3f} s over unprofiled, {base_cpu:.3f} s)")
    if all("own_during" in r for r in recorded):
        print(f"  the recorder's own {med('own_before'):7.3f} s before its loop, {med('own_during'):.3f} s during, "
              f"{statistics.median(r.get('own_after', 0.0) for r in recorded):.3f} s after")


def _report_programs(recorded: list[dict[str, float]], top: int = 5) -> None:
    """The BPF programs that took the most time: each one's median ns a run, and runs."""
    names = {key.split(":", 1)[1] for r in recorded for key in r if key.startswith("ns_a_run:")}
    med = lambda key: statistics.median(r.get(key, 0) for r in recorded)  # noqa: E731
    by_time = sorted(names, key=lambda name: med(f"ns_a_run:{name}") * med(f"runs:{name}"), reverse=True)
    for name in by_time[:top]:
        print(f"    {name:24s} {med(f'ns_a_run:{name}'):7.0f} ns a run, {med(f'runs:{name}'):9.0f} runs")


if __name__ == "__main__":
    main()
