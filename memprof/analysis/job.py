"""A job of several recordings (one `memprof record` per machine) read as one: per host and
per rank its memory, the ranks that differ from the others across the whole job, one leak
list with the host and ranks on each finding, and one clock (CLOCK_REALTIME) where every
recording's clock anchors allow it, with how far it can be trusted.

Built in two steps so that a job of many recordings is read in bounded memory:
`recording_part` keeps the small results of one analysed recording (its ranks, its leak
findings, its clock), and `job_report` joins the parts. Pure functions; no I/O. Times are
CLOCK_MONOTONIC ns of each recording's host unless named `realtime` (CLOCK_REALTIME ns, Unix
epoch), sizes bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.lifetimes import Lifetimes, category_codes, label_of
from memprof.analysis.ranks import RankReport, RankUse, rank_of_pid, with_divergence
from memprof.model.meta import RecordingMeta

# Within one recording, CLOCK_REALTIME − CLOCK_MONOTONIC moves only as NTP slews the clock
# (microseconds a second at most); more than this between anchors means the wall clock was
# stepped while recording, and times mapped through it may be off by that much.
CLOCK_STEP_NS = 100_000_000


@dataclass(frozen=True)
class RecordingClock:
    """How one recording's times map onto CLOCK_REALTIME: `offset_ns` (realtime − monotonic,
    the median over its `anchors` clock anchors; None without any), `spread_ns` (the largest
    minus the smallest of those offsets: how far the host's wall clock moved against its
    monotonic clock while recording), and the recording's start and end on the wall clock."""

    path: str
    host: str
    clock: str
    anchors: int
    offset_ns: int | None
    spread_ns: int | None
    start_realtime_ns: int | None
    end_realtime_ns: int | None


@dataclass(frozen=True)
class JobClock:
    """The job's one clock. `aligned`: every recording's times map onto CLOCK_REALTIME (else
    `why` says which cannot); `skew_ns`: the largest anchor spread of any recording, the
    uncertainty memprof can see (the hosts' own wall-clock error against each other, NTP's or
    PTP's, it cannot); `overlap_ns`: how long all recordings ran at once on that clock (0: they
    did not overlap)."""

    aligned: bool
    recordings: list[RecordingClock]
    skew_ns: int | None = None
    start_realtime_ns: int | None = None
    end_realtime_ns: int | None = None
    overlap_ns: int | None = None
    why: str | None = None


@dataclass(frozen=True)
class JobLeak:
    """One leak finding of one recording, tagged: the `host` that recorded it, the `ranks` and
    `pids` whose processes made the chain's allocations (empty ranks: processes without one),
    and the finding's kind, layer, bytes and chain frames (innermost first). `unit`: what
    growth was judged over in its recording, "step" or "window" (leaks.LeakResult's
    checkpoints), the unit of `slope_bytes_per_step`."""

    host: str
    path: str
    ranks: tuple[int, ...]
    pids: tuple[int, ...]
    kind: str
    layer: str
    live_bytes: int
    live_count: int
    slope_bytes_per_step: float | None
    stack_id: int | None
    chain: tuple = ()
    unit: str = "step"


@dataclass
class RecordingPart:
    """The small results kept of one recording of the job."""

    path: str
    host: str
    ranks: RankReport
    leaks: list[JobLeak]
    clock: RecordingClock
    events: int = 0


@dataclass(frozen=True)
class HostUse:
    """One host of the job: its recordings, its ranks, the largest peak of any of its ranks,
    its ranks' end bytes added up (each rank at its own end), and its leak findings."""

    host: str
    recordings: int
    ranks: tuple[int, ...]
    largest_rank_peak_bytes: int
    ranks_end_bytes: int
    leaks: int
    leak_bytes: int


@dataclass
class JobReport:
    """A job: its `hosts`, its `ranks` (every recording's, by rank then host; `diverges` judged
    across the whole job in `layer`), `leaks` (every recording's findings, biggest first), the
    job's `clock`, and `notes` of what could not be told."""

    recordings: list[str]
    hosts: list[HostUse]
    ranks: list[RankUse]
    layer: str | None
    world_size: int | None
    clock: JobClock
    leaks: list[JobLeak]
    notes: list[str] = field(default_factory=list)

    @property
    def diverging(self) -> list[RankUse]:
        return [rank for rank in self.ranks if rank.diverges]


def host_of(meta: RecordingMeta, path: str) -> str:
    """The host a recording stands for: meta.host (`record --host-label`, else the machine's
    name), or the recording's folder name when it has none."""
    return meta.host or path.rstrip("/").rsplit("/", 1)[-1]


