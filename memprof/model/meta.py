"""Recording metadata (`meta.json`): what was recorded, how, and what was lost."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Bump when a reader of the previous version could misread a recording of the new one.
FORMAT_VERSION = 1
# A recording whose events were folded (record --max-size) says 2: a memprof that reads only
# 1 would miss its folded parts (part-N-f.parquet), so it must refuse it, not misread it.
FOLDED_FORMAT_VERSION = 2
KNOWN_FORMAT_VERSIONS = (1, 2)

# --- meta.json's schema (JSON Schema 2020-12), checked by the reader before anything uses it ---
_INT64 = {"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_PID = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_TEXT = {"type": "string"}
# Null or `schema` (a type list, not anyOf: anyOf is many times slower to check).
_OPTIONAL = lambda schema: {**schema, "type": [schema["type"], "null"]}  # noqa: E731
_OBJECT = {"type": "object"}
_SOURCE_SCHEMA = {
    "type": "object",
    "properties": {
        "enabled": {"type": "boolean"}, "events": _COUNT, "lost": _COUNT,
        "missed": {"type": "object", "additionalProperties": _COUNT},
        "stack_sample_every": {**_COUNT, "minimum": 1}, "timestamp_precision_ns": {**_COUNT, "minimum": 1},
        # The keys of `detail` that reports read (memprof/analysis/loss.py, gpu.py); the rest is free.
        "detail": {"type": "object", "properties": {
            "stack_failures": _OPTIONAL(_COUNT), "site_cache_full": _OPTIONAL(_COUNT),
            "page_stack_sample_every": {**_COUNT, "minimum": 1}, "user_stack_sample_every": {**_COUNT, "minimum": 1},
            "uprobes": _OPTIONAL({"type": "object", "additionalProperties": {
                "type": "object", "properties": {"refused": _OPTIONAL({"type": "object",
                                                                       "additionalProperties": _TEXT}),
                                                 "layer": _TEXT, "mapped_ns": _OPTIONAL(_INT64),
                                                 "placed_ns": _OPTIONAL(_INT64)}}}),
            "python": _OPTIONAL({"type": "object", "properties": {
                "enabled": {"type": "boolean"}, "stacks_evicted": _OPTIONAL(_COUNT), "map_full": _OPTIONAL(_COUNT),
                "interpreters": _OPTIONAL({"type": "object", "additionalProperties": _OBJECT})}}),
            "nvml": _OPTIONAL(_OBJECT),
        }},
    },
}
META_SCHEMA = {
    "type": "object",
    "required": ["format_version"],
    "properties": {
        "format_version": {"type": "integer"},
        "memprof_version": _TEXT,
        "status": {"enum": ["recording", "complete"]},
        "command": _OPTIONAL({"type": "array", "items": _TEXT}),
        "pid": _OPTIONAL(_PID),
        "host": _TEXT, "kernel": _TEXT, "clock": _TEXT,
        "start_ns": _INT64, "end_ns": _OPTIONAL(_INT64), "exit_status": _OPTIONAL(_INT64),
        "clock_anchors": {"type": "array", "items": {
            "type": "object", "required": ["monotonic_ns", "realtime_ns"], "additionalProperties": False,
            "properties": {"monotonic_ns": _INT64, "realtime_ns": _INT64}}},
        "sources": {"type": "object", "additionalProperties": _SOURCE_SCHEMA},
        "notes": {"type": "array", "items": _TEXT},
        "folds": {"type": "array", "items": {"type": "object", "properties": {
            name: _INT64 for name in ("n", "at_ns", "took_ns", "through_ns", "window_ns", "events_before", "events_after",
                                      "folded_allocations", "protected_allocations",
                                      "unmatched_frees_dropped")}}},
        # Their fields: ROW_FIELDS below.
        "processes": {"type": "array", "items": _OBJECT},
        "exits": {"type": "array", "items": _OBJECT},
    },
}
# The fields of each row of `processes` and `exits`: null, or (type, lowest, highest). Checked
# by `row_field_error`, not by the schema: a recording of a build holds 10^5 processes, and
# jsonschema takes some 30 µs a row.
_TEXT_FIELD = (str, None, None)
_PID_FIELD, _NS_FIELD = (int, 0, 2**31 - 1), (int, -2**63, 2**63 - 1)
ROW_FIELDS = {
    "processes": {"pid": _PID_FIELD, "ppid": _PID_FIELD, "comm": _TEXT_FIELD, "exe": _TEXT_FIELD,
                  "start_ns": _NS_FIELD, "exit_ns": _NS_FIELD},
    "exits": {"pid": _PID_FIELD, "ts_ns": _NS_FIELD, "reason": _TEXT_FIELD},
}
# Beyond the schema, anywhere in meta.json (free-form `detail` included): at most this deep,
# and every integer an int64 (what every column and export holds).
MAX_META_DEPTH = 32


def row_field_error(data: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what is wrong) for the first field of a `processes` or `exits` row of parsed
    meta.json `data` that is neither null nor of its ROW_FIELDS type and range; None if
    there is none (rows that are not objects are the schema's to report)."""
    for key, fields in ROW_FIELDS.items():
        rows = data.get(key)
        for i, row in enumerate(rows if isinstance(rows, list) else ()):
            for name, (kind, lowest, highest) in fields.items():
                value = row.get(name) if isinstance(row, dict) else None
                if value is None or _fits(value, kind, lowest, highest):
                    continue
                what = "text" if kind is str else f"an integer from {lowest} to {highest}"
                return f"{key}[{i}].{name}", f"{repr(value)[:60]} is not {what}"
    return None


