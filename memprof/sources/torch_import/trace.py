"""PyTorch CUDA caching-allocator trace entries → timeline rows in layers `cuda_block` and
`cuda_segment` (device `cuda:N`). Pure conversion: no I/O, no torch.

A trace entry (`torch.cuda.memory._snapshot()["device_traces"][N][i]`, oldest first) is a dict
{action, addr | device_free, size, stream, time_us?, frames?}. Each becomes:

    alloc                    cuda_block alloc; size_bytes = requested_bytes = the entry's size (the
                             trace records the bytes asked for, not the block's rounded size)
    free_requested           cuda_block free_requested (the tensor is gone; the block waits for its streams)
    free_completed, free     cuda_block free (`free`: the action's name in torch 2.0 traces)
    segment_alloc / _free    cuda_segment alloc / free (one cudaMalloc / cudaFree)
    segment_map / _unmap     cuda_segment alloc / free. Expandable segments
                             (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torch >= 2.1) grow by
                             mapping pages into one reserved range and shrink by unmapping pages,
                             in ranges that need not match the maps: each map is one allocation;
                             an unmap frees every mapped piece it touches, and the part of a piece
                             it leaves mapped is allocated again at the unmap's time.
    oom                      cuda_block oom, addr 0, size_bytes = requested_bytes = the bytes asked for
    snapshot                 no row (the moment a snapshot was taken)
    user_defined             mark, category "annotation:user_defined"
    anything else            no row; counted in `skipped`

`frames` ({filename, line, name} dicts, innermost first) become the row's stack through a
FrameInterner. Times: `time_us` is epoch µs (CLOCK_REALTIME, the allocator's clock);
`to_ns(epoch_us) -> int`, given by the caller, turns it into the recording's clock. An entry
without `time_us` (older snapshots) keeps the time of the entry before it (`default_ns` for the
first ones); `seq` keeps the order. A free with no alloc before it is an allocation made before
the ring buffer began: pairing (memprof/analysis/lifetimes.py) counts it as unmatched.

Entry points: `trace_rows` (one list of entries), `TraceConverter` (one device, across calls),
`LiveTraces` / `agent_trace_tables` (history drained from running processes by the torch agent).
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from typing import Any, Callable

from memprof.errors import BadInputError
from memprof.model import Action, Layer
from memprof.sources.symbols.frame_interner import FrameInterner
from memprof.sources.torch_import.safe_pickle import short_repr

ToNs = Callable[[int], int]

_HINT = "the snapshot is damaged, or was not written by torch.cuda.memory._dump_snapshot"
_ROW_KEYS = ("ts_ns", "layer", "action", "addr", "size_bytes", "requested_bytes", "device", "stack_id", "category")
_BLOCK, _SEGMENT = Layer.CUDA_BLOCK.value, Layer.CUDA_SEGMENT.value
_ALLOC, _FREE, _FREE_REQUESTED = Action.ALLOC.value, Action.FREE.value, Action.FREE_REQUESTED.value
_OOM, _MARK = Action.OOM.value, Action.MARK.value
# A category column holds at most 128 labels per batch; annotation names beyond this are dropped.
MAX_LABELS = 100
_U64 = 2**64
MAX_TIME_US = (2**63 - 1) // 1000  # the latest epoch µs whose ns still fit the int64 ts_ns column
# Frames kept per chain, innermost first: torch's tracebacks (Python and C++) are far shorter,
# and a hostile file's list of a million references to one frame would otherwise cost a
# million rows per stack.
MAX_STACK_DEPTH = 1024
_MAX_SKIPPED_NAMES = 32  # distinct unknown action names counted by name; the rest as "(other)"


def realtime_ns(epoch_us: int) -> int:
    """The importer's clock: epoch µs → epoch ns, CLOCK_REALTIME kept."""
    return int(epoch_us) * 1000


class Rows:
    """Timeline rows being built, column by column (no seq, pid or tid yet)."""

    def __init__(self):
        self.columns: dict[str, list] = {key: [] for key in _ROW_KEYS}

    def __len__(self) -> int:
        return len(self.columns["ts_ns"])

    def add(self, ts_ns: int, layer: str | None, action: str, addr: int, size: int | None, device: str,
            requested: int | None = None, stack_id: int | None = None, category: str | None = None) -> None:
        for key, value in zip(_ROW_KEYS, (ts_ns, layer, action, addr, size, requested, device, stack_id, category)):
            self.columns[key].append(value)

    def extend(self, other: "Rows") -> None:
        for key in _ROW_KEYS:
            self.columns[key].extend(other.columns[key])

    def events(self, seq_start: int = 0, pid: int = 0, tid: int = 0) -> dict[str, list]:
        """Columns for `RecordingWriter.append("events", …)`, seq counting from `seq_start`."""
        n = len(self)
        return {**self.columns, "seq": list(range(seq_start, seq_start + n)), "pid": [pid] * n, "tid": [tid] * n}


