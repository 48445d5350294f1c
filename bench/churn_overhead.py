"""Overhead of `memprof record` on examples/kernel_churn (millions of kmem events a second).

Runs, alternately and REPEATS times each: the workload alone, under the two floors of
bench/bpf_floor.py (floor-empty: programs that return at once on the tracepoints memprof
uses; floor-record: one 72-byte record per allocation and free to a drained ring buffer,
the least a recorder of every event pays), under `memprof record` (default kernel source),
and under bcc's `memleak` in kernel mode when installed. Reports the median of the
workload's own loop time (it prints `loop_s=`) and of its wall time, as ratios to the
unprofiled median measured in the same run (machines here are noisy).

With --sample-bytes SIZE (default 16KiB; 0 leaves them out), two more runs: memprof-sampled,
`memprof record --kernel-sample-bytes SIZE`, and memleak-sampled, `memleak -s N` with N the
one-in-N of the kernel's allocations that memprof's sampled recording took (memleak samples
every Nth allocation), and the sampled recording's weighted totals over the unsampled one's
(allocations, bytes allocated): how far the estimates land from the exact counts.

    sudo .venv/bin/python bench/churn_overhead.py [--iterations N] [--repeats R] [--no-floors] [--no-memleak]
                                                  [--sample-bytes SIZE]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import read_meta, run  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
CHURN = ROOT / "examples" / "bin" / "kernel_churn"
MEMPROF = [sys.executable, "-m", "memprof"]
MEMLEAK = shutil.which("memleak-bpfcc")
FLOOR = [sys.executable, str(ROOT / "bench" / "bpf_floor.py")]


def memleak_run(workload: list[str], every: int = 1) -> tuple[float, float]:
    """bcc's memleak in kernel mode (no -p: it traces kmalloc/kmem_cache/page allocations
    system-wide, with a stack per allocation and in-kernel pairing) while the workload runs;
    `every` > 1 samples one allocation in that many (memleak -s)."""
    sample = ["-s", str(every)] if every > 1 else []
    tracer = subprocess.Popen([MEMLEAK, *sample, "60"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = tracer.stdout.readline()  # "Attaching to kernel allocators, Ctrl+C to quit." once probes are on
        if "Attaching" not in line:
            raise RuntimeError(f"memleak did not start: {line!r}")
        time.sleep(1.0)  # it prints before attaching the last probes
        return run(workload)
    finally:
        tracer.terminate()
        tracer.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memleak", action="store_true")
    ap.add_argument("--no-floors", action="store_true", help="leave out bench/bpf_floor.py's two runs")
    ap.add_argument("--sample-bytes", default="16KiB",
                    help="memprof-sampled's --kernel-sample-bytes (0: no sampled runs)")
    args = ap.parse_args()
    workload = [str(CHURN), str(args.iterations)]
    tmp = Path(tempfile.mkdtemp(prefix="memprof-bench-"))
    results: dict[str, list[tuple[float, float]]] = {"baseline": [], "floor-empty": [], "floor-record": [],
                                                      "memprof": [], "memprof-sampled": [], "memleak": [],
                                                      "memleak-sampled": []}
    sampled = args.sample_bytes not in ("0", "")
    estimates: list[tuple[float, float, float]] = []
    for i in range(args.repeats):
        results["baseline"].append(run(workload))
        if not args.no_floors:
            for mode in ("empty", "record"):
                results[f"floor-{mode}"].append(run([*FLOOR, mode, "--", *workload]))
        rec = tmp / f"churn-{i}.memprof"
        results["memprof"].append(run(MEMPROF + ["record", "-q", "-o", str(rec), "--", *workload]))
        meta = read_meta(rec).get("sources", {}).get("ebpf", {})
        if sampled:
            sampled_rec = tmp / f"churn-{i}-sampled.memprof"
            results["memprof-sampled"].append(run(MEMPROF + ["record", "-q", "-o", str(sampled_rec),
                                                             "--kernel-sample-bytes", args.sample_bytes, "--",
                                                             *workload]))
            estimates.append(kernel_estimates(sampled_rec, rec))
            shutil.rmtree(sampled_rec)
        shutil.rmtree(rec)
        if MEMLEAK and not args.no_memleak:
            results["memleak"].append(memleak_run(workload))
            if estimates:
                results["memleak-sampled"].append(memleak_run(workload, round(estimates[-1][0])))
    report(results, meta, args)
    if estimates:
        print(f"memprof-sampled ({args.sample_bytes}): one kernel allocation in "
              + ", ".join(f"{e[0]:.0f}" for e in estimates) + " recorded; weighted over exact, per run:")
        for i, layer in enumerate(LAYERS):
            print(f"  {layer}: allocations " + ", ".join(f"{e[1 + 2 * i]:.3f}" for e in estimates)
                  + "; bytes allocated " + ", ".join(f"{e[2 + 2 * i]:.3f}" for e in estimates))
    shutil.rmtree(tmp, ignore_errors=True)


LAYERS = ("kernel_slab", "kernel_page")


def kernel_estimates(sampled: Path, exact: Path) -> tuple[float, ...]:
    """(exact kernel allocations over the sampled recording's rows, i.e. one in how many it
    took; then per layer of LAYERS, its weighted allocation count and bytes allocated over the
    exact recording's). The two are separate runs of one deterministic workload, so the
    ratios hold the run-to-run difference as well: how many slab pages a run takes depends
    on when RCU frees, which the recorder's speed moves."""
    from memprof.recording.reader import open_recording
    totals = {}
    for name, path in (("sampled", sampled), ("exact", exact)):
        events = open_recording(path).events
        allocs = events[events["action"] == "alloc"]
        totals[name] = {"rows": int(allocs["layer"].isin(LAYERS).sum())}
        for layer in LAYERS:
            rows = allocs[allocs["layer"] == layer]
            weight = rows["weight"].fillna(1.0)
            totals[name][layer] = (weight.sum(), (weight * rows["size_bytes"]).sum())
    sampled_totals, exact_totals = totals["sampled"], totals["exact"]
    ratios = [exact_totals["rows"] / max(sampled_totals["rows"], 1)]
    for layer in LAYERS:
        ratios += [s / e if e else float("nan") for s, e in zip(sampled_totals[layer], exact_totals[layer])]
    return tuple(ratios)


def report(results, meta, args) -> None:
    base_loop = statistics.median(r[0] for r in results["baseline"])
    base_wall = statistics.median(r[1] for r in results["baseline"])
    print(f"kernel_churn {args.iterations} iterations, median of {args.repeats} alternating runs")
    print(f"{'run':<14}{'loop s':>9}{'loop x':>8}{'wall s':>9}{'wall x':>8}")
    for name, rows in results.items():
        if not rows:
            continue
        loop = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        print(f"{name:<14}{loop:>9.3f}{loop / base_loop:>8.2f}{wall:>9.3f}{wall / base_wall:>8.2f}")
    print(f"memprof last run: events={meta['events']:,} lost={meta['lost']} missed={meta['missed']} "
          f"nested_frees_recovered={meta['detail'].get('nested_frees_recovered')}")


if __name__ == "__main__":
    main()
