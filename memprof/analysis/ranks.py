"""Ranks: the processes of a distributed job (torchrun, Slurm, MPI), each process's rank as
its agent read it from the launcher's variables, and per rank its memory: peak, end, growth
per step, and whether it differs from the other ranks' (the one leaking rank in eight).

Pure functions over the recording's metadata, lifetimes and timeline; no I/O. Times are
CLOCK_MONOTONIC ns, sizes bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.checkpoints import process_step_marks
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of
from memprof.analysis.trend import theil_sen
from memprof.model.meta import RecordingMeta
from memprof.model.schema import Layer
from memprof.units import format_bytes

# The layer a rank is judged on: the first of these its processes allocated in (the tensors
# of a GPU job, else of a CPU one, else the C heap).
RANK_LAYERS = (Layer.CUDA_BLOCK.value, Layer.TORCH_CPU.value, Layer.NATIVE_HEAP.value)
# A rank diverges when its growth per step is at least DIVERGE_GROWTH_BYTES_PER_STEP and
# DIVERGE_FACTOR times the median of the others', or its peak is DIVERGE_FACTOR times theirs.
DIVERGE_GROWTH_BYTES_PER_STEP = 64 * 1024
DIVERGE_FACTOR = 2.0
MIN_STEPS = 3  # checkpoints a growth per step needs


@dataclass(frozen=True)
class RankUse:
    """One rank's processes (`pids`, on `host`) in `layer`: the peak and end of their live
    bytes together, their growth per step (Theil–Sen over the step marks of those processes;
    None with fewer than MIN_STEPS) over `steps` marks, and `diverges`: why it differs from
    the other ranks (None: it does not)."""

    rank: int
    host: str | None
    pids: tuple[int, ...]
    layer: str
    peak_bytes: int
    end_bytes: int
    growth_bytes_per_step: float | None
    steps: int
    diverges: str | None = None


@dataclass
class RankReport:
    """Every rank seen, by rank (then host); `world_size` as the launcher said (None: not
    said); `layer` the one judged (None: no rank allocated in RANK_LAYERS); `notes` what
    could not be told."""

    ranks: list[RankUse]
    world_size: int | None = None
    layer: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def diverging(self) -> list[RankUse]:
        return [rank for rank in self.ranks if rank.diverges]


def process_ranks(meta: RecordingMeta) -> dict[int, dict[str, Any]]:
    """pid -> what its agent said of its place in the job (rank, local_rank, world_size,
    node_rank, job_id, rank_from, host), for the processes that had a rank."""
    stats = meta.sources.get("agent")
    processes = ((stats.detail or {}).get("processes") or {}) if stats else {}
    ranks = {}
    for pid, info in processes.items():
        if isinstance(info, dict) and type(info.get("rank")) is int and str(pid).isdigit():
            ranks[int(pid)] = info
    return ranks


def rank_of_pid(meta: RecordingMeta) -> dict[int, tuple[int, str | None]]:
    """pid -> (rank, host) of each process that had a rank (process_ranks): the form
    leaks.find_leaks and the job read them in."""
    return {pid: (info["rank"], info.get("host")) for pid, info in process_ranks(meta).items()}


def rank_labels(meta: RecordingMeta, pids: np.ndarray) -> np.ndarray:
    """Per pid of `pids`, "rank N" (with "@host" when the job's ranks ran on several hosts),
    or "no rank" for a process without one (the launcher, a tool it ran)."""
    ranks = process_ranks(meta)
    hosts = {info.get("host") for info in ranks.values()}
    names = {pid: f"rank {info['rank']}" + (f"@{info.get('host')}" if len(hosts) > 1 else "")
             for pid, info in ranks.items()}
    unique, inverse = np.unique(np.asarray(pids, dtype=np.int64), return_inverse=True)  # one per allocation: 10^7
    return np.array([names.get(int(pid), "no rank") for pid in unique], dtype=object)[inverse]


def rank_report(meta: RecordingMeta, lifetimes: Lifetimes, events: pd.DataFrame, end_ns: int) -> RankReport:
    """Per rank: peak, end (at `end_ns`) and growth per step of its processes' live bytes in
    the judged layer, and which ranks diverge (module constants)."""
    ranks = process_ranks(meta)
    if not ranks:
        return RankReport([], notes=["no process of this recording had a rank (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK…)"])
    allocations = lifetimes.allocations
    layer = _judged_layer(allocations, set(ranks))
    if layer is None:
        return RankReport([], _world_size(ranks), None, [f"no rank allocated in {', '.join(RANK_LAYERS)}"])
    mine = allocations[_layer_mask(allocations, layer)]
    by_rank: dict[tuple[int, str | None], list[int]] = {}
    for pid, info in ranks.items():
        by_rank.setdefault((info["rank"], info.get("host")), []).append(pid)
    marks = process_step_marks(events)
    used = [_rank_use(rank, host, sorted(pids), layer, mine, marks, end_ns)
            for (rank, host), pids in sorted(by_rank.items(), key=lambda item: (item[0][0], str(item[0][1])))]
    return RankReport(with_divergence(used), _world_size(ranks), layer)


def _world_size(ranks: Mapping[int, dict]) -> int | None:
    sizes = {info.get("world_size") for info in ranks.values() if type(info.get("world_size")) is int}
    return sizes.pop() if len(sizes) == 1 else None


def _layer_mask(allocations: pd.DataFrame, layer: str) -> np.ndarray:
    codes, names = category_codes(allocations["layer"])
    wanted = [i for i, name in enumerate(names) if label_of(name) == layer]
    return np.isin(codes, wanted)


def _judged_layer(allocations: pd.DataFrame, pids: set[int]) -> str | None:
    of_ranks = allocations["pid"].isin(list(pids)).to_numpy()
    for layer in RANK_LAYERS:
        if (of_ranks & _layer_mask(allocations, layer)).any():
            return layer
    return None


def _rank_use(rank: int, host: str | None, pids: list[int], layer: str, allocations: pd.DataFrame,
              marks: pd.DataFrame, end_ns: int) -> RankUse:
    rows = allocations[allocations["pid"].isin(pids).to_numpy()]
    size = np.rint(rows["size_bytes"].to_numpy(dtype=float, na_value=0) * rows["weight"].to_numpy(dtype=float))
    times, live = live_curve(rows["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(rows), size.astype(np.int64))
    steps = _step_times(marks, pids)
    at_steps = _live_at(times, live, steps)
    growth = float(theil_sen(at_steps[None, :])[0]) if len(steps) >= MIN_STEPS else None
    return RankUse(rank=rank, host=host, pids=tuple(pids), layer=layer,
                   peak_bytes=int(live.max()) if len(live) else 0,
                   end_bytes=int(_live_at(times, live, np.array([end_ns]))[0]),
                   growth_bytes_per_step=growth, steps=len(steps))


def _step_times(marks: pd.DataFrame, pids: list[int]) -> np.ndarray:
    """The ts_ns of the step marks these processes made (`marks`: checkpoints.process_step_marks),
    each step once (its earliest)."""
    mine = marks[marks["pid"].isin(pids).to_numpy()]
    return mine.groupby("step", sort=True)["ts_ns"].min().to_numpy(dtype=np.int64)


def _live_at(times: np.ndarray, live: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Live bytes just after each time of `at` (0 before the first change)."""
    index = np.searchsorted(times, at, side="right") - 1
    return np.where(index >= 0, live[np.maximum(index, 0)] if len(live) else 0, 0).astype(float)


def with_divergence(used: list[RankUse]) -> list[RankUse]:
    """Each rank with `diverges` set where its growth or peak stands out from the median of
    the other ranks' (module constants). Needs at least three ranks: of two, neither is the odd one."""
    if len(used) < 3:
        return used
    return [_judged(rank, [other for other in used if other is not rank]) for rank in used]


def _judged(rank: RankUse, others: list[RankUse]) -> RankUse:
    growths = [o.growth_bytes_per_step for o in others if o.growth_bytes_per_step is not None]
    if rank.growth_bytes_per_step is not None and growths:
        usual = float(np.median(growths))
        if (rank.growth_bytes_per_step >= DIVERGE_GROWTH_BYTES_PER_STEP
                and rank.growth_bytes_per_step >= DIVERGE_FACTOR * max(usual, 0.0)):
            return replace(rank, diverges=f"grows {format_bytes(rank.growth_bytes_per_step)} per step where the other "
                                          f"ranks' median is {format_bytes(max(usual, 0.0))}")
    usual_peak = float(np.median([o.peak_bytes for o in others]))
    if usual_peak > 0 and rank.peak_bytes >= DIVERGE_FACTOR * usual_peak:
        return replace(rank, diverges=f"peaks at {format_bytes(rank.peak_bytes)} where the other ranks' median is "
                                      f"{format_bytes(int(usual_peak))}")
    return rank
