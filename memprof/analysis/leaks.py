"""Leaks: what grew and never came back, grouped by the chain that allocated it, with its kind
(held at the end, grows per step) — and, apart, memory held on purpose (not a leak).

Pure functions over the timeline and its lifetimes; no I/O. Times are CLOCK_MONOTONIC ns.
Growth per step is judged on each chain's live bytes at checkpoints (checkpoints.py) by
robust statistics (trend.py); what is held on purpose is recognized in caches.py.

"Held at the end" is judged at `end_ns`, the moment the target began to exit (see
`end_of_target`), before its teardown frees everything: an allocation is held when it was
made at or before `end_ns`, had not ended by `end_ns`, and was at least `min_age_ns` old then
(younger ones are in flight, not leaked). Held allocations that were freed after `end_ns` were
released by the teardown (`released_at_exit`); those still live when the recording stopped
outlived the process (kernel caches, pipes kept by another process, driver memory).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.caches import KnownChains, blocks_inside
from memprof.analysis.chain_trends import ChainTrends, chain_trends, rows_of_chains
from memprof.analysis.chains import DEFAULT_NATIVE_FRAMES, NativeFrames, check_native_frames, with_canonical_stacks
from memprof.analysis.checkpoints import Checkpoints
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import NEVER, Lifetimes, end_times, label_of, labels, live_mask
from memprof.analysis.model_state import ModelStateTotal, model_state_totals, state_roles
from memprof.analysis.modules import with_chain_modules
from memprof.analysis.trend import Trend
from memprof.errors import UsageError
from memprof.model.schema import EVAL_LOOP_FUNCTIONS, FRAME_KEYS, Action, FrameKind, Layer, Mark


# Held at the end counts an allocation at least this old then (--min-age): younger ones are
# the work in flight when the target stopped.
DEFAULT_MIN_AGE_NS = 500_000_000


class LeakKind(str, enum.Enum):
    """What a finding is; LeakFinding.kind holds the value."""

    HELD_AT_END = "held_at_end"
    GROWS_PER_STEP = "grows_per_step"
    NOT_A_LEAK = "not_a_leak"


class LeakReason(str, enum.Enum):
    """Why a finding has its kind; LeakFinding.reason holds the value. HELD and GROWS are
    leaks; the others are memory that is not a leak (see memprof.analysis.caches, trend)."""

    HELD = "held"                      # live at the end, older than min_age
    GROWS = "grows"                    # a rising trend over the checkpoints
    CACHED_SEGMENT = "cached_segment"  # a caching allocator's segment with no live block
    KERNEL_CACHE = "kernel_cache"      # page cache, dentries, inodes: reclaimed under pressure
    SLAB_PAGES = "slab_pages"          # the slab allocator's own pages and its bookkeeping of them
    ADDRESS_SPACE = "address_space"    # page tables, VMAs: they go with the process
    MEMPROF_OWN = "memprof_own"        # memprof's BPF programs, uprobes, agent
    PLATEAU = "plateau"                # filled, then held steady (a cache or pool)
    SAWTOOTH = "sawtooth"              # filled and released again and again
    STARTUP = "startup"                # made once at start-up, held until exit (_at_startup)
    THREADS = "threads"                # kernel objects of threads still running
    MODEL_STATE = "model_state"        # parameters, buffers, gradients, optimizer state (model_state.py)
    GROWS_WITHIN = "grows_within"      # one buffer made larger each step, released before the end
    FRAMEWORK_STATE = "framework_state"  # DistributedDataParallel's gradient buckets (caches.framework_state_stacks)


KINDS = tuple(kind.value for kind in LeakKind)
REASONS = tuple(reason.value for reason in LeakReason)
# Memory that is not a leak, unless it grows: start-up work done again and again, threads
# started and never ended, a framework's state made again and again.
_GROWTH_WINS = (LeakReason.STARTUP.value, LeakReason.THREADS.value, LeakReason.FRAMEWORK_STATE.value)


@dataclass(frozen=True)
class LeakFinding:
    """Allocations of one (layer, stack_id, released_at_exit) chain, and what kind of finding
    they are (`kind` in KINDS, `reason` in REASONS).

    `live_bytes`/`live_count` are what the chain held at the end (for a "sawtooth" or
    "plateau" chain not held at the end: at its highest checkpoint). `first_ns`/`last_ns` are
    the earliest/latest alloc `ts_ns` of those allocations; `growth_bytes_per_s` is live_bytes
    over the seconds from first_ns to the end (0 when none). `stack_id` is None for
    allocations recorded without a stack.

    Trend fields are set when the recording had enough checkpoints (LeakResult.checkpoints):
    `slope_bytes_per_step` (Theil–Sen, bytes per step or per window), `slope_bytes_per_s`,
    `confidence` (Mann–Kendall, 0..1), `rises` (checkpoints above the one before, out of
    `points` − 1), `resets` (falls by half the range), `plateau_from` (label of the
    checkpoint where a plateau was reached).

    `younger_count`/`younger_bytes` are the chain's allocations (same layer and fate) that
    were live at the end but younger than `min_age_ns`: left out of live_bytes/live_count.

    `released_before_end`: a chain that held nothing at the end, shown by its highest
    checkpoint (its live_bytes/live_count are there): one that grew over the checkpoints (a
    loop that keeps something from every request, freed as `main` returns), a sawtooth or a
    plateau. `within_slope_bytes_per_step`, for
    a sawtooth: how fast it grows within each cycle (per token, for a request's KV cache).

    `ranks`/`hosts`, in a distributed job (find_leaks' `rank_of_pid`): the ranks, and their
    hosts, of the processes that made the allocations the finding counts (ascending; empty
    without ranks, and for model state). Allocations of a process without a rank (the
    launcher) add none.
    """

    layer: str
    stack_id: int | None
    live_bytes: int
    live_count: int
    first_ns: int
    last_ns: int
    growth_bytes_per_s: float
    released_at_exit: bool
    # Allocations of this chain proven freed unseen (handed out again while live). Any
    # makes the finding unconfirmed: this chain's frees are not all visible to the probes
    # (on Linux 6.18, e.g., slab objects freed in bulk through RCU sheaves), so some of its
    # live allocations may already be free.
    chain_missed_frees: int = 0
    kind: str = LeakKind.HELD_AT_END.value
    reason: str = LeakReason.HELD.value
    slope_bytes_per_step: float | None = None
    slope_bytes_per_s: float | None = None
    confidence: float | None = None
    rises: int | None = None
    points: int = 0
    resets: int = 0
    plateau_from: int | None = None
    younger_count: int = 0
    younger_bytes: int = 0
    released_before_end: bool = False
    within_slope_bytes_per_step: float | None = None
    module: str | None = None  # the nn.Module path most of the chain was allocated in (modules.chain_modules)
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()

    @property
    def confirmed(self) -> bool:
        return self.chain_missed_frees == 0

    @property
    def is_leak(self) -> bool:
        return self.kind != LeakKind.NOT_A_LEAK.value


@dataclass
class LeakResult:
    """Leak findings (`findings`: held at the end or growing per step) and, apart,
    `not_leaks` (memory held on purpose), each biggest first, and the loss that qualifies them.

    `missed_frees` (per layer) are frees never seen, inferred from an address handed out again;
    `unconfirmed_frees` (per layer) is for the caller to fill from the recording's kernel
    counters (frees the kernel skipped): up to that many findings' allocations may have been freed.
    `checkpoints` are where trends were judged (None: too few steps or windows for a trend).

    What the filters left out: `top` (None: no cut) kept the biggest of `findings_total`
    findings and of `not_leaks_total` not-leaks; `younger_count`/`younger_bytes` are all the
    allocations live at the end but younger than `min_age_ns` (of any chain, a finding's or
    not), which no finding counts.

    `python_frames` is for the caller to fill from the recording's metadata: True when
    Python frames were read for every interpreter it saw (a chain through the interpreter
    without them was made while its thread ran no Python code), False when not for some
    (the recording's notes say why), None when unknown.

    `heap_recorded` is for the caller to fill from the recording's metadata: whether the C
    library's heap (malloc and friends: Python's objects, NumPy's arrays) was recorded (the
    native family, `record --sources +native`); None when unknown. Without it a leak there
    is in no finding.

    `unseen_tasks` is for the caller to fill from the recording's metadata: the processes no
    probe ran under (loss.unseen_tasks: [{"pid", "comm", "threads", "switches"}]). The
    kernel's frees on their time went unseen, so a kernel finding that outlived the process
    may be memory already freed (`may_be_freed_unseen`).

    `model_state`: the model's own memory live at the end (parameters, buffers, gradients,
    optimizer state, as the agent named them; any age), totalled by role, layer and device
    (model_state.model_state_totals). None of it is ever a finding; its chains are among
    `not_leaks` with reason "model_state", and a chain partly of model state is judged on
    its other allocations alone.
    """

    findings: list[LeakFinding]
    end_ns: int
    min_age_ns: int
    recording_end_ns: int
    missed_frees: dict[str, int] = field(default_factory=dict)
    unconfirmed_frees: dict[str, int] = field(default_factory=dict)
    not_leaks: list[LeakFinding] = field(default_factory=list)
    checkpoints: Checkpoints | None = None
    top: int | None = None
    findings_total: int = 0
    not_leaks_total: int = 0
    younger_count: int = 0
    younger_bytes: int = 0
    python_frames: bool | None = None
    heap_recorded: bool | None = None
    model_state: list[ModelStateTotal] = field(default_factory=list)
    unseen_tasks: list[dict] = field(default_factory=list)

    def may_be_freed_unseen(self, finding: LeakFinding) -> bool:
        """Whether `finding` may be frees no probe saw: kernel memory still held after the
        target's exit, in a recording where the kernel ran on some process's time unseen
        (RCU callbacks free closed sockets and inodes there). What the exit released was
        seen to be freed, and a chain released before the end was seen too. Only a leak is
        marked: memory already judged not a leak (a kernel cache, the slab's own pages) is
        not one either way, and the mark there was noise beside it."""
        return (bool(self.unseen_tasks) and finding.kind != LeakKind.NOT_A_LEAK.value
                and finding.layer in _KERNEL_LAYERS and not finding.released_at_exit
                and not finding.released_before_end and self.end_ns < self.recording_end_ns)


def find_leaks(lifetimes: Lifetimes, *, end_ns: int, recording_end_ns: int, min_age_ns: int = DEFAULT_MIN_AGE_NS,
               layers: Iterable[str] | None = None, top: int | None = None,
               end_by_pid: Mapping[int, int] | None = None,
               canonical_stack: Mapping[int, int] | None = None,
               checkpoints: Checkpoints | None = None, known: KnownChains = KnownChains(),
               confidence: float = 0.99, rank_of_pid: Mapping[int, tuple[int, str | None]] | None = None,
               setup_end_ns: int | None = None, attached_pids: frozenset[int] = frozenset()) -> LeakResult:
    """Leaks, by (layer, chain, released_at_exit), with their kind:

    - grows_per_step: the chain's live bytes at `checkpoints` rise (trend.classify with
      `confidence`); its bytes are everything it held at the end, whatever their age;
    - held_at_end: held at the end (module docstring), older than `min_age_ns`;
    - not_a_leak (in `not_leaks`): held on purpose — cached caching-allocator segments,
      kernel caches that outlived the process, the slab allocator's own pages, the
      process's address space (page tables, VMAs), memprof's own (its BPF programs, its
      uprobes, its agent), a sawtooth, or, when the target did not exit while recorded, a
      plateau (chains recognized by their frames in `known`, from caches.known_chains);
      and, unless they grow per step, the kernel objects of threads still running
      (`known.threads`) and what the program made once at start-up (_at_startup); also
      sawtooth and plateau chains not held at the end, by their highest checkpoint;
    - model state (allocations the timeline named "state:ROLE:NAME"): never a finding, nor
      part of a chain's trend; held at the end at any age, it is totalled in
      `LeakResult.model_state` and its chains are not-leaks of reason "model_state".

    Each list is sorted by live_bytes, then live_count (both descending), then stack_id, and
    cut to `top`. `layers` keeps only those layers. Each allocation is judged at the end of
    the process that made it — `end_by_pid[pid]`, when that process began to exit while
    recorded — else at `end_ns`. `canonical_stack` maps stack ids with identical frames to
    one id (see `chains.canonical_stacks`), so one chain is one finding. `rank_of_pid` (pid ->
    (rank, host) of each process of a distributed job) fills each shown finding's `ranks` and
    `hosts`. `setup_end_ns` is when the program's set-up ended (checkpoints.first_step_end_ns:
    kernel objects made before it are start-up); None: unknown (no step marks).
    `attached_pids`: processes already running when the recording began (`record --pid`):
    what they made before their first Python frame was seen is not their interpreter
    starting, so _at_startup does not count it as start-up."""
    if end_ns > recording_end_ns:
        raise UsageError(f"the end time {end_ns} ns is after the recording's end ({recording_end_ns} ns)",
                         "judge leaks at a time inside the recording")
    wanted = None if layers is None else {label_of(layer) for layer in layers}
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    if wanted is not None:
        allocations = allocations[np.isin(labels(allocations["layer"]), list(wanted))].reset_index(drop=True)
    missed_by_chain = _missed_by_chain(allocations)
    target_exited = end_ns < recording_end_ns
    # The model's own memory is judged apart, and first: nothing of it is a leak, and it must
    # not make the rest of its chain look like growth either.
    state, allocations = _split_model_state(allocations)
    model_state, state_chains = _model_state(state, end_ns, recording_end_ns, end_by_pid, missed_by_chain)
    ends = _end_per_allocation(allocations, end_ns, end_by_pid)
    exited = _exited(allocations, end_ns, recording_end_ns, end_by_pid)
    trends = chain_trends(allocations, checkpoints, confidence) if checkpoints is not None else ChainTrends.none()
    held = _held(allocations, ends, exited, min_age_ns, _growing_and_live(allocations, ends, trends))
    startup = _at_startup(allocations, held, known, setup_end_ns, attached_pids)
    held = held.assign(reason=_held_reasons(allocations, held, ends, known, startup, state))
    kinds = [_finding(row, missed_by_chain, trends, target_exited) for row in _sorted_groups(held).itertuples(index=False)]
    younger = _younger(allocations, ends, exited, held)
    kinds = _with_younger(kinds, younger)
    released = _released_growth_findings(trends, held, allocations)
    leaks = _biggest_first([f for f in kinds if f.is_leak] + [f for f in released if f.is_leak])
    shaped, shaped_total = _shape_only_findings(trends, held, allocations, top)
    not_leaks = [f for f in kinds if not f.is_leak] + state_chains + [f for f in released if not f.is_leak] + shaped
    missed = {layer: n for layer, n in lifetimes.missed_frees.items() if wanted is None or layer in wanted}
    folded = lifetimes.folded_modules_of(wanted)
    shown = _with_ranks(with_chain_modules(leaks[:top], allocations, folded=folded, canonical_stack=canonical_stack),
                        allocations, held, trends, rank_of_pid)
    shown_not = _with_ranks(with_chain_modules(_biggest_first(not_leaks)[:top], allocations, folded=folded,
                                               canonical_stack=canonical_stack), allocations, held, trends, rank_of_pid)
    return LeakResult(findings=shown, not_leaks=shown_not, end_ns=int(end_ns),
                      min_age_ns=int(min_age_ns), recording_end_ns=int(recording_end_ns), missed_frees=missed,
                      checkpoints=checkpoints if trends.judged else None, top=top, findings_total=len(leaks),
                      not_leaks_total=len(not_leaks) - len(shaped) + shaped_total,
                      younger_count=int(round(younger["weight"].sum())),
                      younger_bytes=int(round(younger["size_bytes"].sum())), model_state=model_state)


def cut(result: LeakResult, top: int | None) -> LeakResult:
    """`result` of find_leaks (or leak_report) with `top` None, as it would have been with
    `top`: its `top` biggest findings and not-leaks (each list is biggest first, and each
    finding's fields its own), so that one analysis serves every cut of it."""
    return replace(result, findings=result.findings[:top], not_leaks=result.not_leaks[:top], top=top)


def one_per_chain(findings: Iterable[LeakFinding]) -> list[LeakFinding]:
    """`findings` with each chain once, in the order of each chain's first finding.

    A chain (layer, stack_id; and its ranks in a job, each judged apart) is several findings
    where its allocations differ in fate: what the exit released and what it did not
    (released_at_exit), or start-up work beside the rest. Each carries the whole chain's
    trend, so a sum of slopes over findings counts a chain's growth once per fate. Here the
    fates are one: bytes, counts and younger allocations added, the span widened, the trend
    and missed frees (both per chain) once; kind and reason those of the growing finding
    where one grows, else of the biggest; released_at_exit only where every fate was."""
    merged: dict[tuple, LeakFinding] = {}
    for finding in findings:
        key = (finding.layer, finding.stack_id, finding.ranks, finding.hosts)
        seen = merged.get(key)
        merged[key] = finding if seen is None else _fates_merged(seen, finding)
    return list(merged.values())


def _fates_merged(one: LeakFinding, other: LeakFinding) -> LeakFinding:
    grows = LeakKind.GROWS_PER_STEP.value
    base = other if other.kind == grows and one.kind != grows else one
    return replace(base, live_bytes=one.live_bytes + other.live_bytes, live_count=one.live_count + other.live_count,
                   first_ns=min(one.first_ns, other.first_ns), last_ns=max(one.last_ns, other.last_ns),
                   growth_bytes_per_s=one.growth_bytes_per_s + other.growth_bytes_per_s,
                   released_at_exit=one.released_at_exit and other.released_at_exit,
                   younger_count=one.younger_count + other.younger_count,
                   younger_bytes=one.younger_bytes + other.younger_bytes)


def find_leaks_by_rank(lifetimes: Lifetimes, rank_of_pid: Mapping[int, tuple[int, str | None]], *,
                       top: int | None = None, **options) -> LeakResult:
    """find_leaks judged apart for each rank (each (rank, host) of `rank_of_pid`, and the
    processes without a rank together): a chain leaking on rank 2 only is rank 2's finding,
    one leaking on every rank is one finding per rank, each with its own bytes and growth.
    The findings of all ranks are then one list, biggest first, cut to `top`; the model
    state is totalled over all. `options` as find_leaks takes them."""
    groups: dict[tuple[int, str | None] | None, list[int]] = {}
    pids = lifetimes.allocations["pid"].to_numpy(dtype=np.int64, na_value=-1)
    for pid in np.unique(pids).tolist():
        groups.setdefault(rank_of_pid.get(pid), []).append(pid)
    if not groups:
        return find_leaks(lifetimes, top=top, rank_of_pid=rank_of_pid, **options)
    parts = []
    for _, members in sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or (0, ""))):
        folded = lifetimes.folded_modules
        mine = Lifetimes(lifetimes.allocations[np.isin(pids, members)].reset_index(drop=True),
                         lifetimes.unmatched_frees, lifetimes.missed_frees,
                         None if folded is None else folded[folded["pid"].isin(members).to_numpy()])
        parts.append(find_leaks(mine, top=None, rank_of_pid=rank_of_pid, **options))
    return _merged(parts, top)


