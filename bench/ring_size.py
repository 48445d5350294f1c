"""The ring buffer's size (`record --ring-buffer`) against lost events and memprof's size (issue 24).

For each SIZE, REPEATS times, in turn:
- `record --ring-buffer SIZE -- kernel_churn N` (millions of kmem events a second) on an
  idle machine, and again with one busy loop per CPU running beside it ("starved": the
  recorder, at SCHED_BATCH, then gets its fair share of the CPUs and no more), reporting
  the events recorded and lost (meta.json);
- `record --ring-buffer SIZE -- true`, reporting memprof's peak RSS (wait4's ru_maxrss).

    sudo .venv/bin/python bench/ring_size.py [--sizes 16,32,64,128] [--repeats R] [--iterations N] [--workers K]

With --workers K, K kernel_churns run at once under one recording (the command is `sh -c`):
the target then takes every CPU, and the recorder drains what they make with what is left.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import read_meta  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
CHURN = ROOT / "examples" / "bin" / "kernel_churn"
MEMPROF = [sys.executable, "-m", "memprof", "record", "-q", "--force"]
TRUE = shutil.which("true")


def recorded(size_mib: int, out: Path, command: list[str]) -> tuple[int, int, int]:
    """(events, lost, peak RSS in bytes) of one recording of `command`."""
    child = subprocess.Popen([*MEMPROF, "--ring-buffer", f"{size_mib}MiB", "-o", str(out), "--", *command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"record of {command} exited with {os.waitstatus_to_exitcode(status)}")
    ebpf = read_meta(out)["sources"]["ebpf"]
    shutil.rmtree(out)
    return ebpf["events"], ebpf["lost"], usage.ru_maxrss * 1024


def with_hogs(run):
    """`run()` with one busy loop per CPU beside it."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        return run()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,32,64,128", help="MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=1, help="kernel_churn processes at once (the command is then sh)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    churn = [str(CHURN), str(args.iterations)]
    if args.workers > 1:
        one = " ".join(churn)
        churn = ["sh", "-c", " & ".join([one] * args.workers) + "; wait"]
    tmp = Path(tempfile.mkdtemp(prefix="memprof-ring-"))
    rows: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
    try:
        for i in range(args.repeats):
            for size in sizes:
                out = tmp / f"r{size}-{i}.memprof"
                rows.setdefault((size, "idle"), []).append(recorded(size, out, churn))
                rows.setdefault((size, "starved"), []).append(with_hogs(lambda: recorded(size, out, churn)))
                rows.setdefault((size, "true"), []).append(recorded(size, out, [TRUE]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"kernel_churn {args.iterations} x {args.workers} at once; {args.repeats} rounds, sizes in turn; lost of events per run")
    print(f"{'ring':>8} {'idle: lost / events':>40} {'starved: lost / events':>44} {'peak RSS, true':>15}")
    for size in sizes:
        idle, starved = rows[(size, "idle")], rows[(size, "starved")]
        rss = statistics.median(r[2] for r in rows[(size, "true")]) / 1e6
        fmt = lambda runs: ", ".join(f"{lost:,}/{events / 1e6:.2f}M" for events, lost, _ in runs)  # noqa: E731
        print(f"{size:>5}MiB {fmt(idle):>40} {fmt(starved):>44} {rss:>12.0f} MB")


if __name__ == "__main__":
    main()
