"""Advice rule `dataloader-copy-on-read`: DataLoader workers copy the dataset on read.

A forked worker shares its parent's pages until it writes one; reading a Python object
writes its reference count, so a worker reading a dataset held as Python objects (lists,
dicts, strings) copies every page it reads: its PSS grows with the items read, while its
heap does not (nothing is allocated to hold them). Numpy or Arrow arrays keep the items in
a few buffers whose pages a read never writes.

Read from the samples: each process's own Pss (`pss_bytes`, device "pid:N": the samplers
write it, about once a second, while the tree has several processes) and the process table
of meta.json (ppid, comm, exe). A worker is a process forked from another of the tree (its
exe is its parent's). Without the libc heap recorded only DataLoader workers are judged:
torch names them "pt_data_worker" (the process table may have read the name before), and
they allocate under torch's `_worker_loop`. Per worker, over its samples taken once its
sibling workers had all been forked (_sharers_settled: until then fewer processes share
its parent's pages, and its PSS reads higher), a line is fitted to its Pss against time
(slope bytes per second, R²); its growth is its last Pss less its first. Its heap over the
same time is the live bytes of its allocations in the libc heap (`native_heap`, when
recorded: `--sources +native`) or else in the PyTorch CPU allocator (`torch_cpu`), weighted
where sampled: its last value less its first. A worker
whose Pss grows steadily (it rises between MIN_RISING of its samples) by at least MIN_GROWTH while its heap grows by at
most MAX_HEAP_SHARE of that is copying on read. The steps of the recording (step marks)
within its samples give the growth per step. The dataset is named by the `__getitem__`
Python frame of the worker's allocations (its qualified name: `RowsDataset.__getitem__`).

The saving: the Pss the workers gained: what arrays would not have copied.
Pure: reads the recording through Facts; sizes in bytes, times CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.checkpoints import step_marks
from memprof.analysis.growth import fit_linear
from memprof.analysis.lifetimes import end_times, live_mask
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts

MIN_GROWTH = Threshold("MIN_WORKER_PSS_GROWTH", 16 * 2**20, "bytes",
                       "a worker's PSS grows at least this much over its samples: less is its own working set settling")
MIN_RISING = Threshold("MIN_RISING_SHARE", 0.70, "fraction",
                       "the worker's PSS rises from one sample to the next at least this often: it grows steadily, "
                       "as reads copy pages, not by one jump")
MAX_HEAP_SHARE = Threshold("MAX_HEAP_SHARE", 0.10, "fraction",
                           "the worker's heap grows by at most this share of its PSS growth: the growth is not its allocations")
MIN_SAMPLES = Threshold("MIN_PSS_SAMPLES", 4, "count",
                        "PSS samples of the worker (about one a second): fewer cannot show a trend")
THRESHOLDS: tuple[Threshold, ...] = (MIN_GROWTH, MIN_RISING, MAX_HEAP_SHARE, MIN_SAMPLES)

PSS = "pss_bytes"
PROCESS_DEVICE = "pid:"  # the samplers' per-process series: device "pid:N"
WORKER_COMM = "pt_data_worker"  # torch.utils.data's name for its worker processes
WORKER_LOOP, WORKER_FILE = "_worker_loop", "torch/utils/data/"  # the function a worker runs, and where
HEAP_LAYERS = ("native_heap", "torch_cpu")  # the first recorded is the heap: torch_cpu nests in native_heap
GETITEM = ".__getitem__"


@dataclass(frozen=True)
class Worker:
    """One forked process's Pss over its samples (`ts_ns`, `pss` bytes), fitted by a line
    (`slope` bytes per second, `r2`), and its heap's growth over the same time."""

    pid: int
    comm: str
    ts_ns: np.ndarray
    pss: np.ndarray
    slope: float
    r2: float | None
    heap_growth: int

    @property
    def growth(self) -> int:
        return int(self.pss[-1] - self.pss[0])

    @property
    def seconds(self) -> float:
        return (int(self.ts_ns[-1]) - int(self.ts_ns[0])) / 1e9