def _merged(parts: list[LeakResult], top: int | None) -> LeakResult:
    """One result of the results of disjoint sets of processes (find_leaks_by_rank): their
    findings and not-leaks in one list each, biggest first, cut to `top`; counts summed."""
    leaks = _biggest_first([f for part in parts for f in part.findings])
    not_leaks = _biggest_first([f for part in parts for f in part.not_leaks])
    state = [t for part in parts for t in part.model_state]
    first = parts[0]
    totals = model_state_totals(np.array([t.role for t in state], dtype=object), np.array([t.layer for t in state]),
                                np.array([t.device for t in state]), np.array([t.live_bytes for t in state], float),
                                np.array([t.count for t in state], float))
    judged = next((part.checkpoints for part in parts if part.checkpoints is not None), None)
    return replace(first, findings=leaks[:top], not_leaks=not_leaks[:top], checkpoints=judged, top=top,
                   findings_total=len(leaks), not_leaks_total=len(not_leaks), model_state=totals,
                   younger_count=sum(part.younger_count for part in parts),
                   younger_bytes=sum(part.younger_bytes for part in parts))


def _with_ranks(findings: list[LeakFinding], allocations: pd.DataFrame, held: pd.DataFrame, trends: ChainTrends,
                rank_of_pid: Mapping[int, tuple[int, str | None]] | None) -> list[LeakFinding]:
    """`findings` with `ranks` and `hosts` filled from the processes of the allocations each
    counts: a chain's held allocations (same layer, stack and fate), or for a chain that held
    none at the end, those live at one of its checkpoints. Unchanged without `rank_of_pid`."""
    if not rank_of_pid or not findings:
        return findings
    pid = allocations["pid"].to_numpy(dtype=np.int64, na_value=-1)
    held_pids = pd.DataFrame({"layer": held["layer"].to_numpy(), "released": held["released_at_exit"].to_numpy(),
                              "stack": held["stack_id"].to_numpy(dtype=np.int64, na_value=-1),
                              "pid": pid[held.index.to_numpy()]}).drop_duplicates()
    pids: dict[tuple, set[int]] = {}
    for layer, released, stack, process in held_pids.itertuples(index=False):
        pids.setdefault((layer, int(stack), bool(released)), set()).add(int(process))
    at_checkpoints = None
    out = []
    for finding in findings:
        key = (finding.layer, -1 if finding.stack_id is None else finding.stack_id, finding.released_at_exit)
        made_by = pids.get(key)
        if made_by is None and finding.reason != LeakReason.MODEL_STATE.value:
            if at_checkpoints is None:
                at_checkpoints = _pids_at_checkpoints(trends, pid)
            made_by = at_checkpoints.get((finding.layer, finding.stack_id), ())
        places = sorted({rank_of_pid[p] for p in made_by or () if p in rank_of_pid}, key=lambda rh: (rh[0], str(rh[1])))
        out.append(replace(finding, ranks=tuple(sorted({rank for rank, _ in places})),
                           hosts=tuple(sorted({host for _, host in places if host is not None}))))
    return out


