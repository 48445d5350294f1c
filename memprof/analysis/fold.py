"""Folding a recording too large to analyse whole (issue 23): its allocations are paired in
time-ordered batches (`PairingStream`), and of the allocations that ended only those are
kept that some analysis reads at a moment it judges at (`FoldPlan`): live at a checkpoint,
at a process's exit, at the target's end, at a model-state note, or at a layer's peak
(`PeakTracker`, from a first pass). What is dropped was born and gone between
two of those moments: no checkpoint, end or peak ever held it. Each layer keeps how many
allocations and bytes were dropped (`FoldTotals`), so counts stay whole.

Leaks (held at the end, grows per step), a layer's peak and end, and the chains at them come
out of the kept allocations as they come out of every allocation; curves between those
moments do not: they are drawn through the moments kept and, where asked, each stretch's
highest and lowest point, which PeakTracker finds from every event (`stretch_edges`).

Pure functions and accumulators; no I/O. Times are CLOCK_MONOTONIC ns, sizes bytes
(weighted for sampled allocations, as layers.weighted_bytes weighs them).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.layers import weighted_bytes
from memprof.analysis.lifetimes import (Lifetimes, category_codes, end_times, exec_times, label_of, pair_lifetimes,
                                        user_space_pids)
from memprof.model.frames import concat_frames
from memprof.units import format_bytes
from memprof.model.schema import EVENTS_SCHEMA, STATE_PREFIX, Action

class PairingStream:
    """pair_lifetimes over a timeline fed in time-ordered batches: `feed(batch)` returns the
    allocations that ended in it (ALLOCATION_COLUMNS), `finish()` those live at the end.
    Allocations still live, and a `free_requested` still waiting for its completing `free`,
    are carried into the next batch, so the verdicts, `missed_frees` and `unmatched_frees`
    are those of one pair_lifetimes over the whole timeline. `execs` (lifetimes.exec_times of
    the timeline's mark rows, which the batches need not hold): each exec ends what its
    process held, in the batch that reaches its time. Memory: one batch plus the live set."""

    def __init__(self, execs: Mapping[int, np.ndarray] | None = None):
        self._execs = {pid: np.asarray(times, dtype=np.int64) for pid, times in (execs or {}).items()}
        self._carried: pd.DataFrame | None = None
        self._carried_requests: Counter = Counter()  # per layer: carried free_requested rows
        self.missed_frees: Counter = Counter()
        self.unmatched_frees: Counter = Counter()

    def feed(self, batch: pd.DataFrame) -> pd.DataFrame:
        """The allocations that ended by the end of `batch` (events rows after every earlier
        batch's, in (ts_ns, seq) order), in timeline order."""
        rows = batch if self._carried is None else concat_frames([self._carried, batch])
        lifetimes = pair_lifetimes(rows, self._execs_until(rows))
        self.missed_frees.update(lifetimes.missed_frees)
        # A carried request is the first row of its key again: pair_lifetimes counts it unmatched.
        self.unmatched_frees.update(lifetimes.unmatched_frees)
        self.unmatched_frees.subtract(self._carried_requests)
        allocations = lifetimes.allocations
        ended = (allocations["end_kind"] != "live").to_numpy()
        is_alloc = (rows["action"] == Action.ALLOC.value).to_numpy()
        still_live = np.flatnonzero(is_alloc)[~ended]
        requests = _waiting_requests(rows)
        self._carried = rows.take(np.union1d(still_live, requests)).reset_index(drop=True)
        self._carried_requests = Counter(_layer_labels(rows, requests))
        return allocations[ended].reset_index(drop=True)

    def finish(self) -> pd.DataFrame:
        """The allocations live at the end of the timeline (`end_kind` "live")."""
        if self._carried is None:
            return _empty_allocations()
        lifetimes = pair_lifetimes(self._carried, self._execs)
        self.unmatched_frees.update(lifetimes.unmatched_frees)
        self.unmatched_frees.subtract(self._carried_requests)
        self._carried, self._carried_requests = None, Counter()
        return lifetimes.allocations

    def _execs_until(self, rows: pd.DataFrame) -> dict[int, np.ndarray]:
        """The execs up to the last time in `rows`, those of the rows' own mark rows with them:
        a later exec ends its allocations in a later batch, where their end falls."""
        own = exec_times(rows)
        if not self._execs:
            return own
        until = int(rows["ts_ns"].max()) if len(rows) else np.iinfo(np.int64).min
        execs = {pid: times[times <= until] for pid, times in self._execs.items()}
        for pid, times in own.items():
            execs[pid] = np.union1d(execs.get(pid, np.zeros(0, dtype=np.int64)), times)
        return {pid: times for pid, times in execs.items() if times.size}

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """(unmatched_frees, missed_frees) per layer so far, layers with none left out."""
        return ({k: v for k, v in self.unmatched_frees.items() if v > 0},
                {k: v for k, v in self.missed_frees.items() if v > 0})


def _empty_allocations() -> pd.DataFrame:
    """ALLOCATION_COLUMNS of no allocation (a recording without any)."""
    return pair_lifetimes(EVENTS_SCHEMA.empty_table().to_pandas()).allocations


def _waiting_requests(rows: pd.DataFrame) -> np.ndarray:
    """Positions of the `free_requested` rows that are the last row of their pairing key
    (layer, device, pid in a user-space layer, alloc_id-or-addr: lifetimes.py's): their
    completing `free` may come in a later batch."""
    action = rows["action"]
    is_request = (action == Action.FREE_REQUESTED.value).to_numpy()
    if not is_request.any():
        return np.zeros(0, dtype=np.int64)
    paired = np.flatnonzero(action.isin([Action.ALLOC.value, Action.FREE.value, Action.FREE_REQUESTED.value])
                            .to_numpy())
    layer_codes, layer_names = category_codes(rows["layer"])
    keys = pd.DataFrame({
        "layer": layer_codes[paired], "device": category_codes(rows["device"])[0][paired],
        "pid": user_space_pids(rows, layer_codes, layer_names)[paired],
        "has_id": rows["alloc_id"].notna().to_numpy()[paired],
        "value": np.where(rows["alloc_id"].notna().to_numpy()[paired],
                          rows["alloc_id"].to_numpy(dtype=np.int64, na_value=0)[paired].view(np.uint64),
                          rows["addr"].to_numpy().astype(np.uint64)[paired])})
    last = ~keys.duplicated(keep="last").to_numpy()
    return paired[last & is_request[paired]]


def _layer_labels(rows: pd.DataFrame, positions: np.ndarray) -> list[str]:
    codes, names = category_codes(rows["layer"])
    return [label_of(names[c]) for c in codes[positions] if c >= 0]


def live_at_any(alloc_ts: np.ndarray, end_ts: np.ndarray, instants: np.ndarray) -> np.ndarray:
    """Per allocation: live at some instant t of `instants` (sorted ascending), alloc_ts <= t
    < end_ts (end_ts as lifetimes.end_times gives it)."""
    first_at_or_after_alloc = np.searchsorted(instants, alloc_ts, side="left")
    before_end = np.searchsorted(instants, end_ts, side="left")
    return before_end > first_at_or_after_alloc


class PeakTracker:
    """Each layer's peak (all its devices together, as layers.layer_summary, `report top --at
    peak` and check judge it), and each GPU's in each layer (as `report gpu` judges it),
    exactly as layers.live_curve gives it
    (live bytes after all events at one time; the first time the highest is reached), from
    batches fed in time order: each batch's allocations add their bytes at their time, the
    allocations that ended in it (PairingStream.feed) take theirs away at their end. A batch
    must hold every event of its last time (recording.stream.paired_batches cuts between
    times). Memory: a number per layer (and rank, GPU, region), and with `stretch_edges`
    two points per stretch of each (layer, device)."""

    def __init__(self, group_of_pid: Mapping[int, Hashable] | None = None, region_bounds: np.ndarray | None = None,
                 stretch_edges: np.ndarray | None = None):
        """`group_of_pid`: processes whose peak is judged together (a distributed job's
        rank -> its processes, ranks.rank_report), tracked per (layer, "group", group) too.
        `region_bounds`: ns, ascending, where `report regions`' regions begin and, last, where
        the last one ends: region i is [bounds[i], bounds[i + 1]). Every (layer, device)'s peak
        inside each is tracked too, as (layer, "device", device, "region", i) (analysis.regions
        judges them so). `stretch_edges`: ns, ascending (a fold's instants): each (layer,
        device)'s highest and lowest point between two consecutive edges are kept too
        (`stretch_extremes`), so that a folded curve drawn through the edges keeps the spikes
        and dips between them."""
        self._level: Counter = Counter()
        self._peak: dict = {}  # key -> (bytes, ns)
        self._group_of_pid = dict(group_of_pid or {})
        self._region_bounds = None if region_bounds is None else np.asarray(region_bounds, dtype=np.int64)
        self._labels: list = []
        self._ids: dict = {}
        self._edges = None if stretch_edges is None else np.asarray(stretch_edges, dtype=np.int64)
        self._curve_level: Counter = Counter()  # (layer, device) -> live bytes, for the stretches
        self._stretch_points: dict = {}  # (layer, device) -> {stretch: ((top, ns), (bottom, ns))}

    def add(self, batch: pd.DataFrame, ended: pd.DataFrame) -> None:
        """Count in `batch` (events rows, after every earlier batch's) and `ended` (the
        allocations that ended in it)."""
        allocs = batch[(batch["action"] == Action.ALLOC.value).to_numpy()]
        layer, pid, device, ts, nbytes = (np.concatenate(pair) for pair in zip(
            self._changes(allocs, allocs["ts_ns"], +1), self._changes(ended, ended["end_ts_ns"], -1)))
        if len(ts) == 0:
            return
        if self._edges is not None:
            self._track_stretches(layer, device, ts, nbytes)
        self._track_by((layer,), ts, nbytes)
        on_gpu = self._gpu_ids()[device] if self._region_bounds is None else np.ones(len(device), dtype=bool)
        if on_gpu.any():  # each GPU's peak, which `report gpu` judges apart (analysis.gpu); every device's for regions
            self._track_by((layer[on_gpu], np.full(on_gpu.sum(), self._id("device")), device[on_gpu]),
                           ts[on_gpu], nbytes[on_gpu])
        if self._group_of_pid:
            groups = np.array([self._id(self._group_of_pid.get(p)) for p in pid.tolist()], dtype=np.int64)
            has = groups != self._id(None)
            if has.any():
                self._track_by((layer[has], np.full(has.sum(), self._id("group")), groups[has]), ts[has], nbytes[has])

    def _gpu_ids(self) -> np.ndarray:
        """Per label id: whether it names a GPU ("cuda:N", or "cuda": analysis.gpu's devices)."""
        return np.array([isinstance(label, str) and (label.startswith("cuda:") or label == "cuda")
                         for label in self._labels] + [False])

    def _id(self, label) -> int:
        """A small int standing for `label` (a layer, a device, a group), the same every batch."""
        if label not in self._ids:
            self._ids[label] = len(self._labels)
            self._labels.append(label)
        return self._ids[label]

    def _changes(self, rows: pd.DataFrame, at: pd.Series, sign: int) -> tuple[np.ndarray, ...]:
        """(layer id, pid, device id, ts, bytes) arrays of `rows` (events or allocations) at
        times `at`: their weighted bytes (layers.weighted_bytes) times `sign`."""
        size = rows["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
        weight = rows["weight"].to_numpy(dtype=float, na_value=np.nan) if "weight" in rows else np.ones(len(rows))
        weight = np.where(np.isnan(weight), 1.0, weight)
        device = self._ids_of(rows["device"]) if "device" in rows else np.full(len(rows), self._id(None))
        return (self._ids_of(rows["layer"]), rows["pid"].to_numpy(dtype=np.int64), device,
                at.to_numpy(dtype=np.int64), sign * weighted_bytes(size, weight))

    def _ids_of(self, column: pd.Series) -> np.ndarray:
        codes, names = category_codes(column)
        table = np.array([self._id(label_of(name)) for name in names] + [self._id(None)], dtype=np.int64)
        return table[codes]

    def _curves(self, columns: tuple, ts: np.ndarray, nbytes: np.ndarray, levels: Counter):
        """Per distinct combination of `columns` (label ids), keyed by their labels: (key, times,
        live bytes just after the last change of each time), from `levels[key]` on; `levels`
        is left at each key's last value (the next batch starts there)."""
        width = len(self._labels) + 1
        combined = np.zeros(len(ts), dtype=np.int64)
        for column in columns:
            combined = combined * width + column
        order = np.lexsort((ts, combined))
        combined, ts, nbytes = combined[order], ts[order], nbytes[order]
        bounds = np.flatnonzero(np.diff(combined)) + 1
        for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(combined)]):
            key = tuple(self._labels[column[order[start]]] for column in columns)
            times = ts[start:stop]
            live = levels[key] + np.cumsum(nbytes[start:stop])
            last_of_time = np.append(times[1:] != times[:-1], True)
            live, times = live[last_of_time], times[last_of_time]
            levels[key] = int(live[-1])
            yield key, times, live

    def _track_by(self, columns: tuple, ts: np.ndarray, nbytes: np.ndarray) -> None:
        """Track the peak of each distinct combination of `columns` (label ids), keyed by their
        labels (and, for (layer, "device", device), inside each region)."""
        for key, times, live in self._curves(columns, ts, nbytes, self._level):
            self._raise_peak(key, live, times)
            if self._region_bounds is not None and len(key) == 3 and key[1] == "device":
                region = np.searchsorted(self._region_bounds, times, side="right") - 1
                bounds = np.flatnonzero(np.diff(region)) + 1
                for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(region)]):
                    if 0 <= region[start] < len(self._region_bounds) - 1:
                        self._raise_peak((*key, "region", int(region[start])), live[start:stop], times[start:stop])

    def _raise_peak(self, key: tuple, live: np.ndarray, times: np.ndarray) -> None:
        """Keep `key`'s highest of `live` (at `times`, ascending), the first time reached."""
        at = int(np.argmax(live))
        if key not in self._peak or live[at] > self._peak[key][0]:
            self._peak[key] = (int(live[at]), int(times[at]))

    def _track_stretches(self, layer: np.ndarray, device: np.ndarray, ts: np.ndarray, nbytes: np.ndarray) -> None:
        """Each (layer, device)'s curve over these changes: its highest and its lowest point
        in each stretch between two edges (the first time reached), each kept where beyond
        the stretch's so far (a stretch can span batches)."""
        for key, times, live in self._curves((layer, device), ts, nbytes, self._curve_level):
            stretch = np.searchsorted(self._edges, times, side="right")
            firsts = np.r_[0, np.flatnonzero(np.diff(stretch)) + 1]
            kept = self._stretch_points.setdefault(key, {})
            for first, last in zip(firsts, np.r_[firsts[1:], len(live)]):
                here = live[first:last]
                high, low = first + int(np.argmax(here)), first + int(np.argmin(here))
                index = int(stretch[first])
                (top, top_ns), (bottom, bottom_ns) = kept.get(index, ((-np.inf, 0), (np.inf, 0)))
                if live[high] > top:
                    top, top_ns = int(live[high]), int(times[high])
                if live[low] < bottom:
                    bottom, bottom_ns = int(live[low]), int(times[low])
                kept[index] = ((top, top_ns), (bottom, bottom_ns))

    def stretch_extremes(self) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
        """(layer, device label, "" for none) -> (ns ascending, live bytes): each stretch's
        highest and lowest point between two of `stretch_edges` (empty without them)."""
        out = {}
        for (layer, device), kept in self._stretch_points.items():
            points = sorted({point[::-1] for pair in kept.values() for point in pair})  # (ns, bytes)
            out[(str(layer), "" if device is None else str(device))] = (
                np.asarray([ns for ns, _ in points], dtype=np.int64), np.asarray([b for _, b in points], dtype=np.int64))
        return out

    def times(self) -> np.ndarray:
        """When each tracked peak was first reached, ns (ascending, unique)."""
        return np.unique(np.asarray([ns for _, ns in self._peak.values()], dtype=np.int64))

    def peaks(self) -> dict[tuple, tuple[int, int]]:
        """(layer,), (layer, "device", GPU), (layer, "group", group) and, with regions,
        (layer, "device", device, "region", index) -> (peak bytes, first time reached, ns)."""
        return dict(self._peak)


