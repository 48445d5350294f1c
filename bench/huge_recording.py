"""A recording larger than memory, reported in bounded memory (issue 23, item 2): `memprof
report leaks` of a synthetic recording of --events events (default 3·10^8), its wall time and
peak RSS, with the known answer checked.

Whole, the analysis of 3·10^8 events would take about 51 GB (memprof.bounded.BYTES_PER_EVENT
170 B each); this machine has 24 GB. The report folds it (memprof.bounded) on its own: no
option is given.

The recording is generated part by part, so the generator's memory is one part whatever the
size, and written as the recorder writes one (RecordingWriter: one Parquet part per flush).
One step per part, --part-rows events each (default 2^21):

- churn: allocations on pools of addresses (kernel_slab, native_heap, torch_cpu), each freed
  within its step, over N_STACKS chains (Zipf-distributed): none is a finding;
- KNOWN ANSWER: one kernel_slab allocation of 1,024 B per step on chain LEAK_STACK, never
  freed: `grows_per_step`, 1,024 B per step; one torch_cpu allocation of 1 MiB on chain
  TEARDOWN_STACK at the start, freed after the root's exit mark: `held_at_end`, released at
  exit; nothing else;
- a step mark at each part's start; the root's exit mark 1 ms before the last part ends.

It is generated once and kept under --workdir (default: $TMPDIR/memprof-bench-huge), keyed by
its parameters. Run:

    .venv/bin/python bench/huge_recording.py [--events N] [--part-rows R] [--workdir DIR] [--max-memory SIZE]

It prints the generation time, then for `report leaks --format json` (a fresh process): wall
seconds, peak RSS (ru_maxrss of the child), the findings, and whether they are the known answer.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATOR_VERSION = 1  # bump when the generated recording changes: the cache is keyed by it
ROOT_PID, SEED = 4242, 11
START_NS = 1_000_000_000_000
EVENT_NS = 1_000  # one event per µs of trace time: 3·10^8 events are 300 s, ~1 M events/s as kernel churn
N_STACKS = 5_000
DEFAULT_PART_ROWS = 1 << 21  # events per part, and per step
LEAK_STACK, LEAK_BYTES = 90_001, 1024
TEARDOWN_STACK, TEARDOWN_BYTES = 90_002, 1 << 20
# layer -> (share of churn allocations, addresses in its pool, size range in bytes)
LAYER_MIX = {"kernel_slab": (0.55, 50_000, (8, 4096)), "native_heap": (0.35, 50_000, (16, 65536)),
             "torch_cpu": (0.10, 5_000, (4096, 1 << 20))}


def recording_path(workdir: Path, n_events: int, part_rows: int) -> Path:
    return workdir / f"huge-{n_events}-p{part_rows}-s{SEED}-v{GENERATOR_VERSION}.memprof"


def ensure_recording(workdir: Path, n_events: int, part_rows: int) -> Path:
    """The cached recording, generated first when missing (or left unfinished)."""
    path = recording_path(workdir, n_events, part_rows)
    meta = path / "meta.json"
    if meta.is_file() and json.loads(meta.read_text()).get("status") == "complete":
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    write_recording(path, n_events, part_rows)
    print(f"generated {path} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return path


def write_recording(path: Path, n_events: int, part_rows: int) -> None:
    import numpy as np
    from memprof.model.meta import RecordingMeta
    from memprof.recording.writer import RecordingWriter

    rng = np.random.default_rng(SEED)
    steps = max(n_events // part_rows, 2)
    end_ns = START_NS + steps * part_rows * EVENT_NS
    exit_ns = end_ns - 1_000_000
    meta = RecordingMeta(memprof_version="bench", command=["train.py"], pid=ROOT_PID, start_ns=START_NS,
                         exits=[{"pid": ROOT_PID, "ts_ns": exit_ns, "reason": "exit_group"}])
    writer = RecordingWriter(path, meta, force=True)
    _append_stacks(writer, rng)
    for step in range(steps):
        writer.append("events", _step_events(rng, step, steps, part_rows, exit_ns))
        writer.flush()
    writer.finalize(end_ns=end_ns)


def _step_events(rng, step: int, steps: int, rows: int, exit_ns: int) -> dict:
    """One step's events (one part), in time order: its step mark, churn freed within the step,
    the leak's allocation, and at the first step the teardown's allocation, at the last its free
    after the exit mark."""
    start = START_NS + step * rows * EVENT_NS
    # (ts_ns, action, layer, category, step, addr, size, stack)
    marks = [(start, "mark", None, "step", step + 1, 0, None, None)]
    specials = [(start + 3 * EVENT_NS, "alloc", "kernel_slab", None, None, 0xFFFF_8890_0000_0000 + step * 4096,
                 LEAK_BYTES, LEAK_STACK)]
    if step == 0:
        specials.append((start + 5 * EVENT_NS, "alloc", "torch_cpu", None, None, 0x7E00_0000_0000, TEARDOWN_BYTES,
                         TEARDOWN_STACK))
    if step == steps - 1:
        marks.append((exit_ns, "mark", None, "exit", None, 0, None, None))
        specials.append((exit_ns + 500_000, "free", "torch_cpu", None, None, 0x7E00_0000_0000, None, None))
    n_pairs = (rows - len(marks) - len(specials)) // 2
    churn = _churn(rng, start + 10 * EVENT_NS, n_pairs, exit_ns if step == steps - 1 else start + rows * EVENT_NS)
    return _columns(churn, marks + specials, step * rows)


def _churn(rng, start_ns: int, n_pairs: int, before_ns: int) -> dict:
    """`n_pairs` allocations over the layers' address pools, each address's lifetimes back to
    back within [start_ns, before_ns), every one freed."""
    import numpy as np
    span = before_ns - start_ns - 2
    alloc_ts = start_ns + np.sort(rng.integers(0, span // 2, n_pairs)) * 2
    layer = rng.choice(len(LAYER_MIX), n_pairs, p=[share for share, _, _ in LAYER_MIX.values()])
    pools = np.array([pool for _, pool, _ in LAYER_MIX.values()])
    slot = (rng.integers(0, 1 << 30, n_pairs) % pools[layer]) + layer.astype(np.int64) * (1 << 20)
    by_slot = np.lexsort((alloc_ts, slot))
    following = np.full(n_pairs, before_ns, dtype=np.int64)
    same = slot[by_slot[1:]] == slot[by_slot[:-1]]
    following[by_slot[:-1][same]] = alloc_ts[by_slot[1:][same]]
    free_ts = alloc_ts + 1 + ((following - alloc_ts - 2) * rng.random(n_pairs) ** 3).astype(np.int64)
    low = np.array([lo for _, _, (lo, _) in LAYER_MIX.values()])[layer]
    high = np.array([hi for _, _, (_, hi) in LAYER_MIX.values()])[layer]
    size = low + (rng.random(n_pairs) * (high - low)).astype(np.int64)
    stack = (rng.zipf(1.4, n_pairs) - 1) % N_STACKS + 1
    addr = (0x7F00_0000_0000 + slot.astype(np.uint64) * np.uint64(64)).astype(np.uint64)
    return {"alloc_ts": alloc_ts, "free_ts": free_ts, "layer": layer, "addr": addr, "size": size,
            "stack": stack}


def _columns(churn: dict, others: list[tuple], first_seq: int) -> dict:
    """Event columns (as the eBPF source and the agent hand them to the writer) of the churn's
    allocations and frees and the `others` rows (ts_ns, action, layer, category, step, addr,
    size, stack), in ts_ns order, seq numbered from `first_seq`. Typed arrays throughout: a
    part of 2^21 rows takes a fraction of a second."""
    import numpy as np
    import pandas as pd
    from memprof.model.schema import ACTIONS, LAYERS
    n = len(churn["alloc_ts"])
    ts, action, layer, category, step, addr, size, stack = (list(column) for column in zip(*others))
    ts = np.concatenate([churn["alloc_ts"], churn["free_ts"], ts]).astype(np.int64)
    order = np.argsort(ts, kind="stable")
    layer_code = np.array([LAYERS.index(x) for x in LAYER_MIX], dtype=np.int8)[churn["layer"]]
    layers = np.concatenate([layer_code, layer_code, [-1 if x is None else LAYERS.index(x) for x in layer]]).astype(np.int8)
    actions = np.concatenate([np.full(n, ACTIONS.index("alloc"), np.int8), np.full(n, ACTIONS.index("free"), np.int8),
                              [ACTIONS.index(x) for x in action]]).astype(np.int8)
    categories = ["step", "exit"]
    category_code = np.concatenate([np.full(2 * n, -1, np.int8), [-1 if x is None else categories.index(x) for x in category]])

    def nullable(allocs, rest, dtype):
        values = np.concatenate([allocs, np.zeros(n, np.int64), [0 if x is None else x for x in rest]])
        mask = np.concatenate([np.zeros(n, bool), np.ones(n, bool), [x is None for x in rest]])
        return pd.arrays.IntegerArray(values.astype(dtype)[order], mask[order])

    return {
        "ts_ns": ts[order], "seq": np.arange(first_seq, first_seq + len(ts), dtype=np.int64),
        "layer": pd.Categorical.from_codes(layers[order], categories=LAYERS),
        "action": pd.Categorical.from_codes(actions[order], categories=ACTIONS),
        "addr": np.concatenate([churn["addr"], churn["addr"], np.array(addr, dtype=np.uint64)])[order],
        "size_bytes": nullable(churn["size"], size, np.int64), "stack_id": nullable(churn["stack"], stack, np.int64),
        "device": "cpu", "pid": np.full(len(ts), ROOT_PID, np.int32), "tid": np.full(len(ts), ROOT_PID, np.int32),
        "category": pd.Categorical.from_codes(category_code[order], categories=categories),
        "step": nullable(np.zeros(n, np.int64), step, np.int32),
    }


def _append_stacks(writer, rng) -> None:
    """N_STACKS chains of 8 frames, and the two known chains."""
    import numpy as np
    ids = np.repeat(np.arange(1, N_STACKS + 1), 8)
    ids = np.concatenate([ids, np.repeat([LEAK_STACK, TEARDOWN_STACK], 8)])
    depth = np.tile(np.arange(8, dtype=np.int32), len(ids) // 8)
    frame = np.arange(len(ids), dtype=np.int64)
    writer.append("stacks", {"stack_id": ids, "depth": depth, "frame_id": frame})
    names = np.array([f"fn_{i}" for i in range(len(ids))], dtype=object)
    names[-16] = "kmalloc_leaky_driver"
    names[-8] = "torch_teardown_buffer"
    writer.append("frames", {"frame_id": frame, "kind": np.where(ids > N_STACKS, "kernel", "native").astype(object),
                             "function": names, "module": np.full(len(ids), "bench", dtype=object),
                             "file": np.full(len(ids), None, dtype=object), "line": pd_int32_nulls(len(ids))})


def pd_int32_nulls(n: int):
    import pandas as pd
    return pd.array([None] * n, dtype="Int32")


def report(path: Path, max_memory: str | None) -> dict:
    """`memprof report leaks PATH --format json` in a fresh process: wall s, peak RSS, findings."""
    command = [sys.executable, "-m", "memprof", "report", "leaks", str(path), "--format", "json", "--top", "50"]
    if max_memory:
        command += ["--max-memory", max_memory]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0:
        raise SystemExit(f"report failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    doc = json.loads(done.stdout)
    return {"wall_s": wall, "peak_rss_mb": peak_kib / 1024 if peak_kib > before else float("nan"), "doc": doc}


def known_answer(doc: dict, steps: int) -> list[str]:
    """What differs from the known answer (empty: all of it is right)."""
    wrong = []
    found = {(f["kind"], f["layer"], f["live_bytes"]) for f in doc["findings"]}
    expected = {("grows_per_step", "kernel_slab", LEAK_BYTES * steps), ("held_at_end", "torch_cpu", TEARDOWN_BYTES)}
    if found != expected:
        wrong.append(f"findings {sorted(found)} where {sorted(expected)} were expected")
    growing = [f for f in doc["findings"] if f["kind"] == "grows_per_step"]
    if growing and abs(growing[0]["slope_bytes_per_step"] - LEAK_BYTES) > 0.01 * LEAK_BYTES:
        wrong.append(f"slope {growing[0]['slope_bytes_per_step']} B/step where {LEAK_BYTES} was expected")
    if not any(str(n).startswith("folded:") for n in doc.get("notes", [])):
        wrong.append("the report does not say it folded the recording")
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000_000)
    parser.add_argument("--part-rows", type=int, default=DEFAULT_PART_ROWS)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memprof-bench-huge")
    parser.add_argument("--max-memory", default=None, help="passed to the report (default: its own)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    path = ensure_recording(args.workdir, args.events, args.part_rows)
    steps = max(args.events // args.part_rows, 2)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    from memprof.recording.stream import event_parts
    events = sum(part.rows for part in event_parts(path))
    print(f"recording: {path} ({events:,} events in {steps} parts, {size / 2**30:.2f} GiB on disk)")
    result = report(path, args.max_memory)
    doc = result["doc"]
    print(f"report leaks: {result['wall_s']:.1f} s wall, peak RSS {result['peak_rss_mb']:.0f} MB")
    for finding in doc["findings"]:
        print(f"  {finding['kind']:<15} {finding['layer']:<12} {finding['live_bytes']:>12,} B  {finding['name']}")
    for note in doc.get("notes", []):
        print(f"  note: {note}")
    wrong = known_answer(doc, steps)
    print("known answer: " + ("right" if not wrong else "WRONG: " + "; ".join(wrong)))
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