def _pids_at_checkpoints(trends: ChainTrends, pid: np.ndarray) -> dict[tuple, set[int]]:
    """Chain (layer, stack_id) -> the processes of its allocations live at one of the
    checkpoints (none without trends): one pass for every finding that needs it."""
    if trends.series is None:
        return {}
    live = trends.chain_of_row >= 0
    pairs = pd.DataFrame({"row": trends.chain_of_row[live], "pid": pid[live]}).drop_duplicates()
    out: dict[tuple, set[int]] = {}
    for row, process in pairs.itertuples(index=False):
        out.setdefault(trends.series.chains[row], set()).add(int(process))
    return out


def _exited(allocations: pd.DataFrame, end_ns: int, recording_end_ns: int,
            end_by_pid: Mapping[int, int] | None) -> np.ndarray:
    """Per allocation: its process began to exit while recorded (the kernel then takes back
    what it still held)."""
    return allocations["pid"].isin(list(end_by_pid or ())).to_numpy() | (end_ns < recording_end_ns)


def _split_model_state(allocations: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the model state, with its `role`; every other allocation), each with a fresh index.
    Without model state the second is `allocations` itself, not a copy."""
    roles = state_roles(allocations)
    is_state = roles != None  # noqa: E711  (element-wise, on an object array)
    if not is_state.any():
        return allocations.iloc[:0].assign(role=roles[:0]), allocations
    state = allocations[is_state].assign(role=roles[is_state]).reset_index(drop=True)
    return state, allocations[~is_state].reset_index(drop=True)


def _model_state(state: pd.DataFrame, end_ns: int, recording_end_ns: int, end_by_pid: Mapping[int, int] | None,
                 missed_by_chain: dict) -> tuple[list[ModelStateTotal], list[LeakFinding]]:
    """What the model held at its end, whatever its age (its weights are as old as the job),
    or, where it held less then (a script whose model goes as `main` returns, before the
    interpreter finalizes), at its peak before the end: totals by role, layer and device, and
    its chains as not-a-leak findings (reason "model_state"), so each chain's stack still
    shows where the model's memory came from."""
    if state.empty:
        return [], []
    ends = _end_per_allocation(state, end_ns, end_by_pid)
    peak_ns = _state_peak_ns(state, int(ends.max()))
    if peak_ns is not None and _live_bytes(state, ends) < _live_bytes(state, np.full(len(state), peak_ns)):
        ends = np.full(len(state), peak_ns, dtype=np.int64)
    held = _held(state, ends, _exited(state, end_ns, recording_end_ns, end_by_pid), 0)
    rows = held.index.to_numpy()
    totals = model_state_totals(state["role"].to_numpy(dtype=object)[rows], held["layer"].to_numpy(),
                                labels(state["device"])[rows], held["size_bytes"].to_numpy(dtype=float),
                                held["weight"].to_numpy(dtype=float))
    groups = _sorted_groups(held.assign(reason=LeakReason.MODEL_STATE.value))
    target_exited = end_ns < recording_end_ns
    no_trends = ChainTrends.none()
    chains = [_finding(row, missed_by_chain, no_trends, target_exited) for row in groups.itertuples(index=False)]
    return totals, chains