_MERGE_EVERY = 16  # batches' module tallies are summed into one this often


@dataclass
class FoldTotals:
    """What a fold dropped, per layer: allocations (weighted) and their bytes."""

    dropped_count: Counter = field(default_factory=Counter)
    dropped_bytes: Counter = field(default_factory=Counter)
    _modules: list = field(default_factory=list)

    def add_dropped(self, allocations: pd.DataFrame) -> None:
        if len(allocations) == 0:
            return
        weight = allocations["weight"].to_numpy(dtype=float)
        nbytes = weighted_bytes(allocations["size_bytes"].to_numpy(dtype=float, na_value=0.0), weight)
        tally = pd.DataFrame({"layer": allocations["layer"].astype(object).to_numpy(),
                              "pid": allocations["pid"].to_numpy(dtype=np.int64),
                              "stack_id": allocations["stack_id"].to_numpy(dtype=np.int64, na_value=-1),
                              "module": allocations["module"].astype(object).to_numpy(),
                              "count": 1, "n": weight, "bytes": nbytes})
        self._modules.append(_summed_tally(tally))
        if len(self._modules) >= _MERGE_EVERY:  # one tally per batch would grow with the recording
            self._modules = [self.modules()]
        frame = pd.DataFrame({"layer": allocations["layer"].astype(object), "n": weight, "bytes": nbytes})
        for layer, row in frame.groupby("layer").sum().iterrows():
            self.dropped_count[label_of(layer)] += int(round(row["n"]))
            self.dropped_bytes[label_of(layer)] += int(row["bytes"])


    def modules(self) -> pd.DataFrame | None:
        """The dropped allocations by (layer, pid, stack_id, module): rows (`count`), weighted
        allocations (`n`) and bytes (Lifetimes.folded_modules)."""
        if not self._modules:
            return None
        return _summed_tally(pd.concat(self._modules, ignore_index=True))