def _fits(value: Any, kind: type, lowest: int | None, highest: int | None) -> bool:
    if kind is str:
        return isinstance(value, str)
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value <= highest


@dataclass
class ClockAnchor:
    """One simultaneous reading of CLOCK_MONOTONIC and CLOCK_REALTIME, in ns."""

    monotonic_ns: int
    realtime_ns: int


@dataclass
class SourceStats:
    """Per-source accounting, shown by every report. Loss is data, not an error.

    `lost` counts events the kernel dropped (ring buffer full); `missed` counts, per free
    tracepoint, frees the kernel skipped before our program ran (BPF recursion protection:
    frees in a softirq while the program runs on that CPU) that no backup program saw
    (recordings made before 2026-12-06 list allocation tracepoints too, whose skips were never
    the target's: analysis/loss.py, skipped_frees); `stack_sample_every` is 1 when every allocation has its own
    stack, N when one in N does and the others inherit their call site's latest stack.
    """

    enabled: bool = True
    events: int = 0
    lost: int = 0
    missed: dict[str, int] = field(default_factory=dict)
    stack_sample_every: int = 1
    timestamp_precision_ns: int = 1
    detail: dict[str, Any] = field(default_factory=dict)


# The least time between two clock anchors a recording keeps, but its last (note_clock_anchor).
CLOCK_ANCHOR_SPACING_NS = 30_000_000_000


