"""What memprof adds to examples/train.py's loop, measured inside one process, against the
loops run just before and just after it.

Each round runs train.py's loop four times in one process (`--phases 4`): a warm-up, then A,
B and C. `memprof record --pid` (default sources) is attached for B only: it is started after
A and stopped (SIGINT, waiting for it to finish the recording) before C. The round's ratio is
B over the mean of A and C, for the loop and for the median step. A control round does the
same with nothing attached (it waits as long instead): its ratios are this method's own noise,
and should center on 1.00. Rounds alternate: memprof, control.

Why: on this VM the unprofiled loop alone varies by a third from one run to the next (8
consecutive runs: 0.376-0.505 s), and the slow spells last seconds, longer than a run; each new
process also gets its own memory layout. Bracketing the recorded loop by unrecorded ones of the
same process, seconds apart, cancels most of both; bench/train_overhead.py's separate processes
(`record -- CMD`, as the issue states the bar) cannot.

What B pays: everything memprof does to a target while attached (the uprobe traps, the BPF
programs, the Python frames read at every event, the kernel source, the recorder's own work on
the other CPU). What it leaves out: start-up, and the PyTorch agent, which `record --pid` does
not inject into a process that did not load it (its step marks: ~1.5 µs a step).

    sudo .venv/bin/python bench/train_attach_bracket.py [--steps N] [--rounds R]
"""
from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from common import FIELD_LINE, ratio_summary, read_meta  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
MEMPROF = [sys.executable, "-m", "memprof"]
BAR = 1.10
CONTROL_WAIT_S = 3.0  # a control round's stand-in for attaching / finishing a recording


class Round(NamedTuple):
    """B over the mean of A and C: for the loop, and for the median step."""

    loop: float
    step: float


def read_fields(target: subprocess.Popen, until: str) -> dict[str, float]:
    """`name=number` lines the target prints, up to the one starting with `until`."""
    fields: dict[str, float] = {}
    for line in target.stdout:
        if found := FIELD_LINE.match(line.strip()):
            fields[found.group(1)] = float(found.group(2))
        if line.startswith(until):
            return fields
    raise RuntimeError(f"train.py ended (exit {target.wait()}) before printing {until!r}")


def go(target: subprocess.Popen) -> None:
    target.stdin.write("go\n")
    target.stdin.flush()


def attach(pid: int, recording: Path) -> subprocess.Popen:
    """`record --pid`, returned once its recording exists (made after its probes are in place)."""
    recorder = subprocess.Popen([*MEMPROF, "record", "-q", "-f", "--pid", str(pid), "-o", str(recording)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not recording.exists():
        if recorder.poll() is not None or time.monotonic() > deadline:
            recorder.kill()
            raise RuntimeError(f"record --pid did not start: {recorder.stderr.read().strip()[-400:]}")
        time.sleep(0.05)
    return recorder


def detach(recorder: subprocess.Popen) -> None:
    """Stop the recorder as Ctrl-C would, and wait until it has written the recording."""
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=300)
    if recorder.returncode != 0:
        raise RuntimeError(f"record --pid exited {recorder.returncode}: {err.strip()[-400:]}")


def one_round(steps: int, recording: Path | None) -> tuple[Round, dict]:
    """One process, four loops; memprof attached for the third when `recording` is given.
    Returns the round's ratios and the recording's meta.json ({} for a control round)."""
    target = subprocess.Popen([sys.executable, str(TRAIN), "--steps", str(steps), "--start-wait", "0",
                               "--hold", "0", "--phases", "4"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(read_fields(target, "pid=")["pid"])
        read_fields(target, "waiting=2")  # the warm-up loop is done
        go(target)
        a = read_fields(target, "waiting=3")
        recorder = attach(pid, recording) if recording else None
        if recorder is None:
            time.sleep(CONTROL_WAIT_S)
        go(target)
        b = read_fields(target, "waiting=4")
        if recorder is None:
            time.sleep(CONTROL_WAIT_S)
        else:
            detach(recorder)
        go(target)
        c = read_fields(target, "steps=")
    finally:
        target.kill()
        target.wait()
    ratio = lambda name: b[f"phase3_{name}"] / statistics.mean([a[f"phase2_{name}"], c[f"phase4_{name}"]])  # noqa: E731
    return Round(ratio("loop_s"), ratio("step_median_s")), (read_meta(recording) if recording else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="steps of each of the four loops")
    ap.add_argument("--rounds", type=int, default=11, help="rounds of each kind (memprof, control)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memprof-bench-"))
    results: dict[str, list[Round]] = {"memprof record --pid": [], "control (nothing attached)": []}
    meta: dict = {}
    try:
        for i in range(args.rounds):
            recording = tmp / f"bracket-{i}.memprof"
            result, meta = one_round(args.steps, recording)
            results["memprof record --pid"].append(result)
            shutil.rmtree(recording, ignore_errors=True)
            results["control (nothing attached)"].append(one_round(args.steps, None)[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"examples/train.py --steps {args.steps}, four loops a process, B (the third) over the mean of "
          f"A and C; {args.rounds} rounds of each kind, alternating")
    for name, rounds in results.items():
        print(f"{name}:")
        print(f"  loop:        {ratio_summary([r.loop for r in rounds], BAR)}")
        print(f"  median step: {ratio_summary([r.step for r in rounds], BAR)}")
    ebpf = meta.get("sources", {}).get("ebpf", {})
    python = ebpf.get("detail", {}).get("python", {})
    print(f"last memprof round: ebpf events={ebpf.get('events', 0):,} lost={ebpf.get('lost', 0):,}; "
          f"Python frames resolved: {python.get('frames', 0):,}")


if __name__ == "__main__":
    main()
