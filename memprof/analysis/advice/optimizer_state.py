"""Advice rule `optimizer-state`: optimizer state dominates the model state.

The agent names the model's own tensors by role (parameter, buffer, gradient,
optimizer_state: memprof.analysis.model_state); the leak analysis totals them by role, layer
and device at the end (or at the model state's peak before it: LeakResult.model_state). Where
the optimizer's state is most of that (Adam keeps two fp32 tensors per parameter: 2× the
parameters), an 8-bit optimizer keeps a quarter of it, and sharding it over data-parallel
ranks (ZeRO-1, FSDP) keeps 1/N per rank. A fused optimizer saves time, not memory.

Pure: reads the recording's analyses through Facts; sizes in bytes.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from memprof.analysis.advice.chain_text import frame_label, innermost_python, user_frame
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import end_times, labels, live_mask
from memprof.analysis.model_state import ROLES, state_roles
from memprof.model.schema import STATE_PREFIX, ModelStateRole
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.model_state import ModelStateTotal

OPTIMIZER_STATE_SHARE = Threshold(
    "OPTIMIZER_STATE_SHARE", 0.4, "fraction",
    "optimizer state's share of the model state (parameters, buffers, gradients, optimizer state) at or above "
    "this: it dominates (Adam's is 1/2 with gradients held, 2/3 without; SGD without momentum has none)")
MIN_OPTIMIZER_STATE_BYTES = Threshold(
    "MIN_OPTIMIZER_STATE_BYTES", float(1 << 20), "bytes",
    "less optimizer state than this in a layer is not worth changing the optimizer for")
THRESHOLDS: tuple[Threshold, ...] = (OPTIMIZER_STATE_SHARE, MIN_OPTIMIZER_STATE_BYTES)

STATE = ModelStateRole.OPTIMIZER_STATE.value
PARAMETER = ModelStateRole.PARAMETER.value
EIGHT_BIT_KEEPS = 0.25   # 8-bit state is 1 byte per value where fp32 state is 4
ZERO_RANKS = 8           # the rank count the ZeRO-1 figure is given for (it saves (N−1)/N)
TOP_CHAINS = 3


@dataclass(frozen=True)
class _Place:
    """The model state of one (layer, device): bytes and tensor counts by role."""

    layer: str
    device: str
    bytes_by_role: dict[str, int]
    count_by_role: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.bytes_by_role.values())

    @property
    def state(self) -> int:
        return self.bytes_by_role.get(STATE, 0)

    @property
    def share(self) -> float:
        return self.state / self.total if self.total else 0.0


def check(facts: Facts) -> Verdict:
    """Advice for each (layer, device) whose optimizer state reaches both thresholds."""
    # top=None: the leak analysis autograd-graph-kept and memory-outside-pytorch ask for (kept
    # per options); model_state does not depend on the cut.
    totals = facts.leaks(top=None).result.model_state
    if not totals:
        return silent("no model state recorded (the agent names parameters, gradients and optimizer state "
                      "of a PyTorch job; record without --no-agent)")
    places = _places(totals)
    if not any(place.state for place in places):
        return silent("no optimizer state among the model state (an optimizer without state, e.g. SGD "
                      "without momentum, or no optimizer step recorded)")
    heavy = [place for place in places if _dominates(place)]
    if not heavy:
        biggest = max(places, key=lambda place: place.share)
        return silent(f"optimizer state is {biggest.share:.0%} of the model state ({format_bytes(biggest.state)} in "
                      f"{biggest.layer}), under {OPTIMIZER_STATE_SHARE.name} {OPTIMIZER_STATE_SHARE.value:.0%} "
                      f"or {MIN_OPTIMIZER_STATE_BYTES.name} {format_bytes(MIN_OPTIMIZER_STATE_BYTES.value)}")
    peaks = {stats.layer: stats.peak_bytes for stats in facts.layers().result.layers}
    return fired(*(_advice(facts, place, peaks.get(place.layer), _state_tensors(facts, place)) for place in heavy))


def _places(totals: list[ModelStateTotal]) -> list[_Place]:
    """The model-state totals grouped by (layer, device), in their order."""
    grouped: dict[tuple[str, str], tuple[Counter, Counter]] = defaultdict(lambda: (Counter(), Counter()))
    for total in totals:
        sizes, counts = grouped[(total.layer, total.device)]
        sizes[total.role] += total.live_bytes
        counts[total.role] += total.count
    return [_Place(layer, device, dict(sizes), dict(counts)) for (layer, device), (sizes, counts) in grouped.items()]


def _dominates(place: _Place) -> bool:
    return place.state >= MIN_OPTIMIZER_STATE_BYTES.value and place.share >= OPTIMIZER_STATE_SHARE.value


@dataclass(frozen=True)
class _Tensors:
    """The optimizer-state allocations of one place: bytes by state kind (the name's last
    part: exp_avg, exp_avg_sq, step, momentum_buffer…) and the chains that made the most."""

    bytes_by_kind: dict[str, int]
    chains: tuple[int | None, ...]


def _state_tensors(facts: Facts, place: _Place) -> _Tensors:
    """This place's optimizer-state allocations live at the state's own peak (the earliest
    time most of it was live), by kind and chain. (Names are not unique: two modules of one
    class name their state alike, so each allocation counts, not each name.)"""
    allocations = facts.lifetimes.allocations
    rows = allocations[(state_roles(allocations) == STATE)
                       & (labels(allocations["layer"]) == place.layer)
                       & (labels(allocations["device"]) == place.device)]
    if rows.empty:
        return _Tensors({}, ())
    alloc_ts, end_ts = rows["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(rows)
    sizes = rows["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    times, live = live_curve(alloc_ts, end_ts, sizes)
    rows = rows[live_mask(alloc_ts, end_ts, times[int(np.argmax(live))])]
    by_kind: Counter = Counter()
    for name, size in zip(labels(rows["category"]), rows["size_bytes"].to_numpy(dtype=np.int64, na_value=0)):
        by_kind[name[len(STATE_PREFIX) + len(STATE) + 1:].rpartition(".")[2]] += int(size)
    return _Tensors(dict(by_kind.most_common()), _top_chains(facts, rows))


def _top_chains(facts: Facts, rows) -> tuple[int | None, ...]:
    """The stack ids that made the most optimizer-state bytes, one per distinct chain."""
    stacks = rows["stack_id"].to_numpy(dtype=np.int64, na_value=-1)  # -1: recorded without a stack
    per_stack = pd.Series(rows["size_bytes"].to_numpy(dtype=float, na_value=0.0)).groupby(stacks, sort=False).sum()
    by_stack = Counter({None if stack < 0 else int(stack): size for stack, size in per_stack.items()})
    frames = facts.chains([s for s in by_stack if s is not None])
    seen, chosen = set(), []
    for stack, _ in by_stack.most_common():
        key = None if stack is None else tuple((f.get("function"), f.get("file"), f.get("line"))
                                               for f in frames.get(stack, []))
        if key not in seen:
            seen.add(key)
            chosen.append(stack)
    return tuple(chosen[:TOP_CHAINS])


def _advice(facts: Facts, place: _Place, layer_peak: int | None, tensors: _Tensors) -> Advice:
    state, params = place.state, place.bytes_by_role.get(PARAMETER, 0)
    multiple = state / params if params else None
    peak_share = state / layer_peak if layer_peak else None
    saving = int(state * (1 - EIGHT_BIT_KEEPS))
    zero_saving = state * (ZERO_RANKS - 1) // ZERO_RANKS
    numbers = {"optimizer_state_bytes": state, "optimizer_state_tensors": place.count_by_role.get(STATE, 0),
               "bytes_by_role": {role: place.bytes_by_role.get(role, 0) for role in ROLES},
               "model_state_bytes": place.total, "share_of_model_state": place.share,
               "multiple_of_parameters": multiple, "layer_peak_bytes": layer_peak, "share_of_layer_peak": peak_share,
               "bytes_by_kind": tensors.bytes_by_kind, "eight_bit_saving_bytes": saving,
               "zero1_ranks": ZERO_RANKS, "zero1_saving_bytes": zero_saving}
    return Advice(
        rule=RULE_ID,
        title=f"Optimizer state is {place.share:.0%} of the model state ({format_bytes(state)} in {place.layer})",
        evidence=_evidence(place, multiple, layer_peak, peak_share, tensors) + _made_where(facts, tensors.chains),
        change=("use an 8-bit optimizer (bitsandbytes, e.g. bnb.optim.AdamW8bit for AdamW), or shard the optimizer "
                "state over the data-parallel ranks (ZeRO-1: torch.distributed.optim.ZeroRedundancyOptimizer or "
                "DeepSpeed stage 1; FSDP shards it with the parameters); a fused optimizer (fused=True) is faster "
                "but keeps the same state"),
        saving=(f"about {format_bytes(saving)} less with 8-bit state: it is 1/4 of fp32 state, so 3/4 of the "
                f"{format_bytes(state)} of optimizer state (assumes fp32 state); or with ZeRO-1 over N ranks "
                f"(N−1)/N of it per rank: {format_bytes(zero_saving)} per rank over {ZERO_RANKS} ranks"),
        saving_bytes=saving, chains=tensors.chains, layer=place.layer, device=place.device, numbers=numbers)


def _evidence(place: _Place, multiple: float | None, layer_peak: int | None, peak_share: float | None,
              tensors: _Tensors) -> tuple[str, ...]:
    state = place.state
    roles = ", ".join(f"{role}s {format_bytes(place.bytes_by_role.get(role, 0))}"
                      for role in ROLES if role != STATE)
    kinds = ", ".join(f"{kind} {format_bytes(size)}" for kind, size in tensors.bytes_by_kind.items())
    lines = [f"The optimizer state holds {format_bytes(state)} in {place.layer} on {place.device} "
             f"({place.count_by_role.get(STATE, 0)} tensors{': ' + kinds if kinds else ''}), "
             f"{place.share:.0%} of the model state's {format_bytes(place.total)} ({roles})."]
    if multiple is not None:
        lines.append(f"It is {multiple:.2f}× the parameters' {format_bytes(place.bytes_by_role[PARAMETER])} "
                     "(Adam keeps 2×: exp_avg and exp_avg_sq per parameter).")
    if peak_share is not None:
        lines.append(f"It is {peak_share:.0%} of {place.layer}'s peak of {format_bytes(layer_peak)}.")
    return tuple(lines)


def _made_where(facts: Facts, chains: tuple[int | None, ...]) -> tuple[str, ...]:
    """Where the biggest chain made the state: its innermost Python frame and the first
    one outside installed packages (the program's own line), when it has them."""
    frames = facts.chains([chains[0]]).get(chains[0], []) if chains and chains[0] is not None else []
    python = innermost_python(frames)
    if python is None:
        return ()
    own = user_frame(frames)
    where = f"Most of it was made in {frame_label(python)}"
    return (where + (f", called from {frame_label(own)}." if own is not None and own is not python else "."),)


RULE_ID = "optimizer-state"
RULE = Rule(
    id=RULE_ID,
    title="Optimizer state dominates the model state",
    trigger=(f"the tensors the agent named optimizer state are at least {OPTIMIZER_STATE_SHARE.name} of the model "
             f"state in a layer and device, and at least {MIN_OPTIMIZER_STATE_BYTES.name}"),
    evidence=("bytes per role (parameters, buffers, gradients, optimizer state) and per state kind (exp_avg, "
              "exp_avg_sq, …), the state as a multiple of the parameters, its share of the layer's peak, and the "
              "chains that allocated it"),
    advice=("an 8-bit optimizer (bitsandbytes), or ZeRO-1/FSDP sharding of the optimizer state over data-parallel "
            "ranks; a fused optimizer saves time, not memory"),
    saving=("3/4 of the optimizer state's bytes (8-bit state is 1/4 of fp32 state); ZeRO-1 over N ranks "
            "saves (N−1)/N of it per rank instead, given for 8 ranks"),
    thresholds=THRESHOLDS,
    check=check,
    needs="the agent (model state is named by it; not with --no-agent)",
)