def check(facts: Facts) -> Verdict:
    """Advice when forked workers' Pss grows while their heap stays flat (module docstring)."""
    series = _per_process_pss(facts.rec.samples)
    if not series:
        return silent("no per-process PSS samples (one process, or recorded before memprof sampled each one)")
    table = _process_table(facts.rec.meta)
    children = _forked(facts.rec.meta, table, series)
    if not children:
        return silent("no forked worker process has PSS samples")
    heap_layer = _heap_layer(facts.lifetimes.allocations)
    if heap_layer is None:
        return silent("no heap recorded (torch or native source) to tell copied pages from the workers' allocations")
    if heap_layer != "native_heap":
        # Without the libc heap a Python object heap that grows looks flat: trust only
        # DataLoader workers (named so, or allocating under torch's worker loop).
        looping = _in_worker_loop(facts)
        children = {pid: WORKER_COMM for pid, comm in children.items() if comm == WORKER_COMM or pid in looping}
        if not children:
            return silent(f"no {WORKER_COMM} process has PSS samples (other forked processes are judged "
                          "only with the libc heap recorded: --sources +native)")
    settled = _sharers_settled(table, children, series)
    workers, why = [], []
    for pid, comm in children.items():
        worker = _worker(facts, pid, comm, _from(series[pid], settled[pid]), heap_layer)
        if isinstance(worker, Worker):
            workers.append(worker)
        else:
            why.append(worker)
    if not workers:
        return silent("; ".join(why[:3]) + (f"; {len(why) - 3} more" if len(why) > 3 else ""))
    return fired(_advice(facts, workers, heap_layer))


