"""What `memprof record --sources +native` costs a whole Python command, against memray --native,
and how close its byte-sampled libc heap totals come to the unsampled run's (issue 24).

Workloads (each a whole command: interpreter start, `import torch`, the work, exit):
  gpt2   examples/generate_kv.py --tokens T (GPT-2 from transformers, random weights: LLM
         inference, allocation-heavy)
  train  examples/train.py --steps S --start-wait 0 --hold 0 (the CPU training bench)

Runs, alternately and REPEATS times each, in a rotated order each round:
  baseline        the command alone
  memprof         memprof record -q (default sources: no libc heap)
  native          memprof record -q --sources +native (the defaults: memprof's LD_PRELOAD
                  interposer, --native-sample-bytes 64KiB)
  native-exact    the same with --native-sample-bytes 0 (every libc allocation)
  native-uprobes  --sources +native --native-probes uprobes (the old way: uprobes on libc,
                  sampled in BPF at the default); not in the default runs: ~85 s a GPT-2 run
  memray          python -m memray run --native -q -f -o FILE (every allocation, native stacks)

Prints, per workload and run, the median wall time of the whole command and its ratio to
the baseline's median in the same run (machines here are noisy), the same for the work alone
(the time the workload prints: generate_kv.py's `seconds=`, the generation loop; train.py's
`loop_s=`): what the profiler costs once started, apart from its start-up and finalization;
and, for the native runs,
the libc heap's weighted totals from each recording (allocations, bytes allocated, bytes
live at the end: memprof.api.analyse) as a ratio to native-exact's (median over rounds).
The totals also move from one exact run to the next (threads, the allocator's state): the
spread of native-exact's own totals over the rounds is printed beside them.

    sudo .venv/bin/python bench/native_cost.py [--workloads gpt2,train] [--repeats R] [--tokens T] [--steps S]
                                               [--runs baseline,memprof,native,native-exact,memray]
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ensure_memray, read_meta, rotated  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
MEMPROF = [sys.executable, "-m", "memprof", "record", "-q", "--force"]
RUNS = ("baseline", "memprof", "native", "native-exact", "native-uprobes", "memray")
DEFAULT_RUNS = ("baseline", "memprof", "native", "native-exact", "memray")
NATIVE_RUNS = ("native", "native-exact", "native-uprobes")


def workload(name: str, args) -> list[str]:
    if name == "gpt2":
        return [sys.executable, str(ROOT / "examples" / "generate_kv.py"), "--tokens", str(args.tokens)]
    return [sys.executable, str(ROOT / "examples" / "train.py"), "--steps", str(args.steps),
            "--start-wait", "0", "--hold", "0"]


def command(run: str, work: list[str], out: Path) -> list[str]:
    """The whole command of one run; `out` is where its recording (or memray's file) goes."""
    if run == "baseline":
        return work
    if run == "memray":
        return [sys.executable, "-m", "memray", "run", "--native", "-q", "-f", "-o", str(out), *work[1:]]
    extra = {"memprof": [], "native": ["--sources", "+native"],
             "native-exact": ["--sources", "+native", "--native-sample-bytes", "0"],
             "native-uprobes": ["--sources", "+native", "--native-probes", "uprobes"]}[run]
    return [*MEMPROF, *extra, "-o", str(out), "--", *work]


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds of `cmd`, which must exit 0; the seconds its work took, as it printed them)."""
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    work = re.search(r"(?:loop_s|seconds)=([0-9.]+)", done.stdout)
    if done.returncode != 0 or not work:
        raise RuntimeError(f"{cmd[:6]}… exited {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    return wall, float(work.group(1))


def native_totals(recording: Path) -> dict[str, float]:
    """The libc heap's weighted allocations, bytes, and bytes live at the end."""
    from memprof.api import analyse
    allocations = analyse(recording).lifetimes.allocations
    native = allocations[allocations["layer"] == "native_heap"]
    weight = native["weight"].astype(float)
    weighted_bytes = weight * native["size_bytes"].astype(float)
    return {"allocations": float(weight.sum()), "bytes": float(weighted_bytes.sum()),
            "live_at_end": float(weighted_bytes[native["end_kind"] == "live"].sum()), "rows": float(len(native))}


def measure(name: str, runs: list[str], args, tmp: Path):
    walls: dict[str, list[tuple[float, float]]] = {run: [] for run in runs}
    totals: dict[str, list[dict]] = {run: [] for run in runs if run in NATIVE_RUNS}
    lost: dict[str, list[int]] = {run: [] for run in runs if run != "baseline" and run != "memray"}
    work = workload(name, args)
    for i in range(args.repeats):
        for run in rotated(runs, i):
            out = tmp / f"{name}-{run}-{i}.{'bin' if run == 'memray' else 'memprof'}"
            walls[run].append(timed(command(run, work, out)))
            if run in lost:
                lost[run].append(int((read_meta(out).get("sources") or {}).get("ebpf", {}).get("lost", -1)))
            if run in totals:
                totals[run].append(native_totals(out))
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
    return walls, totals, lost


def report(name: str, work: list[str], walls, totals, lost, repeats: int) -> None:
    base = statistics.median(w for w, _ in walls["baseline"])
    base_work = statistics.median(s for _, s in walls["baseline"])
    print(f"\n{name}: {' '.join(Path(w).name if '/' in w else w for w in work)}; median of {repeats} rounds")
    print(f"{'run':<16}{'wall s':>9}{'x baseline':>12}{'min-max s':>13}{'work s':>9}{'x baseline':>12}"
          f"{'lost events':>14}")
    for run, values in walls.items():
        wall = statistics.median(w for w, _ in values)
        work_s = statistics.median(s for _, s in values)
        spread = f"{min(w for w, _ in values):.2f}-{max(w for w, _ in values):.2f}"
        lost_text = "-" if run not in lost else ",".join(map(str, lost[run]))
        print(f"{run:<16}{wall:>9.2f}{wall / base:>12.2f}{spread:>13}{work_s:>9.3f}{work_s / base_work:>12.2f}"
              f"{lost_text:>14}")
    if "native-exact" in totals:
        exact = totals["native-exact"]
        for run in [r for r in totals if r != "native-exact"]:
            for key in ("allocations", "bytes", "live_at_end"):
                ratios = [t[key] / e[key] for t, e in zip(totals[run], exact) if e[key]]
                print(f"  {run} / native-exact, libc heap {key}: per round "
                      f"{', '.join(f'{r:.3f}' for r in ratios)}")
            rows = [t["rows"] / e["rows"] for t, e in zip(totals[run], exact) if e["rows"]]
            print(f"  {run} / native-exact, rows recorded: {', '.join(f'{r:.4f}' for r in rows)}")
    spread = {key: [t[key] for t in totals.get("native-exact", [])] for key in ("allocations", "bytes", "live_at_end")}
    for key, values in spread.items():
        if len(values) > 1:
            print(f"  native-exact itself, {key}: max/min over rounds {max(values) / min(values):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="gpt2,train")
    ap.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"from {','.join(RUNS)}; baseline always runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=60, help="generate_kv.py --tokens")
    ap.add_argument("--steps", type=int, default=300, help="train.py --steps")
    args = ap.parse_args()
    runs = ["baseline"] + [r for r in args.runs.split(",") if r in RUNS and r != "baseline"]
    if "memray" in runs and (why := ensure_memray()):
        sys.exit(why)
    tmp = Path(tempfile.mkdtemp(prefix="memprof-native-cost-"))
    try:
        for name in args.workloads.split(","):
            walls, totals, lost = measure(name, runs, args, tmp)
            report(name, workload(name, args), walls, totals, lost, args.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