class TraceConverter:
    """Rows of one device's trace entries, in order. Keep one per device across calls (live
    drains): an unmap is split against the pieces mapped before it, and the converter
    remembers each block's last event for the snapshot's end state."""

    def __init__(self, device: int, to_ns: ToNs, interner: FrameInterner, *, default_ns: int = 0,
                 labels: set[str] | None = None):
        self.device = f"cuda:{device}"
        self.to_ns, self.interner = to_ns, interner
        self.last_ns = default_ns          # time given to entries without time_us
        self.labels = set() if labels is None else labels
        self.blocks: dict[int, str] = {}   # addr -> last event: alloc, free_requested, unseen_free_requested
        self.freed: set[int] = set()       # addrs whose last event freed them
        self.segments: dict[int, int] = {}  # cudaMalloc'd segments live now: addr -> bytes
        self._map_starts: list[int] = []   # expandable pieces mapped now, sorted
        self._mapped: dict[int, tuple[int, int | None]] = {}  # start -> (bytes, stack_id)
        self.actions: Counter = Counter()
        self.skipped: Counter = Counter()
        self.untimed = 0
        self.labels_dropped = 0
        self.unreadable = 0

    def rows(self, entries: list, where: str = "device_traces", *, strict: bool = True) -> Rows:
        """Rows for `entries` (trace entry dicts, oldest first). Raises BadInputError naming
        `where`[i] for an entry that cannot be read; with `strict` False (live drains) such an
        entry is skipped and counted in `unreadable`."""
        if not isinstance(entries, list):
            raise BadInputError(f"{where} is a {type(entries).__name__}, not a list of trace entries", _HINT)
        rows, stacks = Rows(), {}
        for i, entry in enumerate(entries):
            try:
                self._entry(entry, f"{where}[{i}]", rows, stacks)
            except BadInputError:
                if strict:
                    raise
                self.unreadable += 1
        return rows

    def _entry(self, entry: Any, where: str, rows: Rows, stacks: dict) -> None:
        if not isinstance(entry, dict):
            raise BadInputError(f"{where} is a {type(entry).__name__}, not a trace entry dict", _HINT)
        action = entry.get("action")
        ts = self._ts(entry, where)
        handler = _HANDLERS.get(action) if isinstance(action, str) else None
        if handler is None:
            self._skip(action)
            return
        self.actions[action] += 1
        frames = entry.get("frames")
        key = id(frames)  # torch shares one list per distinct traceback, and pickle keeps it shared
        if key not in stacks:
            stacks[key] = (frames, self.interner.intern(clean_frames(frames)))
        handler(self, entry, where, ts, stacks[key][1], rows)

    def _ts(self, entry: dict, where: str) -> int:
        time_us = entry.get("time_us")
        if time_us is None:
            self.untimed += 1
            return self.last_ns
        if not is_time_us(time_us):
            raise BadInputError(f"{where}: time_us is {short_repr(time_us)}, not epoch microseconds", _HINT)
        self.last_ns = int(self.to_ns(int(time_us)))
        return self.last_ns

    def _skip(self, action: Any) -> None:
        """Count an entry of an action without rows, by name (a bounded number of names)."""
        name = action if isinstance(action, str) and len(action) <= 64 else short_repr(action)
        if name not in self.skipped and len(self.skipped) >= _MAX_SKIPPED_NAMES:
            name = "(other)"
        self.skipped[name] += 1

    def _alloc(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        self.blocks[addr] = _ALLOC
        self.freed.discard(addr)
        rows.add(ts, _BLOCK, _ALLOC, addr, size, self.device, size, stack, self._category(e.get("category")))

    def _free_requested(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        seen_alloc = self.blocks.get(addr) in (_ALLOC, _FREE_REQUESTED)
        self.blocks[addr] = _FREE_REQUESTED if seen_alloc else "unseen_free_requested"
        rows.add(ts, _BLOCK, _FREE_REQUESTED, addr, size, self.device, size, stack)

    def _free(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        self.blocks.pop(addr, None)
        self.freed.add(addr)
        rows.add(ts, _BLOCK, _FREE, addr, size, self.device, size, stack)

    def _segment_alloc(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        self.segments[addr] = size
        rows.add(ts, _SEGMENT, _ALLOC, addr, size, self.device, None, stack)

    def _segment_free(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        self.segments.pop(addr, None)
        rows.add(ts, _SEGMENT, _FREE, addr, size, self.device, None, stack)

    def _segment_map(self, e, where, ts, stack, rows):
        addr, size = _u64(e, "addr", where), _size(e, where)
        self._add_piece(addr, size, stack)
        rows.add(ts, _SEGMENT, _ALLOC, addr, size, self.device, None, stack)

    def _segment_unmap(self, e, where, ts, stack, rows):
        start, size = _u64(e, "addr", where), _size(e, where)
        end = start + size
        pieces = self.mapped_pieces(start, end)
        if not pieces:  # mapped before the trace began: an unmatched free, as for a block
            rows.add(ts, _SEGMENT, _FREE, start, size, self.device, None, stack)
            return
        for piece, piece_size, piece_stack in pieces:
            self._remove_piece(piece)
            rows.add(ts, _SEGMENT, _FREE, piece, piece_size, self.device, None, stack)
            for left, right in ((piece, min(start, piece + piece_size)), (max(end, piece), piece + piece_size)):
                if right > left:  # the part of the piece this unmap left mapped
                    self._add_piece(left, right - left, piece_stack)
                    rows.add(ts, _SEGMENT, _ALLOC, left, right - left, self.device, None, piece_stack)

    def _oom(self, e, where, ts, stack, rows):
        size = _size(e, where)
        rows.add(ts, _BLOCK, _OOM, 0, size, self.device, size, stack)

    def _user_defined(self, e, where, ts, stack, rows):
        self.mark(rows, ts, "user_defined")

    def _snapshot(self, e, where, ts, stack, rows):
        pass  # no row: its time is the end the trace reached (see snapshot_rows)

    def mark(self, rows: Rows, ts: int, name: str) -> None:
        """A mark row labelled "annotation:NAME", unless MAX_LABELS labels are taken."""
        category = self._category(f"annotation:{name}")
        if category is None:
            self.labels_dropped += 1
            return
        rows.add(ts, None, _MARK, 0, None, self.device, category=category)

    def _category(self, label: Any) -> str | None:
        if not isinstance(label, str):
            return None
        if label not in self.labels and len(self.labels) >= MAX_LABELS:
            return None
        self.labels.add(label)
        return label

    def mapped_pieces(self, start: int, end: int) -> list[tuple[int, int, int | None]]:
        """Expandable-segment pieces mapped now that overlap [start, end): (addr, bytes, stack_id)."""
        i = max(bisect.bisect_right(self._map_starts, start) - 1, 0)
        found = []
        for piece in self._map_starts[i:]:
            if piece >= end:
                break
            size, stack = self._mapped[piece]
            if piece + size > start:
                found.append((piece, size, stack))
        return found

    def _add_piece(self, addr: int, size: int, stack: int | None) -> None:
        if addr not in self._mapped:
            bisect.insort(self._map_starts, addr)
        self._mapped[addr] = (size, stack)

    def _remove_piece(self, addr: int) -> None:
        del self._mapped[addr]
        self._map_starts.pop(bisect.bisect_left(self._map_starts, addr))


_HANDLERS: dict[str, Callable] = {
    "alloc": TraceConverter._alloc,
    "free_requested": TraceConverter._free_requested,
    "free_completed": TraceConverter._free,
    "free": TraceConverter._free,
    "segment_alloc": TraceConverter._segment_alloc,
    "segment_free": TraceConverter._segment_free,
    "segment_map": TraceConverter._segment_map,
    "segment_unmap": TraceConverter._segment_unmap,
    "oom": TraceConverter._oom,
    "snapshot": TraceConverter._snapshot,
    "user_defined": TraceConverter._user_defined,
}


def trace_rows(entries: list, device: int, to_ns: ToNs, interner: FrameInterner, *, seq_start: int = 0,
               pid: int = 0, tid: int = 0) -> dict[str, list]:
    """Events columns for one device's trace entries (oldest first), seq from `seq_start`.
    One-shot; for repeated drains keep a TraceConverter per device and call
    `converter.rows(entries).events(seq_start, pid, tid)`."""
    return TraceConverter(device, to_ns, interner).rows(entries).events(seq_start, pid, tid)


# Stack and frame ids of live CUDA history start here, apart from the eBPF sources' StackInterner
# (which counts from 0) in the same recording.
LIVE_ID_BASE = 1 << 48
_LIVE_ONLY_COLUMNS = ("alloc_id", "step", "weight")


class LiveTraces:
    """CUDA history drained from running processes, converted across drains. Keep one per
    recording: its FrameInterner stores each chain once (ids from `first_id`), and its
    TraceConverter per (pid, device) lets an unmap find the pieces mapped in earlier drains."""

    def __init__(self, first_id: int = LIVE_ID_BASE):
        self.interner = FrameInterner(first_stack_id=first_id, first_frame_id=first_id)
        self.converters: dict[tuple[int, int], TraceConverter] = {}
        self.labels: set[str] = set()

    def tables(self, entries: list[tuple[int, int, dict]], to_ns: ToNs) -> tuple[dict, dict, dict]:
        """(events, stacks, frames) columns for (device, pid, entry) triples in drain order.
        Events carry every column but `seq` (tid 0); unreadable entries are skipped and
        counted in `unreadable`. `to_ns` may change between drains (newer clock anchors)."""
        groups: dict[tuple[int, int], list[dict]] = {}
        for device, pid, entry in entries:
            groups.setdefault((int(pid), int(device)), []).append(entry)
        events: dict[str, list] = {key: [] for key in (*_ROW_KEYS, "pid", "tid", *_LIVE_ONLY_COLUMNS)}
        for (pid, device), group in groups.items():
            converter = self.converters.get((pid, device))
            if converter is None:
                converter = TraceConverter(device, to_ns, self.interner, labels=self.labels)
                self.converters[(pid, device)] = converter
            converter.to_ns = to_ns
            columns = converter.rows(group, f"pid {pid} cuda:{device}", strict=False).events(pid=pid)
            for key in events:
                events[key].extend(columns.get(key) or [None] * len(columns["ts_ns"]))
        stacks, frames = self.interner.drain_tables()
        return events, stacks, frames

    @property
    def unreadable(self) -> int:
        return sum(c.unreadable for c in self.converters.values())


def agent_trace_tables(entries: list[tuple[int, int, dict]], to_ns: ToNs,
                       state: LiveTraces | None = None) -> tuple[dict, dict, dict]:
    """(events, stacks, frames) columns for CUDA history entries drained by the torch agent,
    as (device, pid, entry) triples; see LiveTraces.tables. Pass the recording's one
    `state` to every call: without it each call starts a fresh LiveTraces, whose stack ids
    would repeat those of the previous call."""
    return (state or LiveTraces()).tables(entries, to_ns)


def _u64(entry: dict, key: str, where: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64:
        raise BadInputError(f"{where}: {key} is {short_repr(value)}, not an address", _HINT)
    return value


def _size(entry: dict, where: str, key: str = "size") -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise BadInputError(f"{where}: {key} is {short_repr(value)}, not a byte count", _HINT)
    return value


def is_time_us(value: Any) -> bool:
    """Whether `value` is a time these files can hold: epoch µs, a finite int or float in
    [0, MAX_TIME_US] (inf, NaN and 10^30 are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and 0 <= value <= MAX_TIME_US


def text(value: Any) -> str:
    """`value` as text for a label or name: itself when a str, else a bounded repr."""
    return value if isinstance(value, str) else short_repr(value)


def clean_frames(frames: Any) -> list[dict] | None:
    """Frames as FrameInterner reads them ({filename, line, name, kind?} with str, int or
    None values), at most MAX_STACK_DEPTH, innermost first; None when there are none. A frame
    that is not a dict becomes one named by its bounded repr."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return None
    return [_clean_frame(f) for f in frames[:MAX_STACK_DEPTH]]


def _clean_frame(frame: Any) -> dict:
    if not isinstance(frame, dict):
        return {"filename": None, "line": None, "name": text(frame)}
    filename, line, kind = frame.get("filename"), frame.get("line"), frame.get("kind")
    clean = {"filename": None if filename is None else _frame_text(filename), "name": _frame_text(frame.get("name")),
             "line": line if isinstance(line, int) and not isinstance(line, bool) and 0 < line < 2**31 else None}
    if isinstance(kind, str):
        clean["kind"] = kind
    return clean


def _frame_text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return None if value is None else text(value)