@dataclass
class RecordingMeta:
    """Everything about a recording except its tables. Times are ns on `clock`."""

    format_version: int = FORMAT_VERSION
    memprof_version: str = ""
    status: str = "recording"  # "recording" until finalized, then "complete"
    command: list[str] | None = None
    pid: int | None = None
    host: str = ""
    kernel: str = ""
    clock: str = "CLOCK_MONOTONIC"
    start_ns: int = 0
    end_ns: int | None = None
    exit_status: int | None = None
    clock_anchors: list[ClockAnchor] = field(default_factory=list)
    sources: dict[str, SourceStats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The target's processes: pid, ppid, comm, exe, start_ns, exit_ns (ns on `clock`).
    processes: list[dict[str, Any]] = field(default_factory=list)
    # When each process began to exit and why: pid, ts_ns, reason ("exit_group",
    # "signal N", "python finalize"). The first one of the root process is "the end".
    exits: list[dict[str, Any]] = field(default_factory=list)
    # What the parts on disk hold, rewritten with meta.json at every flush: rows per table,
    # and the time (ns on `clock`) at which the last written flush took its rows, so every
    # row on disk came in before it. A recorder killed later loses only what came after.
    flushed_rows: dict[str, int] = field(default_factory=dict)
    flushed_to_ns: int | None = None
    # What record --max-size folded (capture/compactor.py), one entry per fold, oldest first
    # (the first and the latest 255 are kept): n (its number, from 1), at_ns (when it began),
    # took_ns (reading and folding, not writing), through_ns (the latest event time folded:
    # events up to it lie in the folded part), window_ns (the fold window), events_before and
    # events_after (rows of the parts folded, and of the folded part), folded_allocations
    # (allocations folded with their frees), protected_allocations (kept for being live at a
    # peak), unmatched_frees_dropped (frees of allocations never seen: analysis/compaction.py).
    # Empty: nothing was folded.
    folds: list[dict[str, Any]] = field(default_factory=list)
    # The recorder's own CPU time (all its threads, user and system; not the command's), in
    # ns: "before" from its start to its recording loop (the command runs from about then),
    # "during" until it saw the tree exit, "after" from then to the end (where it stopped for
    # another reason, --duration or a signal, "during" runs to the end and there is no "after").
    # What memprof itself costs the machine, beside what its probes cost the command.
    recorder_cpu_ns: dict[str, int] = field(default_factory=dict)
    # The recorder's own peak resident size, in bytes (VmHWM as it finalizes: its threads, not
    # the command, nor the children that compile a first run's program, which exit before the
    # command starts). None: unknown (a recording made before 2026-12-06, or no /proc).
    recorder_peak_rss_bytes: int | None = None
    # How the wait for the kernel's last frees after the tree's exit went
    # (capture/deferred_frees.py): rcu_barrier_began_ns and rcu_barrier_ended_ns, when the
    # rcu_barrier() asked at the exit began and returned (CLOCK_MONOTONIC), or
    # rcu_barrier_error for why it did not; exit_to_stop_s, from the kernel's stamp of the
    # exit to the end of listening. Empty where the recording stopped before the tree exited.
    teardown: dict[str, Any] = field(default_factory=dict)

    def note_clock_anchor(self, anchor: ClockAnchor) -> None:
        """Add `anchor` (taken at each flush) to `clock_anchors` at a bounded density: the last
        anchor is always the latest, and the ones before it lie CLOCK_ANCHOR_SPACING_NS apart
        or more. Kept at every flush (4 a second), a 6-hour run's 86,400 anchors made each
        rewrite of meta.json 5.9 MB and 0.35-0.39 s of the recorder's CPU, more than a
        flush's period (bench/RESULTS.md). Readers interpolate between anchors (analysis/job.py); over 30 s the kernel's
        largest slew (500 ppm) moves CLOCK_REALTIME's offset by 15 ms at most."""
        anchors = self.clock_anchors
        if len(anchors) >= 2 and anchors[-1].monotonic_ns - anchors[-2].monotonic_ns < CLOCK_ANCHOR_SPACING_NS:
            anchors[-1] = anchor  # the latest so far was too close to the one before to stay
        else:
            anchors.append(anchor)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RecordingMeta":
        """Build from parsed JSON; unknown keys are ignored (newer minor writers)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["clock_anchors"] = [ClockAnchor(**a) for a in values.get("clock_anchors", [])]
        values["sources"] = {
            name: SourceStats(**{k: v for k, v in stats.items() if k in _SOURCE_FIELDS})
            for name, stats in values.get("sources", {}).items()
        }
        return cls(**values)

    @property
    def lost_events(self) -> int:
        return sum(s.lost for s in self.sources.values())

    @property
    def missed_events(self) -> int:
        return sum(sum(s.missed.values()) for s in self.sources.values())


_SOURCE_FIELDS = {f.name for f in dataclasses.fields(SourceStats)}
