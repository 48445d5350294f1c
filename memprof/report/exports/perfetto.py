"""A native Perfetto trace (protobuf TracePacket stream) for ui.perfetto.dev: a counter track
per (layer, device) and per sampled metric under the root process, instant events for OOMs,
step marks and the user's marks (named by their label) on the thread that hit them, and the
process and thread names.

Render only: every number comes from analysis.series.ExportTimeline. Timestamps stay
CLOCK_MONOTONIC ns: every packet names that clock, and a clock snapshot makes it the trace's
own clock, so the viewer shows the recording's times unconverted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.analysis.series import CounterSeries, ExportTimeline
from memprof.errors import BadRecordingError, MemprofError
from memprof.report.exports import counters_pid, instant_title, process_names, track_name

SEQUENCE_ID = 1  # one writer: every packet is on one trusted sequence
_MONOTONIC, _BOOTTIME = 3, 6  # perfetto BuiltinClock ids
_UINT64_END = 2**64  # packet timestamps are uint64 ns
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1  # counter_value and int_value are int64


def _protos():
    """The trace protobuf classes of the `perfetto` package (imported late: other commands start without it)."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        raise MemprofError("the perfetto export needs the `perfetto` Python package",
                           "pip install perfetto (or export --format chrome-trace, which needs nothing)") from None
    return perfetto_trace_pb2


def perfetto_trace(timeline: ExportTimeline, processes: list[dict], *, root_pid: int | None) -> bytes:
    """The serialized `perfetto.protos.Trace`. `processes` are meta.processes (pid, comm, exe,
    …); `root_pid` the recorded command's process (counters hang under it)."""
    pb = _protos()
    trace = pb.Trace()
    _clock_snapshot(trace, pb, timeline.start_ns)
    uuids = _Uuids()
    names = process_names(processes)
    owner = counters_pid(root_pid, processes)
    for pid in sorted(set(names) | {owner}):
        _process_track(trace, pb, uuids.process(pid), pid, names.get(pid, "memprof"), processes)
    for series in timeline.counters:
        _counter_track(trace, pb, uuids.next(), uuids.process(owner), series)
    _instants(trace, pb, uuids, timeline.instants, names)
    return trace.SerializeToString()


class _Uuids:
    """Track uuids: small, unique, stable within one trace."""

    def __init__(self):
        self._last = 0
        self._processes: dict[int, int] = {}
        self._threads: dict[tuple[int, int], int] = {}

    def next(self) -> int:
        self._last += 1
        return self._last

    def process(self, pid: int) -> int:
        if pid not in self._processes:
            self._processes[pid] = self.next()
        return self._processes[pid]

    def thread(self, pid: int, tid: int) -> tuple[int, bool]:
        """(uuid, whether it is new)."""
        if (pid, tid) in self._threads:
            return self._threads[(pid, tid)], False
        self._threads[(pid, tid)] = self.next()
        return self._threads[(pid, tid)], True


def _packet(trace, timestamp_ns: int | None = None):
    """A new packet on the sequence, at `timestamp_ns` if given. Raises BadRecordingError for
    a time a Perfetto timestamp (uint64 ns) cannot hold."""
    packet = trace.packet.add()
    packet.trusted_packet_sequence_id = SEQUENCE_ID
    if timestamp_ns is not None:
        if not 0 <= int(timestamp_ns) < _UINT64_END:
            raise BadRecordingError(f"a time of {int(timestamp_ns)} ns cannot be written to a Perfetto trace",
                                    "the recording is damaged (times are never negative); record again")
        packet.timestamp = int(timestamp_ns)
        packet.timestamp_clock_id = _MONOTONIC
    return packet


def _clock_snapshot(trace, pb, start_ns: int) -> None:
    """Makes CLOCK_MONOTONIC the trace's clock (BOOTTIME is given the same reading: the viewer
    needs one, and nothing here is on it), and clears the sequence's incremental state."""
    packet = _packet(trace)
    packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    packet.clock_snapshot.primary_trace_clock = _MONOTONIC
    for clock_id in (_MONOTONIC, _BOOTTIME):
        packet.clock_snapshot.clocks.add(clock_id=clock_id, timestamp=max(int(start_ns), 0))


def _process_track(trace, pb, uuid: int, pid: int, name: str, processes: list[dict]) -> None:
    packet = _packet(trace)
    packet.track_descriptor.uuid = uuid
    process = packet.track_descriptor.process
    process.pid = pid
    process.process_name = name
    exe = next((p.get("exe") for p in processes if p.get("pid") == pid and p.get("exe")), None)
    if exe:
        process.cmdline.append(str(exe))


def _counter_track(trace, pb, uuid: int, parent: int, series: CounterSeries) -> None:
    packet = _packet(trace)
    descriptor = packet.track_descriptor
    descriptor.uuid, descriptor.parent_uuid = uuid, parent
    descriptor.name = track_name(series.kind, series.name, series.device)
    unit = pb.CounterDescriptor.UNIT_SIZE_BYTES if series.unit == "bytes" else pb.CounterDescriptor.UNIT_COUNT
    descriptor.counter.unit = unit
    as_int = np.issubdtype(series.values.dtype, np.integer)
    for ts, value in zip(series.times_ns.tolist(), series.values.tolist()):
        event = _packet(trace, ts).track_event
        event.type = pb.TrackEvent.TYPE_COUNTER
        event.track_uuid = uuid
        if as_int and _INT64_MIN <= value <= _INT64_MAX:
            event.counter_value = int(value)
        else:  # a float, or a uint64 count past int64: the viewer shows doubles as well
            event.double_counter_value = float(value)


def _instants(trace, pb, uuids: _Uuids, rows: pd.DataFrame, names: dict[int, str]) -> None:
    """One instant per row, on its thread's track. A thread is named as its process: a Linux
    thread starts with its creator's comm, and no thread names are recorded."""
    for row in rows.itertuples(index=False):
        uuid, new = uuids.thread(int(row.pid), int(row.tid))
        if new:
            descriptor = _packet(trace).track_descriptor
            descriptor.uuid = uuid
            descriptor.thread.pid, descriptor.thread.tid = int(row.pid), int(row.tid)
            descriptor.thread.thread_name = names.get(int(row.pid), f"pid {int(row.pid)}")
        event = _packet(trace, int(row.ts_ns)).track_event
        event.type = pb.TrackEvent.TYPE_INSTANT
        event.track_uuid = uuid
        event.name = instant_title(row.kind, row.step, row.label)
        event.categories.append("memprof")
        _annotate(event, row)


def _annotate(event, row) -> None:
    """The OOM's layer, device and size as debug annotations (shown in the event's details)."""
    if row.kind != "oom":
        return
    for key in ("layer", "device"):
        value = getattr(row, key)
        if isinstance(value, str):
            event.debug_annotations.add(name=key, string_value=value)
    if not pd.isna(row.size_bytes) and _INT64_MIN <= int(row.size_bytes) <= _INT64_MAX:
        event.debug_annotations.add(name="size_bytes", int_value=int(row.size_bytes))
