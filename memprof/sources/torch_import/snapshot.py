"""PyTorch CUDA memory snapshots → timeline rows, stacks and frames (DESIGN.md §3, §4).

A snapshot (`torch.cuda.memory._snapshot()`, pickled by `_dump_snapshot`) is a dict:

    segments:       [{device, address, total_size, allocated_size, active_size, stream, segment_type,
                      is_expandable?, frames?, blocks: [{address?, size, requested_size, state,
                      frames? | history?}]}]
    device_traces:  [[trace entry, …], …]   one list per device, oldest first (memprof/sources/torch_import/trace.py)
    allocator_settings?:   {PYTORCH_CUDA_ALLOC_CONF, expandable_segments, max_split_size, …}
    external_annotations?: [{stage: START | END, name, device, time_us}]

Pure conversion: no I/O, no torch. The trace entries become rows as torch_trace.py says;
annotations become `mark` rows labelled "annotation:NAME" ("annotation:NAME:end" at a range's
end). The snapshot's end state fills what the trace cannot say: a block held at the snapshot
(state active_allocated, or active_pending_free — `active_awaiting_free` in torch's docstring)
whose alloc is not in the trace (made before the ring buffer began, or history was off) is
emitted as an allocation at the trace's first time, and so is every part of a segment not
allocated or mapped in the trace; a pending block's free request is placed at the last time.
Legacy snapshots (torch 1.13: no `device_traces`, `blocks[i]["history"] = [{addr, real_size,
frames}]`, newest first) give a held block its address, requested size and frames from
history[0]; older history entries have no times and are only counted.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, NamedTuple

from memprof.errors import BadInputError
from memprof.model import Action, Layer
from memprof.sources.symbols.frame_interner import FrameInterner
from memprof.sources.torch_import.safe_pickle import short_repr
from memprof.sources.torch_import.trace import (
    MAX_LABELS, LiveTraces, Rows, ToNs, TraceConverter, _size, _u64, agent_trace_tables, clean_frames, is_time_us,
    realtime_ns, text, trace_rows,
)
from memprof.units import format_bytes

__all__ = ["LiveTraces", "SnapshotRows", "agent_trace_tables", "check_snapshot", "realtime_ns", "snapshot_rows",
           "trace_rows"]

_HINT = "pass a file written by torch.cuda.memory._dump_snapshot(FILE)"
_ACTIVE = {"active_allocated": False, "active_pending_free": True, "active_awaiting_free": True}  # -> pending
_BLOCK, _SEGMENT = Layer.CUDA_BLOCK.value, Layer.CUDA_SEGMENT.value
_ALLOC, _FREE_REQUESTED = Action.ALLOC.value, Action.FREE_REQUESTED.value
_ADDRESS_SPACE = 2**64
# allocator_settings are kept in meta.json as given, up to this many values (a hostile file's
# settings can be nested or shared without end: the rest becomes "…").
MAX_SETTINGS_VALUES = 10_000


class SnapshotRows(NamedTuple):
    """Columns for RecordingWriter.append("events" | "stacks" | "frames", …), and what the
    conversion saw (JSON-ready: counts, devices, allocator settings, notes for the user)."""

    events: dict[str, list]
    stacks: dict[str, list]
    frames: dict[str, list]
    stats: dict[str, Any]


def check_snapshot(obj: Any) -> dict:
    """The snapshot dict, checked at the top level: a dict with a `segments` list and, where
    present, a `device_traces` list. A bare list of segments (what
    `torch.cuda.memory_snapshot()` returns) is taken as {"segments": it}. Raises BadInputError."""
    if isinstance(obj, list) and obj and all(isinstance(s, dict) and "blocks" in s for s in obj):
        obj = {"segments": obj}
    if not isinstance(obj, dict):
        raise BadInputError(f"holds a {type(obj).__name__}, not a CUDA memory snapshot (a dict)", _HINT)
    if "segments" not in obj and "device_traces" not in obj:
        keys = ", ".join(sorted(map(str, obj))[:6]) or "none"
        raise BadInputError(f"not a CUDA memory snapshot: no 'segments' or 'device_traces' key (keys: {keys})", _HINT)
    for key in ("segments", "device_traces", "external_annotations"):
        if obj.get(key) is not None and not isinstance(obj[key], list):
            raise BadInputError(f"'{key}' is a {type(obj[key]).__name__}, not a list", _HINT)
    return obj


def snapshot_rows(snapshot: Any, to_ns: ToNs, *, interner: FrameInterner | None = None, seq_start: int = 0,
                  pid: int = 0, tid: int = 0) -> SnapshotRows:
    """Every row of one snapshot (module docstring), seq counting from `seq_start`.

    `to_ns(epoch_us) -> int` converts the snapshot's times (see `realtime_ns`). Pass one
    `interner` to several calls to share stack and frame ids (each call returns only the
    stacks and frames new to it). Raises BadInputError naming the part that cannot be read."""
    snap = check_snapshot(snapshot)
    interner = interner or FrameInterner()
    first_us, last_us = _time_range(snap)
    first_ns = 0 if first_us is None else int(to_ns(first_us))
    last_ns = first_ns if last_us is None else int(to_ns(last_us))
    labels: set[str] = set()
    converters: dict[int, TraceConverter] = {}
    body = Rows()
    for device, entries in enumerate(snap.get("device_traces") or []):
        converters[device] = TraceConverter(device, to_ns, interner, default_ns=first_ns, labels=labels)
        body.extend(converters[device].rows(entries, f"device_traces[{device}]"))
    annotations = _annotation_rows(snap.get("external_annotations") or [], converters, to_ns, interner,
                                   first_ns, labels)
    body.extend(annotations)
    end = _EndState(converters, interner, first_ns, last_ns)
    for i, segment in enumerate(snap.get("segments") or []):
        end.segment(segment, f"segments[{i}]")
    rows = Rows()
    for part in (end.before, body, end.after):
        rows.extend(part)
    stacks, frames = interner.drain_tables()
    stats = _stats(snap, rows, converters, end, len(annotations), first_us, first_ns, last_ns)
    return SnapshotRows(rows.events(seq_start, pid, tid), stacks, frames, stats)


def _time_range(snap: dict) -> tuple[int | None, int | None]:
    """Earliest and latest `time_us` of the trace entries and annotations (None: no times)."""
    times = [e["time_us"] for trace in snap.get("device_traces") or [] if isinstance(trace, list)
             for e in trace if isinstance(e, dict) and is_time_us(e.get("time_us"))]
    times += [a["time_us"] for a in snap.get("external_annotations") or []
              if isinstance(a, dict) and is_time_us(a.get("time_us"))]
    return (int(min(times)), int(max(times))) if times else (None, None)


def _annotation_rows(annotations: list, converters: dict[int, TraceConverter], to_ns: ToNs,
                     interner: FrameInterner, first_ns: int, labels: set[str]) -> Rows:
    """Mark rows of `external_annotations` (record_function ranges and user annotations)."""
    rows = Rows()
    for i, a in enumerate(annotations):
        where = f"external_annotations[{i}]"
        if not isinstance(a, dict):
            raise BadInputError(f"{where} is a {type(a).__name__}, not an annotation dict", _HINT)
        device = _device(a, where)
        if device not in converters:
            converters[device] = TraceConverter(device, to_ns, interner, default_ns=first_ns, labels=labels)
        converter = converters[device]
        time_us = a.get("time_us")
        if time_us is not None and not is_time_us(time_us):
            raise BadInputError(f"{where}: time_us is {short_repr(time_us)}, not epoch microseconds", _HINT)
        ts = first_ns if time_us is None else int(to_ns(int(time_us)))
        stage = a.get("stage")
        end = isinstance(stage, str) and stage.upper() == "END"
        converter.mark(rows, ts, text(a.get("name", "?")) + (":end" if end else ""))
    return rows


def _device(d: dict, where: str) -> int:
    device = d.get("device", 0)
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < 2**16:
        raise BadInputError(f"{where}: device is {short_repr(device)}, not a CUDA device index", _HINT)
    return device


class _EndState:
    """Rows for what the snapshot holds at its end and its trace does not explain: `before`
    every trace row (allocations at the first time), `after` them (at the last time)."""

    def __init__(self, converters: dict[int, TraceConverter], interner: FrameInterner, first_ns: int, last_ns: int):
        self.converters, self.interner = converters, interner
        self.first_ns, self.last_ns = first_ns, last_ns
        self.before, self.after = Rows(), Rows()
        self.counts: Counter = Counter()
        self.expandable = False
        self._stacks: dict[int, int | None] = {}  # id(frames) -> stack id: blocks share frame lists

    def _stack(self, frames: Any) -> int | None:
        key = id(frames)  # the snapshot outlives the conversion, so ids are not reused meanwhile
        if key not in self._stacks:
            self._stacks[key] = self.interner.intern(clean_frames(frames))
        return self._stacks[key]

    def segment(self, seg: Any, where: str) -> None:
        if not isinstance(seg, dict):
            raise BadInputError(f"{where} is a {type(seg).__name__}, not a segment dict", _HINT)
        device, address = _device(seg, where), _u64(seg, "address", where)
        total = _size(seg, where, "total_size")
        if address + total > _ADDRESS_SPACE:
            raise BadInputError(f"{where}: address {address:#x} + total_size {total} runs past the address space",
                                _HINT)
        self.expandable |= bool(seg.get("is_expandable"))
        converter = self.converters.get(device)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise BadInputError(f"{where}.blocks is a {type(blocks).__name__}, not a list", _HINT)
        offset = address
        for j, block in enumerate(blocks):
            offset = self._block(block, f"{where}.blocks[{j}]", device, offset, converter)
        gaps = _uncovered(address, total, converter)
        stack = self._stack(seg.get("frames")) if gaps else None
        for gap, size in gaps:
            self.before.add(self.first_ns, _SEGMENT, _ALLOC, gap, size, f"cuda:{device}", None, stack)
            self.counts["segments"] += 1
            self.counts["segment_bytes"] += size

    def _block(self, block: Any, where: str, device: int, offset: int, converter: TraceConverter | None) -> int:
        """Emit what a held block needs; the address after it (blocks tile their segment)."""
        if not isinstance(block, dict):
            raise BadInputError(f"{where} is a {type(block).__name__}, not a block dict", _HINT)
        size = _size(block, where)
        addr = _u64(block, "address", where) if "address" in block else offset
        requested, frames, addr = self._block_origin(block, where, size, addr)
        if addr + size > _ADDRESS_SPACE:
            raise BadInputError(f"{where}: address {addr:#x} + size {size} runs past the address space", _HINT)
        state = _state(block)
        if state in _ACTIVE:
            self._held(device, addr, size, requested, frames, _ACTIVE[state], converter)
        return addr + size

    def _block_origin(self, block: dict, where: str, size: int, addr: int) -> tuple[int, Any, int]:
        """(requested bytes, frames, address): from the block, or history[0] in legacy snapshots."""
        history = block.get("history")
        if "frames" in block or not isinstance(history, list) or not history or not isinstance(history[0], dict):
            requested = _size(block, where, "requested_size") if "requested_size" in block else size
            return requested, block.get("frames"), addr
        held = 1 if _state(block) in _ACTIVE else 0
        self.counts["legacy_past"] += len(history) - held
        self.counts["legacy_blocks"] += 1
        newest = history[0]
        requested = _size(newest, f"{where}.history[0]", "real_size") if "real_size" in newest else size
        addr = _u64(newest, "addr", f"{where}.history[0]") if "addr" in newest else addr
        return requested, newest.get("frames"), addr

    def _held(self, device: int, addr: int, size: int, requested: int, frames: Any, pending: bool,
              converter: TraceConverter | None) -> None:
        seen = converter.blocks.get(addr) if converter else None
        if seen in (_ALLOC, _FREE_REQUESTED):
            return  # its alloc is in the trace
        name, stack = f"cuda:{device}", self._stack(frames)
        if seen is None and converter is not None and addr in converter.freed:
            # The trace freed it last, the snapshot holds it: trust the snapshot from its time on.
            self.after.add(self.last_ns, _BLOCK, _ALLOC, addr, size, name, requested, stack)
            self.counts["inconsistent"] += 1
            return
        self.before.add(self.first_ns, _BLOCK, _ALLOC, addr, size, name, requested, stack)
        self.counts["blocks"] += 1
        self.counts["block_bytes"] += size
        if pending and seen is None:  # its free was requested before the snapshot, when is unknown
            self.after.add(self.last_ns, _BLOCK, _FREE_REQUESTED, addr, size, name, requested, None)


def _state(block: dict) -> str | None:
    state = block.get("state")
    return state if isinstance(state, str) else None


def _uncovered(start: int, total: int, converter: TraceConverter | None) -> list[tuple[int, int]]:
    """Parts of the segment [start, start + total) that no live segment or mapped piece of
    the trace covers: (addr, bytes)."""
    end = start + total
    covered = []
    if converter is not None:
        if start in converter.segments:
            covered.append((start, start + converter.segments[start]))
        covered += [(a, a + s) for a, s, _ in converter.mapped_pieces(start, end)]
    gaps, position = [], start
    for a, b in sorted(covered):
        if a > position:
            gaps.append((position, a - position))
        position = max(position, b)
    if position < end:
        gaps.append((position, end - position))
    return gaps


def _stats(snap: dict, rows: Rows, converters: dict[int, TraceConverter], end: _EndState, annotations: int,
           first_us: int | None, first_ns: int, last_ns: int) -> dict[str, Any]:
    actions, skipped = Counter(), Counter()
    for c in converters.values():
        actions.update(c.actions)
        skipped.update(c.skipped)
    entries = sum(actions.values()) + sum(skipped.values())
    fmt = "device_traces" if entries else ("legacy block history" if end.counts["legacy_blocks"] else "segments only")
    stats = {
        "format": fmt,
        "entries": entries, "events": len(rows), "devices": sorted(set(rows.columns["device"])),
        "actions": dict(sorted(actions.items())), "skipped_actions": dict(sorted(skipped.items())),
        "untimed_entries": sum(c.untimed for c in converters.values()),
        "annotations": annotations, "annotations_dropped": sum(c.labels_dropped for c in converters.values()),
        "synthesized_blocks": end.counts["blocks"], "synthesized_block_bytes": end.counts["block_bytes"],
        "synthesized_segments": end.counts["segments"], "synthesized_segment_bytes": end.counts["segment_bytes"],
        "inconsistent_blocks": end.counts["inconsistent"], "legacy_past_allocations": end.counts["legacy_past"],
        "expandable_segments": end.expandable,
        "first_ns": first_ns if first_us is not None else None, "last_ns": last_ns if first_us is not None else None,
        "allocator_settings": plain(snap.get("allocator_settings")),
    }
    oom = [s for s, a in zip(rows.columns["size_bytes"], rows.columns["action"]) if a == Action.OOM.value]
    stats["notes"] = _notes(stats, oom)
    return stats


def _notes(s: dict[str, Any], oom: list[int]) -> list[str]:
    """What a reader of the reports should know about this snapshot, in plain words."""
    notes = []
    if s["format"] == "segments only":
        notes.append("the snapshot has no trace (memory history was off, or enabled='state'): "
                     "only what it held at its end is shown")
    if s["synthesized_blocks"]:
        notes.append("held at the snapshot with no alloc in its trace (made before the trace's ring buffer began, or "
                     "recorded without history), so shown allocated from the trace's first time: "
                     f"{_count(s['synthesized_blocks'], 'CUDA block')}, {format_bytes(s['synthesized_block_bytes'])}")
    if s["synthesized_segments"]:
        notes.append("reserved at the snapshot with no segment_alloc or segment_map in its trace, so shown allocated "
                     f"from the trace's first time: {_count(s['synthesized_segments'], 'CUDA segment range')}, "
                     f"{format_bytes(s['synthesized_segment_bytes'])}")
    if s["inconsistent_blocks"]:
        notes.append("held at the snapshot although the trace's last event at their address freed them, so shown "
                     f"allocated from the snapshot's time: {_count(s['inconsistent_blocks'], 'CUDA block')}")
    if s["first_ns"] is None and s["events"]:
        notes.append("the snapshot has no timestamps: every event is at time 0, in trace order "
                     "(report leaks with --min-age 0)")
    elif s["untimed_entries"]:
        notes.append("without time_us (older torch), so each keeps the time of the entry before it: "
                     f"{_count(s['untimed_entries'], 'trace entry', 'trace entries')}")
    if s["legacy_past_allocations"]:
        notes.append(f"legacy snapshot (per-block history): {s['legacy_past_allocations']} earlier allocations "
                     "kept in block histories have no times and are left out")
    if s["annotations_dropped"]:
        notes.append(f"{s['annotations_dropped']} annotations left out: more than {MAX_LABELS} distinct names")
    if oom:
        notes.append(f"the CUDA caching allocator raised {_count(len(oom), 'out-of-memory error')} "
                     f"(largest request {format_bytes(max(oom))})")
    return notes


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def plain(value: Any, budget: int = MAX_SETTINGS_VALUES) -> Any:
    """`value` as JSON-ready data that meta.json can hold and read back: str keys, lists for
    tuples and sets, text for bytes, a string for NaN, infinities, integers outside int64 and
    anything else; at most 20 levels deep and `budget` values in all, "…" for the rest."""
    return _Plain(budget).value(value, 0)


class _Plain:
    """One `plain` conversion: counts the values it has converted against its budget."""

    def __init__(self, budget: int):
        self.left = budget

    def value(self, value: Any, depth: int) -> Any:
        self.left -= 1
        if self.left < 0 or depth > 20:
            return "…"
        if value is None or isinstance(value, (str, bool)):
            return value
        if isinstance(value, int):
            return value if -2**63 <= value < 2**63 else short_repr(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else repr(value)
        if isinstance(value, dict):
            return {text(k): self.value(v, depth + 1) for k, v in _bounded(value.items(), self)}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.value(v, depth + 1) for v in _bounded(value, self)]
        if isinstance(value, (bytes, bytearray)):
            return bytes(value[:4096]).decode("utf-8", "replace")
        return short_repr(value)


def _bounded(items, budget: _Plain):
    """`items` while the budget lasts."""
    for item in items:
        if budget.left <= 0:
            return
        yield item