def _state_peak_ns(state: pd.DataFrame, until_ns: int) -> int | None:
    """When the most model-state bytes were live at once, at or before `until_ns` (the
    earliest such time); None when none was live by then."""
    alloc_ts = state["alloc_ts_ns"].to_numpy(dtype=np.int64)
    times, live = live_curve(alloc_ts, end_times(state), state["size_bytes"].to_numpy(dtype=float))
    before = times <= until_ns
    if not before.any() or live[before].max() <= 0:
        return None
    return int(times[before][np.argmax(live[before])])


def _live_bytes(allocations: pd.DataFrame, at: np.ndarray) -> float:
    """Bytes of `allocations` live at each one's time in `at`."""
    alive = live_mask(allocations["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(allocations), at)
    return float(allocations["size_bytes"].to_numpy(dtype=float)[alive].sum())


def _end_per_allocation(allocations: pd.DataFrame, end_ns: int, end_by_pid: Mapping[int, int] | None) -> np.ndarray:
    """The time each allocation is judged at, ns."""
    ends = np.full(len(allocations), end_ns, dtype=np.int64)
    pids = allocations["pid"].to_numpy()
    for pid, exit_ns in (end_by_pid or {}).items():  # the processes that exited: a few
        ends[pids == pid] = exit_ns
    return ends


# Memory of the process itself: when the process exits the kernel takes it back whole,
# and no free is ever called. Live at an exit that was recorded = released at exit.
_PROCESS_LAYERS = [Layer.TORCH_CPU.value, Layer.NATIVE_HEAP.value, Layer.CUDA_DRIVER.value,
                   Layer.CUDA_SEGMENT.value, Layer.CUDA_BLOCK.value]


def _growing_and_live(allocations: pd.DataFrame, ends: np.ndarray, trends: ChainTrends) -> np.ndarray | None:
    """Per allocation: of a growing chain and live at its end (a growing chain's young
    allocations are its growth too, so --min-age does not apply to them); None when no chain
    grows. Only the allocations live at the end are matched against the growing chains: a
    few, where the recording has millions."""
    if not trends.growing:
        return None
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = end_times(allocations)
    live = np.flatnonzero(live_mask(alloc_ts, end_ts, ends))
    exempt = np.zeros(len(allocations), dtype=bool)
    exempt[live[rows_of_chains(allocations.iloc[live], trends.growing)]] = True
    return exempt


def _held(allocations: pd.DataFrame, ends: np.ndarray, exited: np.ndarray, min_age_ns: int,
          exempt: np.ndarray | None = None) -> pd.DataFrame:
    """The allocations held at their end, older than `min_age_ns` (any age where `exempt`),
    as (stack_id, size_bytes, alloc_ts_ns, weight, layer, released_at_exit, judged_ns),
    indexed by allocation row."""
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = end_times(allocations)
    old_enough = (ends - alloc_ts) >= min_age_ns
    if exempt is not None:
        old_enough |= exempt
    mask = live_mask(alloc_ts, end_ts, ends) & old_enough
    rows = np.flatnonzero(mask)  # a few thousand of millions: only they get their layer's name
    layer = labels(allocations["layer"].iloc[rows])
    held = allocations.iloc[rows][["stack_id", "size_bytes", "alloc_ts_ns", "weight"]]
    # A sampled allocation stands for `weight` of them: estimates of bytes and counts stay unbiased.
    held = held.assign(size_bytes=held["size_bytes"].astype(float) * held["weight"])
    released = (end_ts[rows] != NEVER) | (exited[rows] & np.isin(layer, _PROCESS_LAYERS))
    return held.assign(layer=layer, released_at_exit=released, judged_ns=ends[rows])


def _younger(allocations: pd.DataFrame, ends: np.ndarray, exited: np.ndarray, held: pd.DataFrame) -> pd.DataFrame:
    """The allocations live at their end that `held` left out for being younger than
    min_age (a growing chain's are held at any age), with the columns of `_held`."""
    live = _held(allocations, ends, exited, 0)
    return live.loc[live.index.difference(held.index)]


def _with_younger(findings: list[LeakFinding], younger: pd.DataFrame) -> list[LeakFinding]:
    """Each finding with the younger allocations of its chain (same layer, stack and fate) it
    left out; a chain's are given to its first (biggest) finding only."""
    if younger.empty:
        return findings
    groups = younger.groupby(["layer", "stack_id", "released_at_exit"], dropna=False).agg(
        nbytes=("size_bytes", "sum"), count=("weight", "sum"))
    left = {(layer, None if pd.isna(sid) else int(sid), bool(released)): (int(round(b)), int(round(n)))
            for (layer, sid, released), b, n in zip(groups.index, groups["nbytes"], groups["count"])}
    out = []
    for finding in findings:
        nbytes, count = left.pop((finding.layer, finding.stack_id, finding.released_at_exit), (0, 0))
        out.append(replace(finding, younger_bytes=nbytes, younger_count=count) if count else finding)
    return out


_KERNEL_LAYERS = [Layer.KERNEL_SLAB.value, Layer.KERNEL_PAGE.value]


def _held_reasons(allocations: pd.DataFrame, held: pd.DataFrame, ends: np.ndarray, known: KnownChains,
                  startup: np.ndarray, state: pd.DataFrame) -> np.ndarray:
    """Per held row, a LeakReason value: "memprof_own" (memprof's BPF programs, uprobes or
    agent: any layer), else for kernel rows "address_space", "slab_pages" (the slab
    allocator's pages and its bookkeeping of them), "kernel_cache" (a cache chain that
    outlived the process), else "cached_segment" (no live block inside) or "model_state" (a
    segment whose live blocks are all model state, the allocations in `state`), else
    "threads" (kernel objects of a thread), else for user-space rows "framework_state" (a
    training framework's own, `known.framework_state`), else "startup" (`startup`, per held
    row: _at_startup; for every held allocation of the chain), else "held"."""
    reason = np.full(len(held), LeakReason.HELD.value, dtype=object)
    stack = held["stack_id"]
    is_kernel = np.isin(held["layer"].to_numpy(), _KERNEL_LAYERS)
    reason[_whole_chains(held, startup)] = LeakReason.STARTUP.value
    reason[~is_kernel & _in(stack, known.framework_state)] = LeakReason.FRAMEWORK_STATE.value
    reason[is_kernel & _in(stack, known.threads)] = LeakReason.THREADS.value
    if (held["layer"] == Layer.CUDA_SEGMENT.value).any():
        segment = _segment_reasons(allocations, ends, state)[held.index.to_numpy()]
        reason = np.where(segment != None, segment, reason)  # noqa: E711  (element-wise)
    reason[_in(stack, known.cache) & is_kernel & ~held["released_at_exit"].to_numpy()] = LeakReason.KERNEL_CACHE.value
    # Both kernel layers: its pages (kernel_page) and what it kmallocs for its own bookkeeping
    # (kernel_slab: a page's alloc_slab_obj_exts vector, a cache's sheaves) are its own.
    reason[is_kernel & _in(stack, known.slab_pages)] = LeakReason.SLAB_PAGES.value
    reason[is_kernel & _in(stack, known.address_space)] = LeakReason.ADDRESS_SPACE.value
    reason[_in(stack, known.memprof)] = LeakReason.MEMPROF_OWN.value
    return reason


def _segment_reasons(allocations: pd.DataFrame, ends: np.ndarray, state: pd.DataFrame) -> np.ndarray:
    """Per allocation: "cached_segment" for a CUDA segment with no live block inside at the
    end, "model_state" for one whose live blocks are all model state (it is the model's
    memory too, one layer out), None otherwise. `state`: the model-state allocations, apart
    from `allocations`."""
    own, of_state = blocks_inside(allocations, ends, allocations), blocks_inside(allocations, ends, state)
    is_segment = labels(allocations["layer"]) == Layer.CUDA_SEGMENT.value
    out = np.full(len(allocations), None, dtype=object)
    out[is_segment & (own == 0) & (of_state == 0)] = LeakReason.CACHED_SEGMENT.value
    out[is_segment & (own == 0) & (of_state > 0)] = LeakReason.MODEL_STATE.value
    return out


def _in(stack_ids: pd.Series, ids: frozenset[int]) -> np.ndarray:
    """Per row: its stack id is one of `ids` (False for a null id)."""
    if not ids:
        return np.zeros(len(stack_ids), dtype=bool)
    return stack_ids.isin(list(ids)).to_numpy(dtype=bool, na_value=False)


def _at_startup(allocations: pd.DataFrame, held: pd.DataFrame, known: KnownChains,
                setup_end_ns: int | None, attached_pids: frozenset[int]) -> np.ndarray:
    """Per held row: made at start-up. In any layer, by start-up work its frames show
    (`known.startup`: an import, the dynamic loader, exec), or before its process first ran
    Python code (the interpreter starting, _before_python: CPython's own heap and the files
    libc opens; nothing of the program exists yet), unless the process was already running
    when the recording began (`attached_pids`). For kernel objects (the files, sockets and
    threads a program opens as it starts) also before `setup_end_ns` (the end of the first
    step: the program's set-up). User-space memory made at set-up (a model's weights) is the
    program's data, and stays a finding."""
    rows = held.index.to_numpy()
    interpreter = _before_python(allocations, rows, known.python, known.startup)
    if attached_pids and interpreter.any():
        pid = allocations["pid"].to_numpy(dtype=np.int64, na_value=-1)[rows]
        interpreter &= ~np.isin(pid, list(attached_pids))
    set_up = np.zeros(len(held), dtype=bool)
    if setup_end_ns is not None:
        set_up = held["alloc_ts_ns"].to_numpy(dtype=np.int64) < setup_end_ns
    is_kernel = np.isin(held["layer"].to_numpy(), _KERNEL_LAYERS)
    return _in(held["stack_id"], known.startup) | interpreter | (set_up & is_kernel)


def _before_python(allocations: pd.DataFrame, rows: np.ndarray, python_stacks: frozenset[int],
                   startup_stacks: frozenset[int] = frozenset()) -> np.ndarray:
    """Per allocation at `rows` (positions): made before its process first ran the program's
    Python code, on any thread (a worker that leaks while the main thread waits is Python
    code too): its first allocation with a Python frame that is not start-up work (an import:
    `startup_stacks`), or, in a process whose Python allocations were all imports, its first
    with a Python frame. Between the two the interpreter is still starting: CPython's C code
    copies its configuration and builds its modules with no Python frame on the stack, between
    the imports of its encodings and site (`record --native-sample-bytes 0`: 10 findings in a
    `time.sleep` script before 2026-12-07). Only in a process whose main thread (tid = pid)
    has Python frames: where they were not read for it (CPython 3.10's main thread without
    +native), nothing is start-up."""
    out = np.zeros(len(rows), dtype=bool)
    if not python_stacks or not len(rows):
        return out
    # Masks over every allocation, not positions: nearly all of them can have Python frames,
    # and gathers through 5·10^6 positions took 0.4 s of the leak report (bench/analysis_speed.py).
    pid = allocations["pid"].to_numpy(dtype=np.int64, na_value=-1)
    is_python = _in(allocations["stack_id"], python_stacks)
    on_main = is_python & (pid == allocations["tid"].to_numpy(dtype=np.int64, na_value=-2))
    # Only the processes of `rows` whose main thread ran Python matter: usually one or a few.
    wanted = np.intersect1d(pid[rows], pd.unique(pid[on_main]))
    if not len(wanted):
        return out
    ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    pids, firsts = _first_python_ns(pid, ts, is_python, wanted)
    if startup_stacks:
        program = is_python & ~_in(allocations["stack_id"], startup_stacks)
        later_pids, later = _first_python_ns(pid, ts, program, wanted)
        firsts = firsts.copy()
        firsts[np.isin(pids, later_pids)] = later[np.searchsorted(later_pids, pids[np.isin(pids, later_pids)])]
    if not len(pids):
        return out
    at = np.minimum(np.searchsorted(pids, pid[rows]), len(pids) - 1)
    return (pids[at] == pid[rows]) & (ts[rows] < firsts[at])


# Up to this many processes, each one's first Python allocation is one masked pass over the
# allocations (~15 ms per 5·10^6 here); past it, one groupby over all of them (~0.15 s).
_PASS_PER_PROCESS_UP_TO = 8


def _first_python_ns(pid: np.ndarray, ts: np.ndarray, is_python: np.ndarray,
                     wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pids ascending, ns of each one's first allocation with Python frames), for the pids
    `wanted` (unique) that have one."""
    if len(wanted) > _PASS_PER_PROCESS_UP_TO:
        # kind="table": a lookup over the pids' range (numpy's default sorted all 5·10^6: 0.2 s)
        python = is_python & np.isin(pid, wanted, kind="table")
        first = pd.Series(ts[python]).groupby(pid[python]).min()  # sorted by pid
        return first.index.to_numpy(dtype=np.int64), first.to_numpy(dtype=np.int64)
    found = [(p, ts[is_python & (pid == p)]) for p in wanted.tolist()]
    found = [(p, int(t.min())) for p, t in found if len(t)]
    return np.array([p for p, _ in found], dtype=np.int64), np.array([t for _, t in found], dtype=np.int64)


def _whole_chains(held: pd.DataFrame, mask: np.ndarray) -> np.ndarray:
    """`mask`, kept only where it holds for every held row of the same (layer, stack_id,
    released_at_exit) chain."""
    keys = [held["layer"].to_numpy(), held["stack_id"].to_numpy(dtype=np.int64, na_value=-1),
            held["released_at_exit"].to_numpy()]
    return pd.Series(mask).groupby(keys).transform("all").to_numpy(dtype=bool)


def _sorted_groups(held: pd.DataFrame) -> pd.DataFrame:
    groups = held.groupby(["layer", "stack_id", "released_at_exit", "reason"], dropna=False, sort=False).agg(
        live_bytes=("size_bytes", "sum"), live_count=("weight", "sum"),
        first_ns=("alloc_ts_ns", "min"), last_ns=("alloc_ts_ns", "max"), judged_ns=("judged_ns", "max"),
    ).reset_index()
    return groups.sort_values(["live_bytes", "live_count", "stack_id", "layer", "released_at_exit"],
                              ascending=[False, False, True, True, True], na_position="last", kind="stable")


def _biggest_first(findings: list[LeakFinding]) -> list[LeakFinding]:
    return sorted(findings, key=lambda f: (-f.live_bytes, -f.live_count, f.stack_id is None, f.stack_id or 0))


def _missed_by_chain(allocations: pd.DataFrame) -> dict[tuple[str, int | None], int]:
    """(layer, stack_id) -> allocations closed as missed frees."""
    missed = allocations[(allocations["end_kind"] == "missed").to_numpy()]  # compares category codes
    if missed.empty:
        return {}
    counts = missed.assign(layer=labels(missed["layer"])).groupby(["layer", "stack_id"], dropna=False).size()
    return {(layer, None if pd.isna(sid) else int(sid)): int(n) for (layer, sid), n in counts.items()}


_KIND_OF_REASON = {LeakReason.HELD.value: LeakKind.HELD_AT_END.value,
                   LeakReason.GROWS.value: LeakKind.GROWS_PER_STEP.value}


def _finding(row, missed_by_chain: dict, trends: ChainTrends, target_exited: bool) -> LeakFinding:
    span_s = (int(row.judged_ns) - int(row.first_ns)) / 1e9
    live_bytes = int(round(row.live_bytes))
    stack_id = None if pd.isna(row.stack_id) else int(row.stack_id)
    trend = trends.by_chain.get((row.layer, stack_id))
    reason = _reason(row.reason, trend, target_exited, trends.checkpoints is not None and trends.checkpoints.by_step)
    return LeakFinding(
        chain_missed_frees=missed_by_chain.get((row.layer, stack_id), 0),
        layer=row.layer, stack_id=stack_id,
        live_bytes=live_bytes, live_count=int(round(row.live_count)), first_ns=int(row.first_ns),
        last_ns=int(row.last_ns), growth_bytes_per_s=live_bytes / span_s if span_s > 0 else 0.0,
        released_at_exit=bool(row.released_at_exit), kind=_KIND_OF_REASON.get(reason, LeakKind.NOT_A_LEAK.value),
        reason=reason,
        **_trend_fields(trend, trends),
    )


def _reason(held_reason: str, trend: Trend | None, target_exited: bool, by_step: bool) -> str:
    """Why a held group is what it is. Memory held on purpose wins over a trend, except
    start-up work and threads, which are leaks when they grow. A plateau is
    a cache that filled only in a job that did not exit, judged at its steps: what a command
    holds at exit is never freed by it, and without steps a burst of allocations that is then
    held (a leak at start-up) looks the same over time windows."""
    if held_reason in _GROWTH_WINS and trend is not None and trend.shape == "grows":
        return LeakReason.GROWS.value
    if held_reason != LeakReason.HELD.value or trend is None:
        return held_reason
    if trend.shape in ("grows", "sawtooth") or (trend.shape == "plateau" and not target_exited and by_step):
        return trend.shape
    return LeakReason.HELD.value


def _trend_fields(trend: Trend | None, trends: ChainTrends) -> dict:
    if trend is None:
        points = len(trends.checkpoints.times_ns) if trends.checkpoints is not None else 0
        return {"points": points}
    period = trends.checkpoints.period_ns
    plateau = None if trend.plateau_from is None else int(trends.checkpoints.labels[trend.plateau_from])
    per_point = trends.checkpoints.units_per_point  # the trend's slopes are per checkpoint
    within = None if trend.within_slope is None else trend.within_slope / per_point
    return dict(slope_bytes_per_step=trend.slope / per_point,
                slope_bytes_per_s=trend.slope * 1e9 / period if period else None,
                confidence=trend.confidence, rises=trend.rises, points=len(trends.checkpoints.times_ns),
                resets=trend.resets, plateau_from=plateau, within_slope_bytes_per_step=within)


def _released_growth_findings(trends: ChainTrends, held: pd.DataFrame, allocations: pd.DataFrame) -> list[LeakFinding]:
    """Findings for chains that grew over the checkpoints but held nothing at the end, by
    their highest checkpoint, as the curve shows them:
    - grows per step, when the number of its live allocations grew too: a loop that keeps
      something from every step or request, freed only on the way out (the list goes when
      `main` returns, before the interpreter finalizes);
    - not a leak (GROWS_WITHIN), when it grew in bytes only: the same few buffers made larger
      each step, then released (a request's KV cache, grown by torch.cat each token and
      freed when generate returns)."""
    held_chains = _chains_of(held)
    grown = [chain for chain in trends.growing if chain not in held_chains]
    if not grown:
        return []
    firsts = _alloc_span_of_chains(allocations, trends, grown)
    findings = []
    for chain in grown:
        peak_bytes, _, at = trends.peak_of(chain)
        span_s = (int(trends.checkpoints.times_ns[at]) - firsts[chain][0]) / 1e9
        accumulates = _count_grew(trends, chain, at)
        findings.append(_at_peak(
            trends, chain, firsts[chain], growth_bytes_per_s=peak_bytes / span_s if span_s > 0 else 0.0,
            released_before_end=True, kind=(LeakKind.GROWS_PER_STEP if accumulates else LeakKind.NOT_A_LEAK).value,
            reason=(LeakReason.GROWS if accumulates else LeakReason.GROWS_WITHIN).value))
    return findings


def _at_peak(trends: ChainTrends, chain: tuple, alloc_span: tuple[int, int], **fields) -> LeakFinding:
    """A finding for a chain that held nothing at the end, by its highest checkpoint (what the
    user sees rise in its curve); `alloc_span`: (first, last) alloc ns of its allocations."""
    layer, stack_id = chain
    peak_bytes, peak_count, _ = trends.peak_of(chain)
    return LeakFinding(layer=layer, stack_id=stack_id, live_bytes=int(round(peak_bytes)),
                       live_count=int(round(peak_count)), first_ns=alloc_span[0], last_ns=alloc_span[1],
                       released_at_exit=False, **_trend_fields(trends.by_chain[chain], trends), **fields)


def _count_grew(trends: ChainTrends, chain: tuple, peak_at: int) -> bool:
    """Whether the chain held more allocations at its highest checkpoint than at the first
    checkpoint where it held any."""
    counts = trends.series.live_count[trends.series.row_of[chain]]
    held = np.flatnonzero(counts > 0)
    return bool(len(held) and counts[peak_at] > counts[held[0]])


def _chains_of(held: pd.DataFrame) -> set:
    """(layer, stack_id or None) of the held groups."""
    return set(zip(held["layer"], held["stack_id"].astype(object).where(held["stack_id"].notna(), None)))


def _shape_only_findings(trends: ChainTrends, held: pd.DataFrame, allocations: pd.DataFrame,
                         top: int | None) -> tuple[list[LeakFinding], int]:
    """(not-a-leak findings for the sawtooth and plateau chains that held nothing at the end,
    by their highest checkpoint: what the user sees rise in the curve, explained; how many
    such chains there are). Only the `top` biggest are built, in _biggest_first's order, so
    that they hold every one of them the `top` biggest of all not-leaks can take: a third of
    the chains on a churning workload are sawtooths (11,709 on bench/analysis_speed.py's
    recording), and `report leaks` shows ten."""
    held_chains = _chains_of(held)
    shaped = [(chain, t) for chain, t in trends.by_chain.items()
              if t.shape in ("sawtooth", "plateau") and chain not in held_chains]
    if not shaped:
        return [], 0
    # The highest checkpoint of every shaped chain at once, as trends.peak_of takes it (the first).
    rows = np.array([trends.series.row_of[chain] for chain, _ in shaped])
    at = trends.series.live_bytes[rows].argmax(axis=1)
    peak_bytes = np.round(trends.series.live_bytes[rows, at]).astype(np.int64).tolist()
    peak_count = np.round(trends.series.live_count[rows, at]).astype(np.int64).tolist()
    order = sorted(range(len(shaped)), key=lambda i: (-peak_bytes[i], -peak_count[i], shaped[i][0][1] is None,
                                                      shaped[i][0][1] or 0))
    chosen = [shaped[i] for i in order[:top]]
    firsts = _alloc_span_of_chains(allocations, trends, [chain for chain, _ in chosen])
    return [_at_peak(trends, chain, firsts[chain], growth_bytes_per_s=0.0, kind=LeakKind.NOT_A_LEAK.value,
                     reason=trend.shape, released_before_end=True) for chain, trend in chosen], len(shaped)


def _alloc_span_of_chains(allocations: pd.DataFrame, trends: ChainTrends, chains: list) -> dict:
    """(layer, stack_id) -> (earliest, latest) alloc ts_ns of the chain's allocations that were
    live at a checkpoint (those are the ones its curve shows)."""
    rows = np.flatnonzero(np.isin(trends.chain_of_row, [trends.series.row_of[chain] for chain in chains]))
    frame = pd.DataFrame({"chain": trends.chain_of_row[rows],
                          "ts": allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)[rows]})
    spans = frame.groupby("chain")["ts"].agg(["min", "max"])
    return {trends.series.chains[row]: (int(lo), int(hi)) for row, lo, hi in zip(spans.index, spans["min"], spans["max"])}


def exit_times(events: pd.DataFrame) -> dict[int, int]:
    """pid -> when it began to exit: the earliest `mark`/"exit" event of each process."""
    marks = events.loc[(events["action"] == Action.MARK.value) & (events["category"] == Mark.EXIT.value), ["pid", "ts_ns"]]
    return {int(pid): int(ts) for pid, ts in marks.groupby("pid")["ts_ns"].min().items()}


def end_of_target(events: pd.DataFrame, root_pid: int | None, recording_end_ns: int) -> int:
    """When the root process began to exit: the earliest `mark`/"exit" event of `root_pid`,
    or `recording_end_ns` when it did not exit while recorded (attached, or still running)."""
    if root_pid is None:
        return int(recording_end_ns)
    return min(exit_times(events).get(int(root_pid), int(recording_end_ns)), int(recording_end_ns))


def chain_frames(stacks: pd.DataFrame, frames: pd.DataFrame, stack_ids: Iterable,
                 native_frames: str = DEFAULT_NATIVE_FRAMES) -> dict[int, list[dict]]:
    """Frames of each stack, innermost (depth 0) first, as dicts with keys kind, function,
    module, file, line (None where unknown). Null ids are skipped; an id with no stack rows
    maps to []. `native_frames`: "merged" drops the interpreter's eval-loop frames from chains
    that hold the Python frames they ran (the chain reads as its author wrote it); "all"
    keeps every native frame."""
    check_native_frames(native_frames)
    ids = sorted({int(i) for i in stack_ids if i is not None and not pd.isna(i)})
    chains: dict[int, list[dict]] = {i: [] for i in ids}
    rows = stacks[stacks["stack_id"].isin(ids)].merge(frames, on="frame_id", how="left")
    for row in rows.sort_values(["stack_id", "depth"]).itertuples(index=False):
        chains[int(row.stack_id)].append({key: _value(getattr(row, key)) for key in FRAME_KEYS})
    if native_frames == NativeFrames.MERGED:
        chains = {i: _without_eval_loop(chain) for i, chain in chains.items()}
    return chains


def _without_eval_loop(chain: list[dict]) -> list[dict]:
    if not any(frame["kind"] == FrameKind.PYTHON.value for frame in chain):
        return chain
    return [f for f in chain if not (f["kind"] == FrameKind.NATIVE.value and f["function"] in EVAL_LOOP_FUNCTIONS)]


def _value(value):
    if value is None or value is pd.NA or (not isinstance(value, str) and pd.isna(value)):
        return None
    return int(value) if isinstance(value, (int, np.integer, float, np.floating)) else str(value)
