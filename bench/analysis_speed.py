"""Speed of the analysis on a 10^7-event recording: `memprof report leaks` end to end, and its
pieces (load, lifetime pairing, find_leaks), with the peak memory of the whole report.

The recording is synthetic but written exactly as the recorder writes one (RecordingWriter:
a poll batch appended every 20 ms of trace time, a Parquet part flushed every 0.5 s, categorical
columns as pandas Categoricals, frees without sizes or stacks). It is generated once and kept
under --workdir (default: $TMPDIR/memprof-bench-analysis), keyed by its parameters:

- layers kernel_slab, native_heap, torch_cpu and kernel_page; ~5·10^6 allocations on pools of
  addresses that are handed out again (each address hosts back-to-back lifetimes), and their
  frees; ring-buffer order is not quite time order (a few neighbouring events swapped);
- KNOWN ANSWER: 257 kernel_slab allocations of 1,024 B on one chain never freed (outlived the
  process), 23 torch_cpu allocations of 1 MiB on another chain freed by the teardown after the
  exit mark (released at exit), 47 frees dropped (ring buffer loss: closed as missed frees);
- ~5,000 distinct stacks (a few with identical frames under two ids), ~12,000 frames;
- the root process's exit mark, and 20 step marks from the agent.

Every measurement runs in a fresh Python process, --repeats times (median, min–max):

    .venv/bin/python bench/analysis_speed.py [--events N] [--repeats R] [--workdir DIR] [--only a,b,…]

  report  `python -m memprof report leaks PATH --format json`, wall time of the whole command
  load    open_recording + timeline (memprof.api.analyse's first two stages)
  pair    pair_lifetimes alone (its third stage), pinned to one CPU: events per second
  leaks   the leak analysis alone, as the CLI asks for it (memprof.api.Analysed.leak_result)
  memory  peak RSS of the leak report (in-process CLI) minus RSS after its imports, against the
          in-memory size of the events DataFrame (memory_usage(deep=True))
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

ROOT = Path(__file__).resolve().parent.parent
GENERATOR_VERSION = 2  # bump when the generated recording changes (2: the writer sorts each events part): the cache is keyed by it
ROOT_PID, SEED = 4242, 6
START_NS = 1_000_000_000_000          # CLOCK_MONOTONIC of the recording's start
SPAN_NS = 10_000_000_000              # 10 s of trace: ~1 M events/s, as kernel_churn records
EXIT_NS = START_NS + SPAN_NS - 500_000_000
END_NS = START_NS + SPAN_NS
POLL_NS, FLUSH_NS = 20_000_000, 500_000_000
# layer -> (share of allocations, addresses in its pool, size range in bytes)
LAYER_MIX = {"kernel_slab": (0.50, 200_000, (8, 4096)), "native_heap": (0.30, 100_000, (16, 65536)),
             "torch_cpu": (0.15, 20_000, (4096, 1 << 22)), "kernel_page": (0.05, 50_000, (4096, 4097))}
LEAK = dict(layer="kernel_slab", count=257, size=1024, stack_id=90_001)
TEARDOWN = dict(layer="torch_cpu", count=23, size=1 << 20, stack_id=90_002)
DROPPED_FREES, STEPS = 47, 20
N_STACKS, N_FRAMES, N_TWINS = 5_000, 12_000, 100


# ---------------------------------------------------------------------------- the recording

def recording_path(workdir: Path, n_events: int) -> Path:
    return workdir / f"analysis-{n_events}-s{SEED}-v{GENERATOR_VERSION}.memprof"


def ensure_recording(workdir: Path, n_events: int) -> Path:
    """The cached recording, generated first when missing (or left unfinished)."""
    path = recording_path(workdir, n_events)
    meta = path / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("status") == "complete":
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    write_recording(path, n_events)
    print(f"generated {path} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return path


def write_recording(path: Path, n_events: int) -> None:
    import numpy as np
    from memprof.model.meta import RecordingMeta, SourceStats
    from memprof.recording.writer import RecordingWriter

    rng = np.random.default_rng(SEED)
    events = _shuffle_a_little(rng, _all_events(rng, n_events // 2))
    stacks, frames = _stack_tables(rng)
    meta = RecordingMeta(memprof_version="bench", command=["train.py"], pid=ROOT_PID, start_ns=START_NS,
                         sources={"ebpf": SourceStats(events=len(events["ts_ns"]), lost=DROPPED_FREES)},
                         exits=[{"pid": ROOT_PID, "ts_ns": EXIT_NS, "reason": "exit_group"}])
    writer = RecordingWriter(path, meta, force=True)
    _append_like_the_recorder(writer, events, stacks, frames)
    writer.finalize(end_ns=END_NS)


def _all_events(rng, n_allocs: int) -> dict:
    """Columns of every event (allocations, their frees, leaks, marks), in time order."""
    import numpy as np
    parts = [_pool_events(rng, layer, int(n_allocs * share), pool, sizes)
             for layer, (share, pool, sizes) in LAYER_MIX.items()]
    parts += [_leak_events(rng, **LEAK, freed_at=None), _leak_events(rng, **TEARDOWN, freed_at=EXIT_NS + 100_000_000),
              _mark_events()]
    merged = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    order = np.argsort(merged["ts_ns"], kind="stable")
    return {name: values[order] for name, values in merged.items()}


def _pool_events(rng, layer: str, n: int, pool: int, sizes: tuple[int, int]) -> dict:
    """`n` allocations on `pool` addresses, each address hosting back-to-back lifetimes: the
    free comes before the address's next allocation (skewed short, as most allocations are);
    the last one on an address is freed before the exit. DROPPED_FREES frees (spread over the
    layers) of allocations followed by another on the same address are not recorded."""
    import numpy as np
    alloc_ts = START_NS + 4 * (np.sort(rng.integers(0, (EXIT_NS - START_NS) // 4 - n, n)) + np.arange(n))
    slot = rng.integers(0, pool, n)
    by_slot = np.lexsort((alloc_ts, slot))
    nxt = np.full(n, EXIT_NS, dtype=np.int64)
    same = slot[by_slot[1:]] == slot[by_slot[:-1]]
    nxt[by_slot[:-1][same]] = alloc_ts[by_slot[1:][same]]
    free_ts = alloc_ts + 1 + ((nxt - alloc_ts - 2) * rng.random(n) ** 3).astype(np.int64)
    freed = np.ones(n, dtype=bool)
    reused = np.flatnonzero(nxt < EXIT_NS)
    freed[rng.choice(reused, DROPPED_FREES // len(LAYER_MIX) + (layer == "kernel_slab") * (DROPPED_FREES % len(LAYER_MIX)),
                     replace=False)] = False
    base = {"kernel_slab": 0xFFFF_8880_0000_0000, "kernel_page": 0xFFFF_EA00_0000_0000}.get(layer, 0x7F00_0000_0000)
    addr = (base + slot.astype(np.uint64) * np.uint64(64)).astype(np.uint64)  # struct page is 64 B too
    size = rng.integers(*sizes, n)
    stack = (rng.zipf(1.4, n) - 1) % N_STACKS + 1
    return _lifetime_columns(rng, layer, alloc_ts, free_ts, freed, addr, size, stack)


def _leak_events(rng, *, layer: str, count: int, size: int, stack_id: int, freed_at: int | None) -> dict:
    """`count` allocations spread over the first 90% of the run at addresses of their own;
    never freed (freed_at None) or all freed at `freed_at` (the teardown)."""
    import numpy as np
    alloc_ts = np.sort(rng.integers(START_NS, START_NS + int(0.9 * (EXIT_NS - START_NS)), count))
    addr = (0xFFFF_8890_0000_0000 + np.arange(count, dtype=np.uint64) * 4096).astype(np.uint64)
    freed = np.full(count, freed_at is not None)
    free_ts = np.full(count, freed_at or 0, dtype=np.int64)
    return _lifetime_columns(rng, layer, alloc_ts, free_ts, freed, addr, np.full(count, size), np.full(count, stack_id))


def _lifetime_columns(rng, layer, alloc_ts, free_ts, freed, addr, size, stack) -> dict:
    """Event columns for allocations and the frees of those with `freed` set, as the eBPF source
    decodes them: frees carry neither size nor stack."""
    import numpy as np
    n, m = len(alloc_ts), int(freed.sum())
    total = n + m
    from memprof.model.schema import ACTIONS, LAYERS
    return {
        "ts_ns": np.concatenate([alloc_ts, free_ts[freed]]).astype(np.int64),
        "layer": np.full(total, LAYERS.index(layer), dtype=np.int8),
        "action": np.repeat(np.array([ACTIONS.index("alloc"), ACTIONS.index("free")], np.int8), [n, m]),
        "addr": np.concatenate([addr, addr[freed]]).astype(np.uint64),
        "size_bytes": np.concatenate([size, np.full(m, -1)]).astype(np.int64),
        "stack_id": np.concatenate([stack, np.full(m, -1)]).astype(np.int64),
        "tid": (ROOT_PID + rng.integers(0, 8, total)).astype(np.int32),
        "category": np.full(total, -1, dtype=np.int8),
        "step": np.full(total, -1, dtype=np.int32),
    }


def _mark_events() -> dict:
    """The agent's STEPS step marks (evenly spread) and the kernel's exit mark of the root."""
    import numpy as np
    from memprof.model.schema import ACTIONS
    ts = np.append(START_NS + np.arange(STEPS, dtype=np.int64) * (EXIT_NS - START_NS) // STEPS, EXIT_NS)
    n = len(ts)
    return {"ts_ns": ts, "layer": np.full(n, -1, np.int8), "action": np.full(n, ACTIONS.index("mark"), np.int8),
            "addr": np.zeros(n, np.uint64), "size_bytes": np.full(n, -1, np.int64), "stack_id": np.full(n, -1, np.int64),
            "tid": np.full(n, ROOT_PID, np.int32), "category": np.append(np.ones(STEPS, np.int8), 0),
            "step": np.append(np.arange(1, STEPS + 1, dtype=np.int32), -1)}


def _shuffle_a_little(rng, events: dict) -> dict:
    """Ring-buffer order: events of different CPUs reach it slightly out of time order (0.2% of
    neighbours swapped), so the timeline's sort has work to do."""
    import numpy as np
    n = len(events["ts_ns"])
    i = 2 * rng.choice((n - 1) // 2, n // 1000, replace=False)  # even positions: swapped pairs never overlap
    order = np.arange(n)
    order[i], order[i + 1] = i + 1, i
    return {name: values[order] for name, values in events.items()}


def _stack_tables(rng) -> tuple[dict, dict]:
    """stacks (N_STACKS chains, N_TWINS of them repeated under a second id, the two leak chains)
    and frames (kernel, native and Python frames) columns."""
    import numpy as np
    depth = rng.integers(6, 40, N_STACKS)
    ids = np.repeat(np.arange(1, N_STACKS + 1), depth)
    frame_ids = rng.integers(0, N_FRAMES, len(ids))
    twins = rng.choice(N_STACKS, N_TWINS, replace=False) + 1
    twin_rows = np.isin(ids, twins)
    leak_ids = np.repeat([LEAK["stack_id"], TEARDOWN["stack_id"]], 12)
    stack_id = np.concatenate([ids, ids[twin_rows] + 50_000, leak_ids])
    frame_id = np.concatenate([frame_ids, frame_ids[twin_rows], rng.integers(0, N_FRAMES, len(leak_ids))])
    depths = np.concatenate([_depths(ids), _depths(ids[twin_rows]), _depths(leak_ids)])
    stacks = {"stack_id": stack_id, "depth": depths.astype(np.int32), "frame_id": frame_id}
    return stacks, _frames(rng)


def _depths(ids):
    import numpy as np
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return np.arange(len(ids)) - np.repeat(starts, np.diff(np.r_[starts, len(ids)]))


def _frames(rng) -> dict:
    import numpy as np
    kind = np.array(["kernel", "native", "python"])[np.arange(N_FRAMES) * 3 // N_FRAMES]
    i = np.arange(N_FRAMES)
    function = [f"fn_{k}_{j}" if k != "native" else f"ns::Type<int>::op[{j}](unsigned long)" for k, j in zip(kind, i)]
    module = np.where(kind == "kernel", "vmlinux", np.where(kind == "native", "libtorch_cpu.so", None))
    file = np.where(kind == "python", np.char.add("/srv/train/model_", (i % 97).astype(str)) + ".py", None)
    line = np.where(kind == "python", i % 900 + 1, -1)
    return {"frame_id": i.astype(np.int64), "kind": kind, "function": function, "module": module, "file": file,
            "line": np.ma.masked_less(line, 0).astype(np.int32)}


def _append_like_the_recorder(writer, events: dict, stacks: dict, frames: dict) -> None:
    """One append per POLL_NS of trace time, one flush (a part) per FLUSH_NS; the stack and
    frame tables are appended at the first flush (a recorder appends new chains at each)."""
    import numpy as np
    ts = events["ts_ns"]
    polls = np.searchsorted(ts, np.arange(START_NS, END_NS + POLL_NS, POLL_NS)[1:], side="left")
    polls = np.maximum.accumulate(polls)
    start, seq, next_flush, first = 0, 0, START_NS + FLUSH_NS, True
    for stop, poll_end in zip(polls, range(START_NS + POLL_NS, END_NS + 2 * POLL_NS, POLL_NS)):
        if stop > start:
            writer.append("events", _batch_columns(events, start, stop, seq))
            seq += stop - start
            start = stop
        if poll_end >= next_flush:
            if first:
                writer.append("stacks", stacks)
                writer.append("frames", _frame_columns(frames))
                first = False
            writer.flush()
            next_flush += FLUSH_NS
    if start < len(ts):
        writer.append("events", _batch_columns(events, start, len(ts), seq))


def _batch_columns(events: dict, start: int, stop: int, seq: int) -> dict:
    """The poll batch [start, stop) as the eBPF source hands it to the writer."""
    import numpy as np
    import pandas as pd
    from memprof.model.schema import ACTIONS, LAYERS
    part = {name: values[start:stop] for name, values in events.items()}
    n = stop - start
    nullable = lambda v: pd.arrays.IntegerArray(v.astype(np.int64), v < 0)  # noqa: E731
    step = part["step"]
    return {
        "ts_ns": part["ts_ns"], "seq": np.arange(seq, seq + n, dtype=np.int64),
        "layer": pd.Categorical.from_codes(part["layer"], categories=LAYERS),
        "action": pd.Categorical.from_codes(part["action"], categories=ACTIONS),
        "addr": part["addr"], "size_bytes": nullable(part["size_bytes"]),
        "requested_bytes": nullable(part["size_bytes"]),
        "device": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=["cpu", "cuda"]),
        "pid": np.full(n, ROOT_PID, np.int32), "tid": part["tid"],
        "stack_id": nullable(part["stack_id"]),
        "step": pd.arrays.IntegerArray(step.astype(np.int32), step < 0),
        "category": pd.Categorical.from_codes(part["category"], categories=["exit", "step"]),
        "weight": np.full(n, np.nan),
    }


def _frame_columns(frames: dict) -> dict:
    import numpy as np
    line = frames["line"]
    return {**frames, "line": [None if m else int(v) for v, m in zip(line.data, np.ma.getmaskarray(line))]}


# ---------------------------------------------------------------------------- measurements
# Each runs in a fresh interpreter (`--child MODE PATH`) and prints one JSON line.

def child(mode: str, path: str) -> dict:
    return {"report": _child_report, "load": _child_load, "pair": _child_pair,
            "leaks": _child_leaks, "memory": _child_memory}[mode](path)


def _child_report(path: str) -> dict:
    cmd = [sys.executable, "-m", "memprof", "report", "leaks", path, "--format", "json"]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return {"seconds": wall, "findings": json.loads(done.stdout)["findings"]}


def _analysed(path: str):
    """(memprof.api.Analysed, seconds of each of its stages in order: open, timeline, pair,
    merge chains), through the one entry point every command uses."""
    from memprof.api import analyse
    marks: list[float] = []
    analysed = analyse(path, stage=lambda text: marks.append(time.perf_counter()))
    marks.append(time.perf_counter())
    return analysed, [end - start for start, end in zip(marks, marks[1:])]


def _child_load(path: str) -> dict:
    analysed, (open_s, timeline_s, *_) = _analysed(path)
    return {"seconds": open_s + timeline_s, "open_s": open_s, "timeline_s": timeline_s,
            "events": len(analysed.events), "events_bytes": int(analysed.events.memory_usage(deep=True).sum())}


def _child_pair(path: str) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    analysed, (_, _, seconds, _) = _analysed(path)
    lifetimes = analysed.lifetimes
    return {"seconds": seconds, "events_per_s": len(analysed.events) / seconds,
            "missed": sum(lifetimes.missed_frees.values()), "unmatched": sum(lifetimes.unmatched_frees.values())}


def _child_leaks(path: str) -> dict:
    """The leak analysis the CLI runs after loading (overview.leak_report through the entry point)."""
    analysed, _ = _analysed(path)
    started = time.perf_counter()
    result = analysed.leak_result()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "findings": len(result.findings)}


