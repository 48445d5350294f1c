"""What memprof adds to one PyTorch CPU tensor's allocation and free, in microseconds.

A tight loop of `torch.empty(32768)` (128 KiB, allocated by c10::alloc_cpu and freed by
c10::free_cpu at once), timed inside the process: after 1,000 warm-up tensors, 5 timed
batches of N, and the median batch's µs per tensor. The difference from the unprofiled run
is memprof's cost per tensor: the uprobe traps and the BPF programs (the loop makes no
syscall, so nothing else of memprof's is in it). Much less noisy than a training loop's wall
time, where this cost is a few percent among the machine's own jitter.

--depth D puts D nested Python calls between the loop's lambda and torch.empty (default 0:
the lambda calls it), for the cost of reading a deeper Python stack: the stack read at the
allocation is D + 2 frames (module, lambda, D calls); a training step's allocations are ~5-10
frames deep.

Runs, alternately, REPEATS times each: unprofiled; `memprof record` (default: one uprobe on
alloc_cpu's call to NUMAMove, one on free_cpu, Python frames read); `--alloc-probes
entry-return` (uprobe at entry + uretprobe at return instead); `--no-python-frames`.

    sudo .venv/bin/python bench/torch_alloc_cost.py [--tensors N] [--repeats R] [--depth D]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MEMPROF = [sys.executable, "-m", "memprof", "record", "-q", "-f"]
LOOP = """
import sys, time, torch
torch.set_num_threads(1)
n, depth = int(sys.argv[1]), int(sys.argv[2])
def tensor(calls):
    return tensor(calls - 1) if calls > 1 else torch.empty(32768)
make = (lambda: torch.empty(32768)) if depth == 0 else (lambda: tensor(depth))
for _ in range(1000):
    make()
batches = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(n):
        make()
    batches.append((time.perf_counter() - t) / n * 1e6)
print("us_per_tensor=%.4f" % sorted(batches)[2])  # the median of 5
"""
RUNS = {
    "unprofiled": [],
    "memprof (call-site probe)": [],
    "memprof --alloc-probes entry-return": ["--alloc-probes", "entry-return"],
    "memprof --no-python-frames": ["--no-python-frames"],
}


def measure(script: Path, tensors: int, depth: int, args: list[str] | None, out: Path) -> float:
    """µs per tensor of one run; `args` None: unprofiled."""
    command = [sys.executable, str(script), str(tensors), str(depth)]
    if args is not None:
        command = [*MEMPROF, "-o", str(out), *args, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"us_per_tensor=([0-9.]+)", done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=20000, help="tensors per timed batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--depth", type=int, default=0, help="Python calls between the loop and torch.empty")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memprof-bench-") as tmp:
        script = Path(tmp) / "alloc_loop.py"
        script.write_text(LOOP)
        results: dict[str, list[float]] = {name: [] for name in RUNS}
        for _ in range(args.repeats):
            for name, extra in RUNS.items():
                results[name].append(measure(script, args.tensors, args.depth, None if name == "unprofiled" else extra,
                                             Path(tmp) / "run.memprof"))
    base = statistics.median(results["unprofiled"])
    print(f"torch.empty(32768) + free, {args.depth} Python calls deep, {args.tensors} tensors a batch, median batch of 5, "
          f"median of {args.repeats} alternating runs")
    print(f"{'run':<38}{'µs/tensor':>11}{'added µs':>10}   runs")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<38}{median:>11.2f}{median - base:>+10.2f}   " + ", ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