def _summed_tally(tally: pd.DataFrame) -> pd.DataFrame:
    """`count`, `n` and `bytes` summed per (layer, pid, stack_id, module)."""
    return tally.groupby(["layer", "pid", "stack_id", "module"], dropna=False, sort=False)[["count", "n", "bytes"]] \
        .sum().reset_index()


@dataclass(frozen=True)
class FoldPlan:
    """What a fold keeps of the allocations that ended: those live at one of `instants`
    (sorted ns: fold_instants, and each layer's peak from a PeakTracker), and those whose
    free was missed (counted per chain by the leak analysis)."""

    instants: np.ndarray

    def keep(self, allocations: pd.DataFrame) -> np.ndarray:
        """Per allocation of `allocations` (ALLOCATION_COLUMNS): kept."""
        alloc_ts, end_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(allocations)
        return live_at_any(alloc_ts, end_ts, self.instants) | (allocations["end_kind"] == "missed").to_numpy()


def folded_lifetimes(kept: list[pd.DataFrame], stream: PairingStream, totals: FoldTotals) -> Lifetimes:
    """The kept allocations of every batch as one Lifetimes, in timeline order (by alloc time),
    with the dropped ones' module tally."""
    allocations = concat_frames(kept)
    order = np.argsort(allocations["alloc_ts_ns"].to_numpy(dtype=np.int64), kind="stable")
    allocations = allocations.take(order).reset_index(drop=True)
    unmatched, missed = stream.totals()
    return Lifetimes(allocations=allocations, unmatched_frees=unmatched, missed_frees=missed,
                     folded_modules=totals.modules())


