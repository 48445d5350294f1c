"""torch.profiler Chrome traces (`prof.export_chrome_trace(FILE)` with profile_memory=True)
→ timeline rows in layers `torch_cpu` and `cuda_block`. Pure conversion: no I/O, no torch.

A trace is a dict {"traceEvents": [...], "baseTimeNanoseconds"?: epoch ns, …}. Its memory
events are instants named "[memory]" whose args hold Addr, Bytes (negative: a free), Device
Type (c10::DeviceType: 0 CPU, 1 CUDA) and Device Id; "[OutOfMemory]" instants hold the Bytes
asked for. Each event's `ts` is µs after `baseTimeNanoseconds` (absolute epoch µs in traces
without it, torch < 2.1). Each becomes:

    Device Type 0          torch_cpu alloc / free, device "cpu"
    Device Type 1          cuda_block alloc / free, device "cuda:<Device Id>"
    other device types     no row; counted in `skipped_device_types`
    [OutOfMemory]          oom, size_bytes = requested_bytes = the bytes asked for

A memory event's chain is what was running on its thread at that moment: the op spans
("cpu_op", native frames named after the op) inside the Python function spans
("python_function", recorded with with_stack=True; named "file(line): function", the line
where the function starts: the profiler does not say which line of it was running), innermost
first. Only the profiled window is in the trace: a free of a block allocated before it is an
unmatched free, as for every source.
"""
from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from typing import Any

from memprof.errors import BadInputError
from memprof.model import Action, FrameKind, Layer
from memprof.sources.symbols.frame_interner import FrameInterner
from memprof.sources.torch_import.safe_pickle import short_repr
from memprof.sources.torch_import.snapshot import SnapshotRows
from memprof.sources.torch_import.trace import Rows, ToNs, text

_HINT = "pass a file written by torch.profiler's export_chrome_trace (profile_memory=True)"
_SPAN_CATEGORIES = {"python_function": FrameKind.PYTHON.value, "cpu_op": FrameKind.NATIVE.value}
_PYTHON_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
_DEVICES = {0: (Layer.TORCH_CPU.value, "cpu"), 1: (Layer.CUDA_BLOCK.value, "cuda:{}")}
_MEMORY, _OOM = "[memory]", "[OutOfMemory]"
_MAX_NS = 2**63 - 1  # ts_ns is int64
_MAX_US = 2**53      # µs: beyond this a float has no µs left, and no trace runs that long
# Spans kept in a memory event's chain, innermost first: 10^4 nested spans over 10^4 events
# would otherwise be 10^8 frames from a 2 MB file; with_stack=True traces nest far less.
MAX_CHAIN_SPANS = 256


