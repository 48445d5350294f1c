"""Pieces every benchmark here shares: timing a workload that prints its own loop time
(`loop_s=`), reading a recording's meta.json, and summarizing its per-source stats."""
from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def loop_seconds(returncode: int, stdout: str, stderr: str) -> float:
    """The `loop_s=` a workload printed; RuntimeError with its last lines if it failed."""
    found = re.search(r"loop_s=([0-9.]+)", stdout)
    if returncode != 0 or not found:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {returncode}: {' | '.join(tail)}")
    return float(found.group(1))


def run(cmd: list[str]) -> tuple[float, float]:
    """(loop seconds printed by the workload, wall seconds of the whole command)."""
    loop, wall, _ = run_with_fields(cmd)
    return loop, wall


# A `name=<number>` line a workload prints (train.py's loop_s=, step_median_s=, ...).
FIELD_LINE = re.compile(r"^(\w+)=([0-9.]+)$", re.M)


def printed_fields(stdout: str) -> dict[str, float]:
    """Every `name=<number>` line in a workload's output, by name."""
    return {m.group(1): float(m.group(2)) for m in FIELD_LINE.finditer(stdout)}


def ratio_summary(ratios: list[float], bar: float) -> str:
    """Per-round ratios in words: median, quartiles, range, and how many are over `bar`."""
    ratios = sorted(ratios)
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    over = sum(r > bar for r in ratios)
    return (f"median {median:.3f}, quartiles {q1:.3f}-{q3:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}, "
            f"{over} of {len(ratios)} rounds over {bar:.2f}")


def ratio_of_medians(values: list[float], base: list[float]) -> float:
    """median(values) / median(base): how a profiled run's loop compares with its baseline."""
    return statistics.median(values) / statistics.median(base)


def ratio_of_medians_interval(values: list[float], base: list[float], level: float = 0.95,
                               resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A paired bootstrap interval for median(values) / median(base), where values[i] and
    base[i] were measured in the same round: rounds are drawn with replacement, keeping each
    round's pair together, so slow drift of the host stays cancelled as in the rounds
    themselves. Returns the (lower, upper) quantiles at `level`; a fixed seed makes a run's
    printed interval reproducible from its printed per-round data."""
    if len(values) != len(base) or len(values) < 4:
        raise ValueError("need at least 4 paired rounds")
    rng = random.Random(seed)
    n = len(values)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(ratio_of_medians([values[i] for i in picks], [base[i] for i in picks]))
    return central_interval(ratios, level)


def central_interval(draws: list[float], level: float) -> tuple[float, float]:
    """The (lower, upper) quantiles holding the central `level` of a bootstrap's draws."""
    draws = sorted(draws)
    tail = (1 - level) / 2
    return draws[int(tail * len(draws))], draws[min(len(draws) - 1, int((1 - tail) * len(draws)))]


def pooled_ratio(runs: list[tuple[list[float], list[float]]]) -> float:
    """Several runs' ratios of medians (each run a (values, base) pair of paired rounds, as
    ratio_of_medians_interval takes), pooled: their geometric mean weighted by rounds. Each
    run keeps its own baseline, so a run on a slower hour weighs as a ratio, not as seconds."""
    if not runs:
        raise ValueError("no runs to pool")
    for values, base in runs:
        if len(values) != len(base) or not values:
            raise ValueError("each run needs paired rounds")
    rounds = sum(len(values) for values, _ in runs)
    logs = sum(len(values) * math.log(ratio_of_medians(values, base)) for values, base in runs)
    return math.exp(logs / rounds)


def pooled_ratio_interval(runs: list[tuple[list[float], list[float]]], level: float = 0.95,
                          resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval for pooled_ratio(runs): each run's rounds are redrawn with
    replacement, within that run and pairs kept together. What differs between the runs'
    hours stays as measured: the interval says how well these runs pin their pooled ratio,
    not what another hour would read."""
    rng = random.Random(seed)
    pooled = []
    for _ in range(resamples):
        drawn = []
        for values, base in runs:
            picks = [rng.randrange(len(values)) for _ in values]
            drawn.append(([values[i] for i in picks], [base[i] for i in picks]))
        pooled.append(pooled_ratio(drawn))
    return central_interval(pooled, level)


def run_with_fields(cmd: list[str]) -> tuple[float, float, dict[str, float]]:
    """run(), plus every `name=<number>` line the workload printed (e.g. train.py's
    step_median_s), by name."""
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    loop = loop_seconds(done.returncode, done.stdout, done.stderr)
    return loop, wall, printed_fields(done.stdout)


def run_paused_between(cmd: list[str], pause_at: str, resume_at: str) -> tuple[float, float, dict[str, float]]:
    """run_with_fields(), but the process `cmd` starts (a profiler) is stopped (SIGSTOP)
    from the output line starting with `pause_at` until the one starting with `resume_at`,
    both printed by its workload, which keeps running: what the profiler's own work beside
    the workload costs it is then the difference from an unpaused run. The process is
    continued however the run ends. (Standard error goes to a file: a pipe read only after
    standard output ends would stall a run that writes more than a pipe holds.)"""
    t0 = time.monotonic()
    lines = []
    with tempfile.TemporaryFile("w+") as err, \
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(pause_at):
                    os.kill(proc.pid, signal.SIGSTOP)
                elif line.startswith(resume_at):
                    os.kill(proc.pid, signal.SIGCONT)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        returncode = proc.wait()
        err.seek(0)
        stderr = err.read()
    wall = time.monotonic() - t0
    stdout = "".join(lines)
    loop = loop_seconds(returncode, stdout, stderr)
    return loop, wall, printed_fields(stdout)


def read_meta(recording: Path) -> dict:
    """A recording's meta.json, or {} when it cannot be read."""
    try:
        return json.loads((recording / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def sources_line(meta: dict) -> str:
    parts = []
    for name, info in (meta.get("sources") or {}).items():
        if isinstance(info, dict):
            parts.append(f"{name} events={info['events']:,} lost={info.get('lost', '?')}"
                         if isinstance(info.get("events"), int) else f"{name} enabled={info.get('enabled')}")
    return "; ".join(parts) or "(no per-source entries in meta.json)"


def rotated(names: list[str], round_index: int) -> list[str]:
    """The order of one round's runs: `names` rotated by the round's index, so that across
    rounds every run takes every place in the order equally often (REPEATS a multiple of the
    runs' number balances them fully). In a fixed order, whatever a finished recording leaves
    the machine doing lands on the next round's first run, and every ratio over it would be
    biased. (Two fixed-order runs hinted at it, their baseline 2-3 % slower than the control;
    a 180-round rotated run found none: memprof 1.095x with the baseline first, 1.100x after.)"""
    k = round_index % len(names)
    return names[k:] + names[:k]


def ensure_memray() -> str | None:
    """None when memray imports (installing it with pip if needed), else why not."""
    probe = [sys.executable, "-c", "import memray"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return None
    print("memray missing: installing it with pip (pip install memray)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "memray"], check=False)
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return None
    return "memray is not installed and pip could not install it"