def note_times(others: pd.DataFrame) -> np.ndarray:
    """When the agent named model state (timeline.with_model_state's notes), ascending: a
    fold keeps what was live then, so the names find their allocations."""
    return np.sort(others["ts_ns"].to_numpy(dtype=np.int64)[_state_notes(others)])


def _state_notes(others: pd.DataFrame) -> np.ndarray:
    category = others["category"].astype(object).fillna("").astype(str)
    return ((others["action"] == Action.MARK.value).to_numpy()
            & category.str.startswith(STATE_PREFIX).to_numpy(dtype=bool))


def named_model_state(allocations: pd.DataFrame, others: pd.DataFrame) -> pd.DataFrame:
    """timeline.with_model_state on paired allocations: each model-state note among `others`
    hands its "state:ROLE:NAME" to the allocation of its layer, process and address live at its time
    (alloc_ts <= note < end); an allocation several notes name keeps the latest one's."""
    notes = others[_state_notes(others)]
    if notes.empty or allocations.empty:
        return allocations
    left = pd.DataFrame({"ts": notes["ts_ns"].to_numpy(dtype=np.int64), "layer": notes["layer"].astype(object).to_numpy(),
                         "pid": notes["pid"].to_numpy(dtype=np.int64, na_value=-1),
                         "addr": notes["addr"].to_numpy(dtype=np.uint64),
                         "category": notes["category"].astype(object).to_numpy()}).sort_values("ts", kind="stable")
    right = pd.DataFrame({"ts": allocations["alloc_ts_ns"].to_numpy(dtype=np.int64),
                          "layer": allocations["layer"].astype(object).to_numpy(),
                          "pid": allocations["pid"].to_numpy(dtype=np.int64, na_value=-1),
                          "addr": allocations["addr"].to_numpy(dtype=np.uint64),
                          "row": np.arange(len(allocations)), "end": end_times(allocations)}).sort_values("ts", kind="stable")
    matched = pd.merge_asof(left, right, on="ts", by=["layer", "pid", "addr"], direction="backward")  # a process's own
    matched = matched[matched["row"].notna() & (matched["ts"] < matched["end"])]
    matched = matched.drop_duplicates("row", keep="last")
    if matched.empty:
        return allocations
    category = allocations["category"].astype(object).to_numpy().copy()
    category[matched["row"].to_numpy(dtype=np.int64)] = matched["category"].to_numpy(dtype=object)
    return allocations.assign(category=pd.Categorical(category))


