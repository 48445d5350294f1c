"""Speed and peak memory of `memprof export` on a recording with many distinct chains (issue 20
item 11: pprof took 16.9 s and 1.9 GB on a 2.4 M-event recording).

The recording is analysis_speed.py's (written as the recorder writes one, same events, leaks
and marks), with --stacks distinct chains of 6–40 frames over --frames frames instead of its
5,000: a kernel-churn recording with real stacks has tens of thousands of chains, and every
export that shows chains (pprof, speedscope, folded) pays per chain and per frame. It is
generated once under --workdir (default: $TMPDIR/memprof-bench-export), keyed by its parameters.

    .venv/bin/python bench/export_speed.py [--events N] [--stacks S] [--frames F] [--formats pprof,…]
                                           [--repeats R] [--workdir DIR]

Each run is `python -m memprof export PATH --format FMT -o FILE` in a fresh process: its wall
time, CPU time and peak RSS (wait4's rusage of the child), median (min–max) of --repeats runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import analysis_speed as base

ROOT = Path(__file__).resolve().parent.parent


def recording_path(workdir: Path, n_events: int, n_stacks: int, n_frames: int) -> Path:
    return workdir / f"export-{n_events}-{n_stacks}x{n_frames}-s{base.SEED}-v{base.GENERATOR_VERSION}.memprof"


def ensure_recording(workdir: Path, n_events: int, n_stacks: int, n_frames: int) -> Path:
    """The cached recording, generated first when missing (or left unfinished)."""
    path = recording_path(workdir, n_events, n_stacks, n_frames)
    meta = path / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("status") == "complete":
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    # analysis_speed draws each allocation's chain from 1..N_STACKS (Zipf) and writes the
    # tables _stack_tables returns: both follow the chain count asked for here.
    base.N_STACKS, base.N_FRAMES = n_stacks, n_frames
    base._stack_tables = _many_stacks
    started = time.monotonic()
    base.write_recording(path, n_events)
    print(f"generated {path} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return path


def _many_stacks(rng) -> tuple[dict, dict]:
    """N_STACKS chains (ids 1..N_STACKS, which hold the two leak chains' ids when N_STACKS is
    past 90,002) and N_TWINS of them repeated under ids past N_STACKS; frames as analysis_speed's."""
    import numpy as np
    n = base.N_STACKS
    depth = rng.integers(6, 40, n)
    ids = np.repeat(np.arange(1, n + 1), depth)
    frame_ids = rng.integers(0, base.N_FRAMES, len(ids))
    twin_rows = np.isin(ids, rng.choice(n, base.N_TWINS, replace=False) + 1)
    stack_id = np.concatenate([ids, ids[twin_rows] + n])
    frame_id = np.concatenate([frame_ids, frame_ids[twin_rows]])
    depths = np.concatenate([base._depths(ids), base._depths(ids[twin_rows])])
    return {"stack_id": stack_id, "depth": depths.astype(np.int32), "frame_id": frame_id}, base._frames(rng)


def measure(path: Path, fmt: str, out_dir: Path) -> dict:
    """One export in a fresh process: wall seconds, CPU seconds (user + system: steadier than
    wall time on a shared machine), peak RSS (MiB) — both the child's own, by wait4 — and the
    output's size in bytes."""
    out = out_dir / f"out.{fmt}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "memprof", "export", str(path), "--format", fmt, "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{fmt}: exit {child.returncode}: {stderr.decode(errors='replace').strip()[-1500:]}")
    return {"seconds": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024,
            "bytes": out.stat().st_size}


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'median (min–max)'."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_400_000, help="events in the recording (about)")
    ap.add_argument("--stacks", type=int, default=200_000, help="distinct chains")
    ap.add_argument("--frames", type=int, default=60_000, help="distinct frames")
    ap.add_argument("--formats", default="pprof", help="comma-separated export formats")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memprof-bench-export")
    args = ap.parse_args()
    path = ensure_recording(args.workdir, args.events, args.stacks, args.frames)
    print(f"{path.name}: {args.events:,} events, {args.stacks:,} chains over {args.frames:,} frames; "
          f"median (min–max) of {args.repeats} runs, each in a fresh process")
    for fmt in args.formats.split(","):
        runs = [measure(path, fmt, args.workdir) for _ in range(args.repeats)]
        print(f"export --format {fmt:<12} wall s {spread([r['seconds'] for r in runs])}   "
              f"CPU s {spread([r['cpu_s'] for r in runs])}   "
              f"peak RSS MiB {spread([r['peak_mib'] for r in runs], '{:.0f}')}   output {runs[-1]['bytes']:,} B")


if __name__ == "__main__":
    main()
