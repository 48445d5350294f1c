"""Start-up of `memprof record`, as a user feels it (issue 24), beside bcc's memleak.

- latency: from invoking `record -q -- date +%s%N` to `date` running (it prints
  CLOCK_REALTIME as soon as it runs), against running `date` directly (fork + exec);
- returning: the wall time of `record -q -- true`;
- peak RSS: the largest of the recorder and the processes it reaped (its compile children on a
  first run, the command): wait4's ru_maxrss of `record -q -- true`; and the recorder's alone
  (meta.json's recorder_peak_rss_bytes, where the revision writes it).

Each is measured twice per repeat: warm (bcc's compiled program taken from memprof's cache,
sources/ebpf/compiled_cache.py; a first run before the repeats makes sure the entry is
there) and cold, as the first run after install is (MEMPROF_BPF_CACHE=0: bcc compiles;
MEMPROF_SYMBOL_CACHE=0: libraries' and the kernel's symbols are read from their files;
the true first run also writes the entry, 5-10 ms on the compile thread).

The anchor is bcc's memleak tracing the kernel for one interval (`memleak-bpfcc 1 1`): its
wall time less that 1 s interval, and its peak RSS. (`memleak-bpfcc -c CMD` is no anchor
here: on this Debian it exits with "could not determine address of symbol malloc" after
0.5-0.8 s, with or without -O libc.so.6.)

Median of REPEATS runs; each repeat runs every measurement once, in turn, as this host is
noisy.

    sudo .venv/bin/python bench/startup_latency.py [--repeats R]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATE = shutil.which("date")
TRUE = shutil.which("true")
MEMLEAK = shutil.which("memleak-bpfcc")


COLD = {**os.environ, "MEMPROF_BPF_CACHE": "0", "MEMPROF_SYMBOL_CACHE": "0"}


def latency(prefix: list[str], env: dict | None = None) -> float:
    """Seconds from invoking `prefix + date` to date's first instruction."""
    t0 = time.time_ns()
    out = subprocess.run([*prefix, DATE, "+%s%N"], capture_output=True, text=True, check=True, env=env).stdout
    started = int(out.strip().splitlines()[0])
    return (started - t0) / 1e9


def returning(argv: list[str], env: dict | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of running `argv` to its end."""
    t0 = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {child.returncode}")
    return wall, usage.ru_maxrss * 1024


def median_line(label: str, values: list[float], scale: float, unit: str) -> str:
    scaled = [v * scale for v in values]
    return f"{label}: {statistics.median(scaled):,.0f} {unit} (min {min(scaled):,.0f}, max {max(scaled):,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memprof-startup-"))
    memprof = [sys.executable, "-m", "memprof", "record", "-q", "--force"]
    rows: dict[str, list[float]] = {k: [] for k in ("direct", "latency", "wall", "rss", "latency_cold", "wall_cold",
                                                    "rss_cold", "own_rss", "own_rss_cold", "memleak_wall",
                                                    "memleak_rss")}
    try:
        returning([*memprof, "-o", str(tmp / "prime.memprof"), "--", TRUE])  # the cache entry, if absent
        for i in range(args.repeats):
            rows["direct"].append(latency([]))
            for suffix, env in (("", None), ("_cold", COLD)):
                rows["latency" + suffix].append(latency([*memprof, "-o", str(tmp / f"date{i}.memprof"), "--"], env))
                wall, rss = returning([*memprof, "-o", str(tmp / f"true{i}.memprof"), "--", TRUE], env)
                rows["wall" + suffix].append(wall)
                rows["rss" + suffix].append(rss)
                own = json.loads((tmp / f"true{i}.memprof" / "meta.json").read_text()).get("recorder_peak_rss_bytes")
                if own:
                    rows["own_rss" + suffix].append(own)
            if MEMLEAK:
                wall, rss = returning([MEMLEAK, "1", "1"])
                rows["memleak_wall"].append(wall - 1.0)
                rows["memleak_rss"].append(rss)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"median of {args.repeats}:")
    for suffix, what in (("", "warm (compiled program from the cache)"), ("_cold", "cold (bcc compiles: a first run)")):
        print(f"  {what}:")
        print("    " + median_line("reaching the command: memprof record", rows["latency" + suffix], 1e3, "ms")
              + f"; date directly {statistics.median(rows['direct']) * 1e3:.1f} ms")
        print("    " + median_line("returning: memprof record -- true", rows["wall" + suffix], 1e3, "ms"))
        print("    " + median_line("peak RSS: memprof record -- true", rows["rss" + suffix], 1e-6, "MB"))
        if rows["own_rss" + suffix]:
            print("      " + median_line("of which the recorder alone", rows["own_rss" + suffix], 1e-6, "MB"))
    if MEMLEAK:
        print("  " + median_line("returning: memleak-bpfcc 1 1, less its 1 s interval", rows["memleak_wall"], 1e3, "ms"))
        print("  " + median_line("peak RSS: memleak-bpfcc 1 1", rows["memleak_rss"], 1e-6, "MB"))
    else:
        print("  (memleak-bpfcc not installed: no anchor)")


if __name__ == "__main__":
    main()