def leak_checkpoints(others: pd.DataFrame, *, start_ns: int, target_end_ns: int, window_ns: int | None = None):
    """The checkpoints the leak analysis judges at (find_checkpoints: its steps, else windows,
    of `window_ns` where given: `leaks --window`), None where there are too few."""
    from memprof.analysis.checkpoints import find_checkpoints
    from memprof.analysis.trend import MIN_POINTS
    return find_checkpoints(others, start_ns=start_ns, end_ns=target_end_ns, min_points=MIN_POINTS, window_ns=window_ns)


def process_sample_ends(samples: pd.DataFrame | None) -> np.ndarray:
    """The first and last time (ns, ascending, unique) of each per-process sample series
    (device "pid:N"): where the dataloader advice weighs a worker's heap against its PSS."""
    from memprof.analysis.advice.dataloader import PROCESS_DEVICE
    if samples is None or samples.empty:
        return np.array([], dtype=np.int64)
    mine = samples[samples["device"].astype(str).str.startswith(PROCESS_DEVICE).to_numpy()]
    if mine.empty:
        return np.array([], dtype=np.int64)
    ends = mine.groupby(mine["device"].astype(str))["ts_ns"].agg(["min", "max"])
    return np.unique(ends.to_numpy(dtype=np.int64).ravel())