def _child_memory(path: str) -> dict:
    """Peak RSS of the leak report run in this process, minus RSS once its imports are done."""
    import contextlib
    import io
    import memprof.analysis.leaks, memprof.analysis.lifetimes, memprof.report.leaks  # noqa: E401,F401
    import memprof.recording, memprof.timeline  # noqa: E401,F401
    from memprof.cli.main import cli
    base = _status_kb("VmRSS")
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(["report", "leaks", path, "--format", "json"], prog_name="memprof", standalone_mode=False)
        except SystemExit:
            pass
    return {"base_rss": base * 1024, "peak_rss": _status_kb("VmHWM") * 1024}


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def measure(mode: str, path: Path) -> dict:
    """Run one measurement in a fresh interpreter; its JSON result."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # The pieces run as the CLI runs them (cli/main.py turns numpy's huge-page advice off).
    env.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: exit {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- summary

def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'median (min–max)'."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def summarize(results: dict[str, list[dict]], n_events: int, repeats: int) -> list[str]:
    lines = [f"{n_events:,}-event recording; median (min–max) of {repeats} runs, each in a fresh process"]
    if results.get("report"):
        findings = results["report"][-1]["findings"]
        lines.append(f"report leaks --format json  wall s   {spread([r['seconds'] for r in results['report']])}"
                     f"   (bar 5 s; top finding: {findings[0]['live_count']} allocations, {findings[0]['live_bytes']:,} B)"
                     if findings else "report leaks: no findings")
    if results.get("load"):
        rows = results["load"]
        lines.append(f"load (open + timeline)      s        {spread([r['seconds'] for r in rows])}"
                     f"   open {spread([r['open_s'] for r in rows])}, timeline {spread([r['timeline_s'] for r in rows])}")
    if results.get("pair"):
        rows = results["pair"]
        lines.append(f"pair_lifetimes (1 core)     s        {spread([r['seconds'] for r in rows])}"
                     f"   = {spread([r['events_per_s'] / 1e6 for r in rows])} M events/s;"
                     f" missed {rows[-1]['missed']}, unmatched {rows[-1]['unmatched']}")
    if results.get("leaks"):
        lines.append(f"leak analysis (leak_report) s        {spread([r['seconds'] for r in results['leaks']])}")
    if results.get("memory"):
        lines.append(_memory_line(results))
    return lines


def _memory_line(results: dict) -> str:
    size = next((r["events_bytes"] for r in results.get("load", [])), None)
    grown = [(r["peak_rss"] - r["base_rss"]) / 2**20 for r in results["memory"]]
    line = f"report peak RSS − RSS after imports MiB {spread(grown, '{:.0f}')}"
    if size:
        ratios = [g * 2**20 / size for g in grown]
        line += f"   events frame {size / 2**20:.0f} MiB: {spread(ratios)}x (bar 2x)"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000, help="events in the recording (about)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memprof-bench-analysis")
    ap.add_argument("--only", default="report,load,pair,leaks,memory", help="measurements to run, comma-separated")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    path = ensure_recording(args.workdir, args.events)
    modes = [m for m in args.only.split(",") if m]
    if "memory" in modes and "load" not in modes:
        modes.insert(0, "load")  # the memory ratio needs the events frame's size
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:  # alternating, so a burst of load on the machine spreads over all
            results[mode].append(measure(mode, path))
    print("\n".join(summarize(results, args.events, args.repeats)))


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    main()
