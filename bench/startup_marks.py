"""Where `memprof record`'s start-up goes: wall-clock marks (ms from the process's start,
as the kernel counts it) at the start-up steps of issue 24, and when the command runs.

Runs `memprof record -q --force -o OUT -- sh -c 'date'` in this interpreter with the steps
wrapped: early.begin, early.take, compiled_cache.load, EbpfSource.start, the kmem attach,
PythonFrames.install; the command prints its own start time. One run per repeat, printed
as one line each.

    sudo .venv/bin/python bench/startup_marks.py [--repeats R]
"""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _process_start_epoch() -> float:
    """This process's start (epoch seconds), from /proc: the marks count from it."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _child(out: str) -> None:
    """One recording, marks on stderr as `MARK <ms> <what>`."""
    t0 = _process_start_epoch()
    sys.path.insert(0, os.path.dirname(HERE))
    # A copy of fd 2: early.py points fd 2 itself at a file while its thread runs.
    marks = open(os.dup(2), "w", buffering=1)

    def mark(what: str) -> None:
        print(f"MARK {(time.time() - t0) * 1e3:.0f} {what}", file=marks, flush=True)

    def wrap(owner, name: str) -> None:
        target = getattr(owner, name)

        @functools.wraps(target)
        def wrapped(*a, **k):
            mark(f"> {name}")
            try:
                return target(*a, **k)
            finally:
                mark(f"< {name}")
        setattr(owner, name, wrapped)

    from memprof.sources.ebpf import compiled_cache, early
    from memprof.sources.ebpf import loading, source
    from memprof.sources.cpython import frames
    for owner, name in ((early, "begin"), (early, "take"), (compiled_cache, "load"), (source.EbpfSource, "start"),
                        (loading.Tracepoints, "attach"), (frames.PythonFrames, "install")):
        wrap(owner, name)
    from cli.main import main
    sys.argv = ["memprof", "record", "-q", "--force", "-o", out, "--", "sh", "-c", "echo MARK-EPOCH $(date +%s.%N) >&2"]
    mark("cli imported")
    print(f"EPOCH0 {t0}", file=marks, flush=True)
    main()


def _one_run(out: str) -> list[tuple[int, str]]:
    proc = subprocess.run([sys.executable, __file__, "--child", out], capture_output=True, text=True)
    marks, t0 = [], None
    for line in proc.stderr.splitlines():
        if line.startswith("EPOCH0 "):
            t0 = float(line.split()[1])
        elif line.startswith("MARK-EPOCH ") and t0 is not None:
            marks.append((round((float(line.split()[1]) - t0) * 1e3), "the command runs"))
        elif line.startswith("MARK "):
            _, ms, what = line.split(" ", 2)
            marks.append((int(ms), what))
    return sorted(marks, key=lambda m: m[0])  # stable: a call's > before its <


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child)
    with tempfile.TemporaryDirectory(prefix="memprof-marks-") as tmp:
        for i in range(args.repeats):
            print("; ".join(f"{ms} {what}" for ms, what in _one_run(os.path.join(tmp, f"m{i}.memprof"))))


if __name__ == "__main__":
    main()