def fold_instants(others: pd.DataFrame, *, end_ns: int, target_end_ns: int, checkpoints) -> np.ndarray:
    """The moments (ns, ascending, unique) a fold keeps what was live at: every step mark of
    every process and the leak analysis's `checkpoints` (leak_checkpoints; None: none), each
    process's exit, the target's end and the recording's, and the model-state notes.
    `others` are the recording's rows other than allocations and frees, in time order."""
    from memprof.analysis.checkpoints import process_step_marks
    from memprof.analysis.leaks import exit_times
    moments = [process_step_marks(others)["ts_ns"].to_numpy(dtype=np.int64),
               np.asarray(list(exit_times(others).values()), dtype=np.int64),
               np.asarray([target_end_ns, end_ns], dtype=np.int64), note_times(others)]
    if checkpoints is not None:
        moments.append(checkpoints.times_ns.astype(np.int64))
        moments += [times.astype(np.int64) for times in (checkpoints.by_pid or {}).values()]
    return np.unique(np.concatenate(moments))


@dataclass(frozen=True)
class Fold:
    """How a recording was folded, for its notes and for the views that refuse one: its
    `events`, the memory a whole analysis would take (`needed_bytes`) against the limit,
    how many allocations were kept, and per layer what was dropped. `kept_at_ns`: the
    moments (ns after the recording's start) it was asked to keep what was live at, beside
    those it always keeps (`report top --at TIME`); `window_ns`: the leak analysis's windows
    it kept what was live at the ends of, None for the default ones (`report leaks --window`),
    and `window_ends_ns` those ends (none where the analysis judges at steps, or the recording
    is too short for windows); `gpu_points`: how many over-time points `report gpu` asked it
    to keep, and `gpu_times_ns` those times (ns, the timeline's clock: analysis.gpu.folded_times);
    `regions`: whether it kept what `report regions` reads (each region's start and each
    (layer, device)'s peak in it); `advice`: whether it kept what the advice rules read
    (regions, the `report gpu` points and each sampled process's first and last sample).
    `instants_ns`: every moment (ns, the timeline's clock, ascending) it kept everything live
    at, the peaks among them: the live bytes there are those of the whole recording.
    `curve_extremes`: where asked (analyse(curves=True)), each (layer, device)'s highest and
    lowest point between two of the moments it kept before the pass
    (PeakTracker.stretch_extremes): with the live bytes at `instants_ns`, the points a folded
    curve is drawn through.
    """

    events: int
    needed_bytes: int
    limit_bytes: int
    kept: int
    dropped_count: dict[str, int]
    dropped_bytes: dict[str, int]
    kept_at_ns: tuple[int, ...] = ()
    window_ns: int | None = None
    window_ends_ns: tuple[int, ...] = ()
    gpu_points: int | None = None
    gpu_times_ns: tuple[int, ...] = ()
    regions: bool = False
    advice: bool = False
    instants_ns: tuple[int, ...] = ()
    curve_extremes: dict = field(default_factory=dict)

    @property
    def note(self) -> str:
        dropped = sum(self.dropped_count.values())
        return (f"folded: {self.events:,} events need about {format_bytes(self.needed_bytes)} whole, over the "
                f"{format_bytes(self.limit_bytes)} of --max-memory; kept the {self.kept:,} allocations live at a step, "
                f"an exit, the end{self._asked} or a layer's peak, and counted the {dropped:,} born and freed in between")

    @property
    def _asked(self) -> str:
        from memprof.units import format_relative_ns
        gpu = f", the {len(self.gpu_times_ns)} times `report gpu` reads" if self.gpu_times_ns else ""
        regions = ", a region's start or peak" if self.regions else ""
        samples = ", a sampled process's first or last sample" if self.advice else ""
        return "".join(f", {format_relative_ns(at, 0)}" for at in self.kept_at_ns) + gpu + regions + samples