def _per_process_pss(samples: pd.DataFrame | None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """pid → (ts_ns ascending, Pss bytes) of each per-process Pss series."""
    if samples is None or samples.empty:
        return {}
    device = samples["device"].astype(str)
    mine = samples[(samples["metric"] == PSS).to_numpy() & device.str.startswith(PROCESS_DEVICE).to_numpy()
                   & samples["value"].notna().to_numpy()]
    series = {}
    for name, rows in mine.groupby(mine["device"].astype(str)):
        rows = rows.sort_values("ts_ns", kind="stable")
        pid = name[len(PROCESS_DEVICE):]
        if pid.isdigit():
            series[int(pid)] = (rows["ts_ns"].to_numpy(dtype=np.int64), rows["value"].to_numpy(dtype=float))
    return series


def _process_table(meta) -> dict:
    """pid → its row of meta.json's process table (empty without one)."""
    return {row.get("pid"): row for row in (meta.processes or [])}


def _forked(meta, table: dict, series: dict) -> dict[int, str]:
    """pid → comm of each sampled process forked from another of the tree: it has a parent
    in the process table and runs its parent's executable (a fork; an exec'd tool runs its
    own). Without a process table, every sampled process but the root."""
    if not table:
        return {pid: "" for pid in series if pid != meta.pid}
    found = {}
    for pid in series:
        row, parent = table.get(pid), table.get((table.get(pid) or {}).get("ppid"))
        if row is None or parent is None or pid == meta.pid:
            continue
        if row.get("exe") and parent.get("exe") and row["exe"] != parent["exe"]:
            continue
        found[pid] = str(row.get("comm") or "")
    return found


def _sharers_settled(table: dict, children: dict, series: dict) -> dict[int, int]:
    """pid → when the last of its sibling workers (forked from the same parent, among
    `children`) that started before its last sample had started (ns; 0 where the process
    table has no start times). Before that moment its parent's pages were shared among fewer
    processes, so its PSS read higher by its part of what the next fork came to share. A
    DataLoader forks its workers one by one, 13 ms apart in examples/dataloader_cow.py; on
    CI (2026-12-07) a worker's first sample read 14 MB above its curve, as one taken between
    two forks would, and its growth came out that much smaller. A sibling that started after
    its last sample (the next epoch's workers) changed nothing it measured."""
    starts = {pid: (table.get(pid) or {}).get("start_ns") for pid in children}
    parents = {pid: (table.get(pid) or {}).get("ppid") for pid in children}
    settled = {}
    for pid in children:
        last_sample = int(series[pid][0][-1]) if len(series[pid][0]) else 0
        known = [int(starts[other]) for other in children
                 if parents[other] == parents[pid] and starts[other] is not None and int(starts[other]) <= last_sample]
        settled[pid] = max(known, default=0)
    return settled


def _from(series: tuple[np.ndarray, np.ndarray], start_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of `series` (ts_ns, values) taken at or after `start_ns`."""
    ts, values = series
    keep = ts >= start_ns
    return ts[keep], values[keep]


def _in_worker_loop(facts: Facts) -> set[int]:
    """Pids with allocations under torch's DataLoader worker loop (a Python frame
    `_worker_loop` of torch/utils/data/): the process table reads each comm once, sometimes
    before torch renamed the worker "pt_data_worker"."""
    frames, stacks = facts.rec.frames, facts.rec.stacks
    if frames is None or stacks is None or frames.empty or stacks.empty:
        return set()
    loop = frames[(frames["function"].astype(str) == WORKER_LOOP).to_numpy()
                  & frames["file"].astype(str).str.contains(WORKER_FILE, regex=False).to_numpy()]
    if loop.empty:
        return set()
    under = stacks.loc[stacks["frame_id"].isin(loop["frame_id"]), "stack_id"].unique()
    allocations = facts.lifetimes.allocations
    return {int(pid) for pid in allocations.loc[allocations["stack_id"].isin(under).to_numpy(dtype=bool, na_value=False),
                                                "pid"].unique()}


def _heap_layer(allocations: pd.DataFrame) -> str | None:
    """The outermost heap layer with allocations in the recording (module docstring)."""
    recorded = set(allocations["layer"].astype(str).unique()) if len(allocations) else set()
    return next((layer for layer in HEAP_LAYERS if layer in recorded), None)


def _worker(facts: Facts, pid: int, comm: str, series, heap_layer: str) -> Worker | str:
    """The worker if it passes every threshold, else why not (one phrase)."""
    ts, pss = series
    name = f"pid {pid}"
    if len(ts) < MIN_SAMPLES.value:
        return f"{name}: {len(ts)} PSS samples (< {MIN_SAMPLES.value:.0f})"
    fit = fit_linear((ts - ts[0]) / 1e9, pss)
    growth = int(pss[-1] - pss[0])
    if growth < MIN_GROWTH.value:
        return f"{name}: PSS grew {format_bytes(growth)} (< {format_bytes(MIN_GROWTH.value)})"
    rose, intervals = int((np.diff(pss) > 0).sum()), len(pss) - 1
    if fit is None or fit.b <= 0 or rose < MIN_RISING.value * intervals:
        return f"{name}: PSS rose in {rose} of {intervals} intervals (< {MIN_RISING.value:.0%}): no steady growth"
    heap = _heap_growth(facts.lifetimes.allocations, pid, heap_layer, int(ts[0]), int(ts[-1]))
    if heap > MAX_HEAP_SHARE.value * growth:
        return (f"{name}: its {heap_layer} grew {format_bytes(heap)} of its {format_bytes(growth)} PSS growth "
                f"(> {MAX_HEAP_SHARE.value:.0%}): its own allocations")
    return Worker(pid, comm, ts, pss, fit.b, fit.r2, heap)


def _heap_growth(allocations: pd.DataFrame, pid: int, layer: str, start_ns: int, end_ns: int) -> int:
    """The live bytes of `pid`'s allocations in `layer` at `end_ns` less at `start_ns`
    (weighted: a sampled allocation stands for `weight`)."""
    mine = allocations[(allocations["pid"] == pid).to_numpy(dtype=bool, na_value=False)
                       & (allocations["layer"].astype(str) == layer).to_numpy()]
    if mine.empty:
        return 0
    size = mine["size_bytes"].to_numpy(dtype=float, na_value=0.0) * mine["weight"].to_numpy(dtype=float, na_value=1.0)
    born, ended = mine["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(mine)

    def live(t: int) -> float:
        return float(size[live_mask(born, ended, t)].sum())

    return int(round(live(end_ns) - live(start_ns)))


def _steps_within(events: pd.DataFrame, start_ns: int, end_ns: int) -> int:
    """Steps begun between the two times (the steps the workers fed meanwhile), each step once
    however many processes marked it (checkpoints.step_marks)."""
    ts = step_marks(events)["ts_ns"].to_numpy(dtype=np.int64)
    return int(((ts >= start_ns) & (ts <= end_ns)).sum())


def _getitem(facts: Facts, pids: list[int]) -> tuple[str | None, str | None, int | None]:
    """(qualified name, "file:line", a stack id) of the dataset's `__getitem__`: the Python
    frame of that name most of the workers' allocations ran under; Nones when none did."""
    frames, stacks = facts.rec.frames, facts.rec.stacks
    if frames is None or stacks is None or frames.empty or stacks.empty:
        return None, None, None
    function = frames["function"].astype(str)
    found = frames[(frames["kind"].astype(str) == "python").to_numpy() & function.str.endswith(GETITEM).to_numpy()]
    if found.empty:
        return None, None, None
    allocations = facts.lifetimes.allocations
    used = allocations.loc[allocations["pid"].isin(pids).to_numpy(dtype=bool, na_value=False), "stack_id"].dropna()
    through = stacks[stacks["frame_id"].isin(found["frame_id"]) & stacks["stack_id"].isin(used.unique())]
    if through.empty:
        return None, None, None
    counts = used[used.isin(through["stack_id"])].value_counts()
    top = int(counts.index[0])
    frame_id = through.loc[through["stack_id"] == top].sort_values("depth")["frame_id"].iloc[0]
    frame = found[found["frame_id"] == frame_id].iloc[0]
    line = f"{frame['file']}:{int(frame['line'])}" if pd.notna(frame["line"]) else str(frame["file"])
    return str(frame["function"]), line, top


def _advice(facts: Facts, workers: list[Worker], heap_layer: str) -> Advice:
    total = sum(w.growth for w in workers)
    named = "DataLoader workers" if all(w.comm == WORKER_COMM for w in workers) else "forked worker processes"
    start, end = min(int(w.ts_ns[0]) for w in workers), max(int(w.ts_ns[-1]) for w in workers)
    steps = _steps_within(facts.events, start, end)
    getitem, line, stack = _getitem(facts, [w.pid for w in workers])
    evidence = [
        f"pid {w.pid}{f' ({w.comm})' if w.comm else ''}: PSS {format_bytes(w.pss[0])} → {format_bytes(w.pss[-1])} "
        f"(+{format_bytes(w.growth)} in {w.seconds:.1f} s, {format_bytes(w.slope)}/s, R² {w.r2:.2f}"
        + (f", {format_bytes(w.growth / steps)} per step over {steps} steps" if steps else "")
        + f"), while its {heap_layer} grew {format_bytes(w.heap_growth)}."
        for w in workers]
    evidence.append(f"{len(workers)} {named} gained {format_bytes(total)} of PSS that no allocation of theirs "
                    "explains: pages shared with the parent, copied as reads wrote Python objects' reference counts.")
    if getitem:
        evidence.append(f"The workers read the dataset through {getitem} ({line}).")
    if heap_layer != "native_heap":
        evidence.append("The libc heap was not recorded (record with --sources +native to compare the workers' "
                        "Python objects too): the heap compared is the PyTorch CPU allocator's.")
    dataset = getitem.rsplit(".", 1)[0] if getitem and "." in getitem else "the dataset"
    return Advice(
        rule=RULE.id,
        title=f"{named} copy the dataset on read: +{format_bytes(total)} of PSS, their heap flat",
        evidence=tuple(evidence),
        change=(f"keep {dataset}'s items in numpy or Arrow arrays (or a memory-mapped file) instead of Python "
                "lists, dicts or strings: reading an array's element writes no reference count, so the pages "
                "stay shared with the parent"),
        saving=f"about {format_bytes(total)} less resident memory: the PSS the {len(workers)} workers gained",
        saving_bytes=total,
        chains=(stack,) if stack is not None else (),
        layer=None, device="cpu",
        numbers={"workers": [{"pid": w.pid, "comm": w.comm, "pss_first_bytes": int(w.pss[0]),
                              "pss_last_bytes": int(w.pss[-1]), "pss_growth_bytes": w.growth,
                              "pss_bytes_per_second": w.slope, "r2": w.r2, "seconds": w.seconds,
                              "samples": len(w.pss), "first_ts_ns": int(w.ts_ns[0]), "last_ts_ns": int(w.ts_ns[-1]),
                              "heap_growth_bytes": w.heap_growth}
                             for w in workers],
                 "pss_growth_bytes": total, "steps": steps,
                 "pss_growth_bytes_per_step": total / steps if steps else None,
                 "heap_layer": heap_layer, "getitem": getitem, "getitem_line": line},
    )


RULE = Rule(
    id="dataloader-copy-on-read",
    title="DataLoader workers copy the dataset on read",
    trigger=("a forked worker's own PSS grows steadily (a line in time) while its heap over the same "
             "samples stays flat"),
    evidence=("per worker its PSS first and last, growth per second and per step, R², and its heap's growth; "
              "the dataset's __getitem__ line"),
    advice=("keep the dataset in numpy or Arrow arrays: reading a Python object writes its reference count, "
            "which copies the page the worker shared with its parent"),
    saving="the PSS the workers gained over their samples (what arrays would have left shared)",
    thresholds=THRESHOLDS,
    check=check,
    needs="a process tree (per-process PSS is sampled when it has several); --sources +native to compare the "
          "Python heap",
)