def check_trace(obj: Any) -> dict:
    """The trace dict, checked at the top level (a dict with a `traceEvents` list). Raises BadInputError."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        what = f"a JSON {type(obj).__name__}" if not isinstance(obj, dict) else "JSON without a traceEvents list"
        raise BadInputError(f"holds {what}, not a torch.profiler Chrome trace", _HINT)
    base = obj.get("baseTimeNanoseconds", 0)
    if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base <= _MAX_NS:
        raise BadInputError(f"baseTimeNanoseconds is {short_repr(base)}, not epoch nanoseconds", _HINT)
    return obj


def profiler_rows(trace: Any, to_ns: ToNs, *, interner: FrameInterner | None = None,
                  seq_start: int = 0) -> SnapshotRows:
    """Every memory row of one Chrome trace (module docstring), in time order, seq from
    `seq_start`. `to_ns(epoch_us) -> int` as for snapshots. Raises BadInputError."""
    trace = check_trace(trace)
    interner = interner or FrameInterner()
    base_ns = trace.get("baseTimeNanoseconds", 0)
    memory, spans = _split(trace["traceEvents"])
    chains = _chains(memory, spans)
    rows, pids, tids, counts = Rows(), [], [], Counter()
    for (where, event), chain in zip(memory, chains):
        ts = _epoch_ns(base_ns, event["ts"], to_ns, where)
        if _row(rows, event, where, ts, lambda: interner.intern(chain), counts):
            pids.append(_int_or_zero(event.get("pid")))
            tids.append(_int_or_zero(event.get("tid")))
    events = rows.events(seq_start)
    events["pid"], events["tid"] = pids, tids
    stacks, frames = interner.drain_tables()
    stats = _stats(rows, counts, bool(spans))
    window = _window(trace["traceEvents"], base_ns, to_ns)
    if window is not None:  # the recording spans the profiled window, not only its memory events
        stats["first_ns"], stats["last_ns"] = window
    return SnapshotRows(events, stacks, frames, stats)


def _epoch_ns(base_ns: int, ts_us: float, to_ns: ToNs, where: str) -> int:
    """An event's `ts` (µs after `base_ns`) on the recording's clock. Raises BadInputError
    when it is not a time the recording can hold."""
    epoch_us = (base_ns + round(ts_us * 1000)) // 1000
    ns = int(to_ns(epoch_us)) if 0 <= epoch_us <= _MAX_NS // 1000 else -1
    if not 0 <= ns <= _MAX_NS:
        raise BadInputError(f"{where}: ts {short_repr(ts_us)} is not a time in the trace", _HINT)
    return ns


def _window(events: list, base_ns: int, to_ns: ToNs) -> tuple[int, int] | None:
    """(first, last) time of the trace's events, starts and ends, on the recording's clock;
    None when none has a time the recording can hold."""
    starts = [e["ts"] for e in events if isinstance(e, dict) and e.get("ph") in ("X", "i", "I")
              and _is_us(e.get("ts"))]
    ends = [e["ts"] + e["dur"] for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and _is_us(e.get("ts")) and _is_us(e.get("dur"))]
    if not starts:
        return None
    try:
        return (_epoch_ns(base_ns, min(starts), to_ns, "the first event"),
                _epoch_ns(base_ns, max(starts + ends), to_ns, "the last event"))
    except BadInputError:
        return None


def _split(events: list) -> tuple[list[tuple[str, dict]], list[dict]]:
    """(memory events with where they are, in time order; spans that can be chains)."""
    memory, spans = [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            continue
        if e.get("name") in (_MEMORY, _OOM) and e.get("ph") in ("i", "I"):
            if not _is_us(e.get("ts")):
                raise BadInputError(f"traceEvents[{i}]: ts is {short_repr(e.get('ts'))}, not a number of µs", _HINT)
            memory.append((f"traceEvents[{i}]", e))
        elif e.get("ph") == "X" and isinstance(e.get("cat"), str) and e["cat"] in _SPAN_CATEGORIES \
                and _is_us(e.get("ts")) and _is_us(e.get("dur")):
            spans.append(e)
    memory.sort(key=lambda item: item[1]["ts"])
    return memory, spans


def _chains(memory: list[tuple[str, dict]], spans: list[dict]) -> list[list[dict]]:
    """Per memory event, the frames of the spans open on its thread at its time, innermost
    first (at most MAX_CHAIN_SPANS): one sweep per thread over span starts and memory events
    in time order."""
    by_thread: dict[tuple, list] = {}
    for s in spans:  # at equal times a span starts before an event inside it, outer spans first
        by_thread.setdefault(_thread(s), []).append((s["ts"], 0, -s["dur"], s))
    for index, (_, e) in enumerate(memory):
        by_thread.setdefault(_thread(e), []).append((e["ts"], 1, index, e))
    chains: list[list[dict]] = [[] for _ in memory]
    frames: dict[int, dict] = {}  # id(span) -> its frame, made once however many chains hold it
    for items in by_thread.values():
        _sweep(sorted(items, key=lambda t: t[:3]), chains, frames)
    return chains


def _sweep(items: list[tuple], chains: list[list[dict]], frames: dict[int, dict]) -> None:
    """One thread's sweep: spans open in start order, each leaving once its end has passed
    (wherever it is: spans that do not nest stay correct), found by a heap of ends."""
    open_spans: dict[int, dict] = {}  # start order
    ends: list[tuple[float, int]] = []
    for order, (ts, kind, key, item) in enumerate(items):
        while ends and ends[0][0] < ts:
            open_spans.pop(heapq.heappop(ends)[1], None)
        if kind == 0:
            open_spans[order] = item
            heapq.heappush(ends, (item["ts"] + item["dur"], order))
            continue
        chain = []
        for span in reversed(open_spans.values()):
            if len(chain) == MAX_CHAIN_SPANS:
                break
            if id(span) not in frames:
                frames[id(span)] = _frame(span)
            chain.append(frames[id(span)])
        chains[key] = chain


def _thread(event: dict) -> tuple:
    """(pid, tid) of an event, as a key whatever the file holds there."""
    return tuple(v if v is None or isinstance(v, (int, str)) else short_repr(v)
                 for v in (event.get("pid"), event.get("tid")))


def _frame(span: dict) -> dict:
    name = text(span.get("name", "?"))
    if span.get("cat") == "python_function":
        m = _PYTHON_NAME.match(name)
        if m:
            return {"filename": m["file"], "line": int(m["line"]), "name": m["function"]}
        return {"filename": None, "line": None, "name": name, "kind": FrameKind.PYTHON.value}  # builtins, modules
    return {"filename": None, "line": None, "name": name, "kind": FrameKind.NATIVE.value}


def _row(rows: Rows, e: dict, where: str, ts: int, stack_of, counts: Counter) -> bool:
    """Add the row of one memory event (False: a device left out); `stack_of()` interns its chain."""
    args = e.get("args")
    if not isinstance(args, dict):
        raise BadInputError(f"{where}: a {e['name']} event without args", _HINT)
    size = _bytes(args, where)
    device_type = args.get("Device Type")
    if isinstance(device_type, bool) or not isinstance(device_type, int) or device_type not in _DEVICES:
        counts[f"device type {short_repr(device_type)}"] += 1
        return False
    layer, device = _DEVICES[device_type]
    if device_type == 1:
        device = device.format(_device_id(args, where))
    stack = stack_of()
    if e["name"] == _OOM:
        rows.add(ts, layer, Action.OOM.value, 0, abs(size), device, abs(size), stack)
        counts["oom"] += 1
        return True
    addr = args.get("Addr")
    if isinstance(addr, bool) or not isinstance(addr, int) or not 0 <= addr < 2**64 or size == 0:
        raise BadInputError(f"{where}: Addr {short_repr(addr)} and Bytes {size} are not an allocation", _HINT)
    action = Action.ALLOC.value if size > 0 else Action.FREE.value
    rows.add(ts, layer, action, addr, abs(size), device, abs(size) if size > 0 else None, stack)
    counts[action] += 1
    return True


def _stats(rows: Rows, counts: Counter, has_spans: bool) -> dict[str, Any]:
    skipped = {k: v for k, v in counts.items() if k.startswith("device type")}
    ts = rows.columns["ts_ns"]
    stats = {
        "format": "chrome trace", "entries": sum(counts.values()), "events": len(rows),
        "devices": sorted(set(rows.columns["device"])),
        "actions": {k: v for k, v in sorted(counts.items()) if k not in skipped},
        "skipped_device_types": skipped,
        "first_ns": min(ts) if ts else None, "last_ns": max(ts) if ts else None,
    }
    notes = []
    if not stats["entries"]:
        notes.append("the trace has no [memory] events: profile with torch.profiler.profile(profile_memory=True)")
    elif not has_spans:
        notes.append("the trace has no op or Python function spans: its allocations have no chains")
    if counts["oom"]:
        notes.append(f"out-of-memory errors in the trace: {counts['oom']}")
    if skipped:
        notes.append(f"memory events of devices other than CPU and CUDA left out: {sum(skipped.values())}")
    stats["notes"] = notes
    return stats


def _bytes(args: dict, where: str) -> int:
    """A memory event's Bytes: a whole number of at most 2^53 either way (negative: a free)."""
    value = args.get("Bytes")
    if not _is_us(value) or value != int(value):
        raise BadInputError(f"{where}: Bytes is {short_repr(value)}, not a byte count", _HINT)
    return int(value)


def _device_id(args: dict, where: str) -> int:
    """A CUDA memory event's Device Id (absent: device 0)."""
    value = args.get("Device Id", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**16:
        raise BadInputError(f"{where}: Device Id is {short_repr(value)}, not a CUDA device index", _HINT)
    return value


def _is_us(value: Any) -> bool:
    """A finite number, of at most 2^53 either way (µs of a trace, or bytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and -_MAX_US <= value <= _MAX_US


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and -2**31 <= value < 2**31 else 0
