"""Overhead of `memprof record --sources kmem,native` on examples/native_churn (malloc/free churn).

Runs, alternately and REPEATS times each: the workload alone; under `memprof record` with
the libc heap recorded exactly (every allocation, `--native-sample-bytes 0`) and sampled by
size (`--native-sample-bytes 65536`, the default: an allocation of S bytes is kept with
probability min(1, S/65536)), both through memprof's LD_PRELOAD interposer (memprof/preload);
exactly again through uprobes on libc (`--native-probes uprobes`: uprobes); and under bcc's
`memleak` in user mode (`-p PID`: uprobes and uretprobes on
libc's allocators, a user stack per allocation, pairing in the kernel) when installed.
Reports the median of the workload's own loop time (it prints `loop_s=`) and of its wall
time, as ratios to the unprofiled median measured in the same run (machines here are noisy).

memleak can only attach to a running process, so for it the workload waits MEMLEAK_WAIT ms
before its loop (-w): memleak compiles its program, prints "Attaching to pid N", then attaches
its probes; a run whose probes were not on before the loop began is reported and not counted.
Its wall time includes that wait, so compare its loop time only.

    sudo .venv/bin/python bench/native_overhead.py [--churn C] [--repeats R] [--runs baseline,exact,sampled,uprobes,memleak]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import loop_seconds, read_meta, run, sources_line  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
CHURN = ROOT / "examples" / "bin" / "native_churn"
MEMPROF = [sys.executable, "-m", "memprof"]
MEMLEAK = shutil.which("memleak-bpfcc")
RUNS = ("baseline", "exact", "sampled", "uprobes", "memleak")
SAMPLE_BYTES = 65536
PROBE_ATTACH_S = 0.5  # after memleak's "Attaching" line: 13 uprobes/uretprobes on libc






class LateAttach(RuntimeError):
    """memleak's probes were not on before the workload's loop began."""


def memleak_run(churn: int, wait_ms: int) -> tuple[float, float]:
    """The workload waiting `wait_ms` before its loop, with memleak attached to it meanwhile."""
    t0 = time.monotonic()
    target = subprocess.Popen([str(CHURN), "-c", str(churn), "-w", str(wait_ms), "-t", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tracer = None
    try:
        first = target.stdout.readline()  # "pid=N", printed just before the wait
        loop_starts = time.monotonic() + wait_ms / 1000
        found = re.match(r"pid=(\d+)", first)
        if not found:
            raise RuntimeError(f"native_churn printed {first.strip()!r}, not pid=N")
        pid = int(found.group(1))
        # interval 60 s: no periodic report while it runs; its compiler warnings go to stderr
        tracer = subprocess.Popen([MEMLEAK, "-p", str(pid), "60"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = tracer.stdout.readline()
        if "Attaching to pid" not in line:
            raise RuntimeError(f"memleak did not start: {line.strip()!r} (exit {tracer.poll()})")
        time.sleep(PROBE_ATTACH_S)  # it prints that line before attaching its probes
        late = time.monotonic() - loop_starts
        out, err = target.communicate(timeout=600)
        wall = time.monotonic() - t0
        loop = loop_seconds(target.returncode, first + out, err)
        if late > 0:
            raise LateAttach(f"memleak attached {late:.2f}s after the loop began (raise --memleak-wait-ms)")
        return loop, wall
    finally:
        if tracer is not None:
            tracer.terminate()
            tracer.wait()
        if target.poll() is None:
            target.kill()
            target.wait()


def commands(workload: list[str], tmp: Path, i: int) -> dict[str, list[str]]:
    record = [*MEMPROF, "record", "-q", "--sources", "kmem,native"]
    return {
        "baseline": workload,
        "exact": [*record, "--native-sample-bytes", "0", "-o", str(tmp / f"exact-{i}.memprof"), "--", *workload],
        "uprobes": [*record, "--native-sample-bytes", "0", "--native-probes", "uprobes",
                    "-o", str(tmp / f"uprobes-{i}.memprof"), "--", *workload],
        "sampled": [*record, "--native-sample-bytes", str(SAMPLE_BYTES), "-o", str(tmp / f"sampled-{i}.memprof"),
                    "--", *workload],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--churn", type=int, default=2_000_000, help="malloc/free pairs (native_churn -c)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {','.join(RUNS)}; "
                    "baseline is always run (ratios need it)")
    ap.add_argument("--memleak-wait-ms", type=int, default=1500, help="native_churn -w for the memleak runs")
    args = ap.parse_args()
    if not CHURN.exists():
        sys.exit(f"{CHURN} is missing: make -C examples")
    wanted = ["baseline"] + [r for r in args.runs.split(",") if r in RUNS and r != "baseline"]
    skipped: dict[str, str] = {}
    if "memleak" in wanted and not MEMLEAK:
        skipped["memleak"] = "memleak-bpfcc not installed (apt-get install bpfcc-tools)"
    workload = [str(CHURN), "-c", str(args.churn), "-w", "0", "-t", "0"]
    tmp = Path(tempfile.mkdtemp(prefix="memprof-bench-"))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in wanted}
    late: list[str] = []
    metas: dict[str, dict] = {}
    try:
        for i in range(args.repeats):
            for name in wanted:
                if name in skipped:
                    continue
                try:
                    if name == "memleak":
                        results[name].append(memleak_run(args.churn, args.memleak_wait_ms))
                    else:
                        results[name].append(run(commands(workload, tmp, i)[name]))
                except LateAttach as error:
                    late.append(str(error))
                except RuntimeError as error:
                    skipped[name] = str(error)  # report why, keep measuring the others
                recording = tmp / f"{name}-{i}.memprof"
                if recording.exists():
                    metas[name] = read_meta(recording)
                    shutil.rmtree(recording, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, skipped, late, metas, args)




def report(results, skipped, late, metas, args) -> None:
    if not results["baseline"]:
        print(f"baseline failed: {skipped.get('baseline')}")
        return
    base_loop = statistics.median(r[0] for r in results["baseline"])
    base_wall = statistics.median(r[1] for r in results["baseline"])
    print(f"native_churn {args.churn:,} malloc/free pairs, median of {args.repeats} alternating runs")
    print(f"{'run':<10}{'n':>3}{'loop s':>9}{'loop x':>9}{'+us/pair':>10}{'wall s':>9}{'wall x':>9}")
    for name, rows in results.items():
        if not rows:
            continue
        loop = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        wall_x = "-" if name == "memleak" else f"{wall / base_wall:.2f}"  # its wall includes the wait
        added_us = (loop - base_loop) / args.churn * 1e6 if args.churn else 0.0  # per malloc/free pair
        print(f"{name:<10}{len(rows):>3}{loop:>9.3f}{loop / base_loop:>9.2f}{added_us:>10.2f}{wall:>9.3f}{wall_x:>9}")
    print("+us/pair: loop time added per malloc/free pair, microseconds")
    print(f"exact: --sources kmem,native --native-sample-bytes 0; sampled: --native-sample-bytes {SAMPLE_BYTES}; "
          "uprobes: exact, --native-probes uprobes; "
          f"memleak: memleak-bpfcc -p PID (waits {args.memleak_wait_ms} ms to attach; wall includes it)")
    for why in late:
        print(f"memleak run not counted: {why}")
    for name, why in skipped.items():
        print(f"{name}: not measured ({len(results.get(name, []))} runs done): {why}")
    for name, meta in metas.items():
        print(f"memprof {name}, last run, per source: {sources_line(meta)}")




if __name__ == "__main__":
    main()