def recording_clock(meta: RecordingMeta, path: str) -> RecordingClock:
    """How `meta`'s times map onto CLOCK_REALTIME (an imported recording is on it already)."""
    host = host_of(meta, path)
    end = meta.end_ns if meta.end_ns is not None else meta.flushed_to_ns
    if meta.clock == "CLOCK_REALTIME":
        return RecordingClock(path, host, meta.clock, 0, 0, 0, int(meta.start_ns), None if end is None else int(end))
    offsets = np.array([a.realtime_ns - a.monotonic_ns for a in meta.clock_anchors], dtype=np.int64)
    if meta.clock != "CLOCK_MONOTONIC" or not len(offsets):
        return RecordingClock(path, host, meta.clock, len(offsets), None, None, None, None)
    times = to_realtime(meta, np.array([meta.start_ns] + ([end] if end is not None else []), dtype=np.int64))
    return RecordingClock(path, host, meta.clock, len(offsets), _median(offsets),
                          int(offsets.max() - offsets.min()), int(times[0]),
                          int(times[1]) if end is not None else None)


def _median(values: np.ndarray) -> int:
    """The median of int64 ns, in integers: epoch ns (~1.8e18) lose their last digits as floats."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    return int(ordered[middle]) if len(ordered) % 2 else (int(ordered[middle - 1]) + int(ordered[middle])) // 2


def to_realtime(meta: RecordingMeta, ts_ns: np.ndarray) -> np.ndarray:
    """`ts_ns` (CLOCK_MONOTONIC ns of the recording's host) on CLOCK_REALTIME: the offset of
    the clock anchors, interpolated between them and held beyond the first and last. Needs
    at least one anchor (recording_clock tells)."""
    anchors = sorted(meta.clock_anchors, key=lambda a: a.monotonic_ns)
    base = anchors[0].realtime_ns - anchors[0].monotonic_ns  # interpolate what differs from it: floats keep ns
    at = np.array([a.monotonic_ns for a in anchors], dtype=float)
    offsets = np.array([a.realtime_ns - a.monotonic_ns - base for a in anchors], dtype=float)
    ts_ns = np.asarray(ts_ns, dtype=np.int64)
    return ts_ns + base + np.rint(np.interp(ts_ns.astype(float), at, offsets)).astype(np.int64)


def recording_part(meta: RecordingMeta, path: str, ranks: RankReport, findings: Iterable, chains: dict,
                   lifetimes: Lifetimes, canonical: dict[int, int], events: int = 0,
                   unit: str = "step") -> RecordingPart:
    """What the job keeps of one analysed recording: its ranks (each on this recording's host),
    its leak `findings` (leaks.LeakFinding) tagged with the host and the ranks whose processes
    made each chain's allocations, `chains` (stack id -> frames) for their frames, and its clock.
    `unit`: what the findings' growth was judged over ("step" or "window")."""
    host = host_of(meta, path)
    ranks_of = {pid: rank for pid, (rank, _) in rank_of_pid(meta).items()}
    findings = list(findings)
    made_by = chain_pids(lifetimes, canonical, [(finding.layer, finding.stack_id) for finding in findings])
    tagged = [replace(_tagged(finding, host, path, ranks_of, made_by[(finding.layer, finding.stack_id)], chains),
                      unit=unit) for finding in findings]
    own = RankReport([replace(rank, host=host, diverges=None) for rank in ranks.ranks], ranks.world_size,
                     ranks.layer, list(ranks.notes))
    return RecordingPart(path, host, own, tagged, recording_clock(meta, path), events)


def _tagged(finding, host: str, path: str, rank_of_pid: dict[int, int], pids: tuple[int, ...],
            chains: dict) -> JobLeak:
    # The finding's own ranks (leaks.py: the processes whose allocations it counts) where it
    # has them; else every rank that allocated on the chain.
    ranks = tuple(finding.ranks) or tuple(sorted({rank_of_pid[pid] for pid in pids if pid in rank_of_pid}))
    return JobLeak(host=host, path=path, ranks=ranks, pids=pids, kind=finding.kind, layer=finding.layer,
                   live_bytes=int(finding.live_bytes), live_count=int(finding.live_count),
                   slope_bytes_per_step=finding.slope_bytes_per_step, stack_id=finding.stack_id,
                   chain=tuple(chains.get(finding.stack_id, ())))


def chain_pids(lifetimes: Lifetimes, canonical: dict[int, int],
               wanted: Sequence[tuple[str, int | None]]) -> dict[tuple[str, int | None], tuple[int, ...]]:
    """Per (layer, stack_id) of `wanted` (stack_id a canonical id; None: the allocations
    recorded without a stack), the pids that made allocations of that layer on that chain,
    ascending. One pass over the allocations for all of them, in numpy: a recording's
    findings are many and its allocations millions."""
    allocations = with_canonical_stacks(lifetimes.allocations, canonical)
    stacks = allocations["stack_id"].to_numpy(dtype=np.int64, na_value=-1)  # -1: no stack
    wanted_stacks = np.array([-1 if stack is None else stack for _, stack in wanted], dtype=np.int64)
    rows = np.flatnonzero(np.isin(stacks, wanted_stacks))
    codes, names = category_codes(allocations["layer"])
    made = pd.DataFrame({"layer": codes[rows], "stack": stacks[rows],
                         "pid": allocations["pid"].to_numpy()[rows]}).drop_duplicates()
    labels = [label_of(name) for name in names]
    pids: dict[tuple[str, int], set[int]] = {}
    for code, stack, pid in made.itertuples(index=False):
        if code >= 0:
            pids.setdefault((labels[code], int(stack)), set()).add(int(pid))
    return {(layer, stack): tuple(sorted(pids.get((layer, -1 if stack is None else stack), ())))
            for layer, stack in wanted}


def job_report(parts: Sequence[RecordingPart]) -> JobReport:
    """The parts (one per recording) as one job: ranks judged against every other rank of
    the job (ranks.with_divergence), in the layer most of the recordings judged theirs in."""
    ranks = [rank for part in parts for rank in part.ranks.ranks]
    layers = [part.ranks.layer for part in parts if part.ranks.layer]
    layer = max(sorted(set(layers)), key=layers.count) if layers else None
    notes = []
    if len(set(layers)) > 1:
        notes.append(f"the recordings' ranks allocated in different layers ({', '.join(sorted(set(layers)))}): "
                     f"ranks are compared in {layer} only")
    judged = with_divergence([rank for rank in ranks if rank.layer == layer])
    others = [rank for rank in ranks if rank.layer != layer]
    ranks = sorted(judged + others, key=lambda r: (r.rank, str(r.host)))
    if not ranks:
        notes.append("no process of these recordings had a rank (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK…)")
    seen: dict[tuple[int, str | None], int] = {}
    for rank in ranks:
        seen[(rank.rank, rank.host)] = seen.get((rank.rank, rank.host), 0) + 1
    notes += [f"rank {rank} on {host} is in {count} recordings" for (rank, host), count in seen.items() if count > 1]
    sizes = {part.ranks.world_size for part in parts if part.ranks.world_size is not None}
    if len(sizes) > 1:
        notes.append(f"the recordings disagree on the world size ({', '.join(map(str, sorted(sizes)))})")
    leaks = sorted((leak for part in parts for leak in part.leaks), key=lambda leak: (-leak.live_bytes, leak.host))
    return JobReport(recordings=[part.path for part in parts], hosts=_hosts(parts, ranks, leaks), ranks=ranks,
                     layer=layer, world_size=sizes.pop() if len(sizes) == 1 else None,
                     clock=job_clock([part.clock for part in parts]), leaks=leaks, notes=notes)


def _hosts(parts: Sequence[RecordingPart], ranks: list[RankUse], leaks: list[JobLeak]) -> list[HostUse]:
    rows = []
    for host in sorted({part.host for part in parts}):
        mine = [rank for rank in ranks if rank.host == host]
        held = [leak for leak in leaks if leak.host == host]
        rows.append(HostUse(host=host, recordings=sum(part.host == host for part in parts),
                            ranks=tuple(sorted(rank.rank for rank in mine)),
                            largest_rank_peak_bytes=max((rank.peak_bytes for rank in mine), default=0),
                            ranks_end_bytes=sum(rank.end_bytes for rank in mine),
                            leaks=len(held), leak_bytes=sum(leak.live_bytes for leak in held)))
    return rows


def job_clock(clocks: list[RecordingClock]) -> JobClock:
    """One clock for the job when every recording maps onto CLOCK_REALTIME; its skew (the
    largest anchor spread) and how long the recordings overlapped."""
    unmapped = [c for c in clocks if c.offset_ns is None or c.start_realtime_ns is None]
    if unmapped:
        names = ", ".join(f"{c.host} ({c.path})" for c in unmapped)
        return JobClock(False, clocks, why=f"no clock anchors to map onto CLOCK_REALTIME in {names}")
    starts = [c.start_realtime_ns for c in clocks]
    ends = [c.end_realtime_ns if c.end_realtime_ns is not None else c.start_realtime_ns for c in clocks]
    skew = max(c.spread_ns for c in clocks)
    why = None
    if skew > CLOCK_STEP_NS:
        stepped = ", ".join(c.host for c in clocks if c.spread_ns > CLOCK_STEP_NS)
        why = f"the wall clock moved by up to {skew / 1e6:.0f} ms against the monotonic clock while recording on {stepped}"
    return JobClock(True, clocks, skew_ns=int(skew), start_realtime_ns=int(min(starts)), end_realtime_ns=int(max(ends)),
                    overlap_ns=int(max(0, min(ends) - max(starts))), why=why)
