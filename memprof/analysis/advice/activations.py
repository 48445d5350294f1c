"""Advice rule `activations-peak`: activations make the peak.

Judged at the peak of each tensor layer (cuda_block, torch_cpu), in a recording where a
backward ran (activations outlive their forward only for a backward). The activations are the
allocations live at the peak that were made inside nn.Module forwards during the peak's step
(from its step mark on: what earlier steps left is a leak's, autograd-graph-kept's) and are
not model state (parameters, buffers, gradients, optimizer state: "state:ROLE:NAME"). When
they are ACTIVATION_SHARE_OF_PEAK of the peak or more, and MIN_ACTIVATION_BYTES at least, the
rule gives the bytes per module and suggests activation checkpointing or micro-batching.

"Inside a forward": with module paths (record --torch-modules), an allocation the timeline gave
a module path; without them, one whose chain passes Module._call_impl. Without module paths
the advice names the user's lines in the forwards that hold the most instead of modules, and
its saving is micro-batching's alone (checkpointing's needs to know which module made what).

The checkpointing estimate (module paths): checkpointing a module keeps of it only its input,
which is the output of the module before it. For each candidate parent (a module path or the
outermost module), checkpointing each of its children C that hold activations at the peak
frees Σ (A_C − O_C) − max A_C, where A_C is what C and the modules inside it hold at the peak
and O_C its outputs (per call, the last of its allocations still live at the peak: the next
module's input, which stays); the max is one child recomputed at a time during backward, which
brings its activations back. The parent whose children free the most is named. Micro-batching
in two (gradient accumulation) leaves about half the activations: activations scale with the
batch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from memprof.analysis.advice.chain_text import user_frame, where
from memprof.analysis.advice.forwards import backward_ran, in_forward, step_began
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.layers import weighted_bytes
from memprof.analysis.lifetimes import end_times, labels, live_mask
from memprof.analysis.model_state import state_roles
from memprof.model.schema import Layer
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts

ACTIVATION_SHARE = Threshold(
    "ACTIVATION_SHARE_OF_PEAK", 0.5, "fraction",
    "the activations' share of the layer's peak at or above which they make it")
MIN_ACTIVATIONS = Threshold(
    "MIN_ACTIVATION_BYTES", 4 * (1 << 20), "bytes",
    "activations at the peak below which checkpointing is not worth its recomputation")
THRESHOLDS: tuple[Threshold, ...] = (ACTIVATION_SHARE, MIN_ACTIVATIONS)
TENSOR_LAYERS = (Layer.CUDA_BLOCK.value, Layer.TORCH_CPU.value)
SHOWN = 5  # modules or lines the evidence names
MICRO_BATCHES = 2  # the micro-batching the saving is computed for
_NUMBERED = re.compile(r"(?<=\.)[0-9]+$|^[0-9]+$")


@dataclass(frozen=True)
class Peak:
    """One layer at its peak: when, how much, what of it is model state, and the activations
    (a frame: module, stack_id, tid, alloc_ts, bytes; one row per live allocation)."""

    layer: str
    ts_ns: int
    live_bytes: int
    state_bytes: int
    step_began_ns: int | None
    activations: pd.DataFrame

    @property
    def activation_bytes(self) -> int:
        return int(self.activations["bytes"].sum())


@dataclass(frozen=True)
class Plan:
    """Checkpointing each of `children` (paths, most bytes first) of `parent`: what they hold
    at the peak (`held`, per child), what stays (their outputs), the largest one recomputed
    during backward, and the saving that leaves."""

    parent: str
    children: list[str]
    held: dict[str, int]
    outputs_bytes: int
    recomputed_bytes: int

    @property
    def saving_bytes(self) -> int:
        return sum(self.held.values()) - self.outputs_bytes - self.recomputed_bytes


def check(facts: Facts) -> Verdict:
    """Advice per tensor layer whose peak is made of the peak step's activations."""
    if not backward_ran(facts):
        return silent("no backward ran in this recording: activations outlive their forward only for a backward")
    tracked = _modules_tracked(facts)
    peaks = [_peak(facts, layer, tracked) for layer in TENSOR_LAYERS]
    peaks = [p for p in peaks if p is not None]
    if not peaks:
        return silent("no tensor layer (torch_cpu, cuda_block) in this recording")
    advice = [_advice(facts, p, tracked) for p in peaks if _makes_the_peak(p)]
    if advice:
        return fired(*advice)
    return silent("; ".join(f"{p.layer}'s activations at its peak: {format_bytes(p.activation_bytes)} of "
                            f"{format_bytes(p.live_bytes)} ({_share(p):.0%}), under "
                            f"{ACTIVATION_SHARE.value:.0%} or {format_bytes(int(MIN_ACTIVATIONS.value))}"
                            for p in peaks))


def _modules_tracked(facts: Facts) -> bool:
    allocations = facts.lifetimes.allocations
    return "module" in allocations and bool(allocations["module"].notna().any())


def _share(peak: Peak) -> float:
    return peak.activation_bytes / peak.live_bytes if peak.live_bytes else 0.0


def _makes_the_peak(peak: Peak) -> bool:
    return peak.activation_bytes >= MIN_ACTIVATIONS.value and _share(peak) >= ACTIVATION_SHARE.value


# --- the peak ---------------------------------------------------------------------------------

def _peak(facts: Facts, layer: str, tracked: bool) -> Peak | None:
    """The layer at its peak (attribution's moment), None when the layer has no allocations."""
    at = [row for row in facts.attribution(by="layer", at="peak", layers=(layer,), top=None).result.layers
          if row.layer == layer]
    if not at:
        return None
    ts_ns, live_bytes = int(at[0].ts_ns), int(at[0].live_bytes)
    allocations = facts.lifetimes.allocations
    mine = allocations[labels(allocations["layer"]) == layer]
    live = mine[live_mask(mine["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(mine), ts_ns)]
    size = weighted_bytes(live["size_bytes"].to_numpy(dtype=np.int64, na_value=0),
                          live["weight"].to_numpy(dtype=float, na_value=1.0))
    is_state = state_roles(live) != None  # noqa: E711  (element-wise, on an object array)
    began = step_began(facts.events, ts_ns)
    candidate = ~is_state & (live["alloc_ts_ns"].to_numpy(dtype=np.int64) >= (began if began is not None else 0))
    table = pd.DataFrame({
        "module": live["module"].astype(object).where(live["module"].notna(), None).to_numpy()
        if "module" in live else np.full(len(live), None, dtype=object),
        "stack_id": live["stack_id"].to_numpy(dtype=np.int64, na_value=-1),
        "tid": live["tid"].to_numpy(dtype=np.int64), "alloc_ts": live["alloc_ts_ns"].to_numpy(dtype=np.int64),
        "bytes": size})[candidate]
    table = table[_in_forwards(facts, table, tracked)]
    return Peak(layer=layer, ts_ns=ts_ns, live_bytes=live_bytes, state_bytes=int(size[is_state].sum()),
                step_began_ns=began, activations=table.sort_values(["tid", "alloc_ts"], kind="stable"))


def _in_forwards(facts: Facts, table: pd.DataFrame, tracked: bool) -> np.ndarray:
    """Per row: made inside a module's forward (its module path; untracked: its chain)."""
    if tracked:
        return table["module"].notna().to_numpy()
    ids = [int(s) for s in pd.unique(table["stack_id"]) if s >= 0]
    frames = facts.chains(ids)
    inside = {s for s in ids if in_forward(frames.get(s, []))}
    return table["stack_id"].isin(list(inside)).to_numpy()


# --- the checkpointing plan -------------------------------------------------------------------

def plan(activations: pd.DataFrame) -> Plan | None:
    """The parent whose children, each checkpointed, free the most at the peak (module
    docstring), None when no parent's children free anything. `activations`: the peak's
    activations (module, tid, alloc_ts, bytes), sorted by tid then alloc_ts."""
    paths = [p for p in pd.unique(activations["module"]) if p is not None]
    parents = sorted({ancestor for path in paths for ancestor in _ancestors(path)})
    plans = [p for p in (_plan_under(parent, activations) for parent in parents) if p is not None]
    best = max(plans, key=lambda p: (p.saving_bytes, -len(p.parent)), default=None)
    return best if best is not None and best.saving_bytes > 0 else None


def _ancestors(path: str) -> list[str]:
    """The proper ancestors of a module path, "" (the outermost module) first."""
    if path == "":
        return []
    parts = path.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts))]


def _plan_under(parent: str, activations: pd.DataFrame) -> Plan | None:
    child = np.array([_child(parent, m) for m in activations["module"]], dtype=object)
    if len({c for c in child if c is not None}) < 2:
        return None
    tid = activations["tid"].to_numpy()
    # A call: consecutive activations of one child on one thread, in the order they were made.
    starts = np.r_[True, (child[1:] != child[:-1]) | (tid[1:] != tid[:-1])]
    runs = pd.DataFrame({"child": child, "run": np.cumsum(starts), "bytes": activations["bytes"].to_numpy()})
    runs = runs[runs["child"].notna()]
    held = runs.groupby("child")["bytes"].sum()
    outputs = int(runs.groupby("run")["bytes"].last().sum())
    order = sorted(held.index, key=lambda c: (-int(held[c]), c))
    return Plan(parent=parent, children=order, held={c: int(held[c]) for c in order},
                outputs_bytes=outputs, recomputed_bytes=int(held.max()))


def _child(parent: str, module: str | None) -> str | None:
    """The child of `parent` that `module` is or is inside, None when neither."""
    if module is None or module == parent:
        return None
    if parent == "":
        return module.split(".")[0]
    if not module.startswith(parent + "."):
        return None
    return parent + "." + module[len(parent) + 1:].split(".")[0]


def group_name(paths: list[str]) -> str:
    """`blocks.*` for numbered siblings (blocks.0 … blocks.5), else the paths themselves."""
    patterns = {_NUMBERED.sub("*", p) for p in paths}
    return patterns.pop() if len(patterns) == 1 and len(paths) > 1 else ", ".join(paths)


# --- the advice -------------------------------------------------------------------------------

def _advice(facts: Facts, peak: Peak, tracked: bool) -> Advice:
    acts = peak.activation_bytes
    micro = acts - acts // MICRO_BATCHES
    at_s = (peak.ts_ns - facts.span.start_ns) / 1e9
    head = (f"At {peak.layer}'s peak ({format_bytes(peak.live_bytes)} at +{at_s:.2f}s), {format_bytes(acts)} "
            f"({_share(peak):.0%}) are activations: tensors made inside module forwards during that step, kept "
            f"for its backward. Model state (parameters, gradients, optimizer state) is "
            f"{format_bytes(peak.state_bytes)}, the rest {format_bytes(peak.live_bytes - acts - peak.state_bytes)}.")
    numbers = {"peak_bytes": peak.live_bytes, "peak_ns": peak.ts_ns, "activation_bytes": acts,
               "share": _share(peak), "state_bytes": peak.state_bytes, "micro_batch_saving_bytes": micro}
    chosen = plan(peak.activations) if tracked else None
    if chosen is not None:
        return _checkpoint_advice(peak, chosen, head, numbers, micro)
    return _micro_batch_advice(facts, peak, tracked, head, numbers, micro)


def _checkpoint_advice(peak: Peak, chosen: Plan, head: str, numbers: dict, micro: int) -> Advice:
    name = group_name(chosen.children)
    held = sum(chosen.held.values())
    per_module = ", ".join(f"{c} {format_bytes(b)}" for c, b in list(chosen.held.items())[:SHOWN])
    more = f" and {len(chosen.children) - SHOWN} more" if len(chosen.children) > SHOWN else ""
    evidence = (
        head,
        f"{len(chosen.children)} modules under {chosen.parent or 'the outermost module'} hold {format_bytes(held)} "
        f"of it (each with the modules inside it): {per_module}{more}.",
        f"Checkpointing each of {name} keeps of it only its output, the next one's input "
        f"({format_bytes(chosen.outputs_bytes)} in all), and recomputes one at a time during backward (the "
        f"largest holds {format_bytes(chosen.recomputed_bytes)}): {format_bytes(held)} − "
        f"{format_bytes(chosen.outputs_bytes)} − {format_bytes(chosen.recomputed_bytes)} = "
        f"{format_bytes(chosen.saving_bytes)} less at the peak.",
    )
    numbers = {**numbers, "modules": dict(chosen.held), "checkpoint": {
        "parent": chosen.parent, "modules": list(chosen.children), "held_bytes": held,
        "outputs_bytes": chosen.outputs_bytes, "recomputed_bytes": chosen.recomputed_bytes,
        "saving_bytes": chosen.saving_bytes}}
    return Advice(
        rule=RULE_ID, title=f"Activations make {peak.layer}'s peak: checkpoint {name}",
        evidence=evidence,
        change=(f"Wrap each of {name} in torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False) "
                f"(a Sequential: checkpoint_sequential), or split each batch into micro-batches with gradient "
                f"accumulation (in {MICRO_BATCHES}: about {format_bytes(micro)} less)."),
        saving=f"about {format_bytes(chosen.saving_bytes)} less at the {peak.layer} peak by checkpointing {name}",
        saving_bytes=chosen.saving_bytes, chains=(), modules=tuple(chosen.children), layer=peak.layer,
        numbers=numbers)


def _micro_batch_advice(facts: Facts, peak: Peak, tracked: bool, head: str, numbers: dict, micro: int) -> Advice:
    """Without a checkpointing plan: the bytes per module (tracked) or per forward line."""
    if tracked:
        held = peak.activations.groupby("module")["bytes"].sum().sort_values(ascending=False, kind="stable")
        holders = [(str(m), int(b)) for m, b in held.items()]
        where_text = "by module (innermost)"
        why = "no module's children would free anything checkpointed one by one"
        stacks: tuple = ()
    else:
        holders, stacks = _by_line(facts, peak.activations)
        where_text = "by the line of the forward that made them"
        why = "record with --torch-modules for module paths and a checkpointing estimate"
    shown = ", ".join(f"{h} {format_bytes(b)}" for h, b in holders[:SHOWN])
    numbers = {**numbers, ("modules" if tracked else "forward_lines"): dict(holders)}
    return Advice(
        rule=RULE_ID, title=f"Activations make {peak.layer}'s peak ({_share(peak):.0%} of it)",
        evidence=(head, f"Held at the peak {where_text}: {shown}.", f"No checkpointing estimate: {why}."),
        change=(f"Split each batch into micro-batches with gradient accumulation (in {MICRO_BATCHES}: about "
                f"{format_bytes(micro)} less), or checkpoint the blocks of the model that hold these "
                "(torch.utils.checkpoint.checkpoint, use_reentrant=False)."),
        saving=f"about {format_bytes(micro)} less at the {peak.layer} peak with {MICRO_BATCHES} micro-batches",
        saving_bytes=micro, chains=stacks, modules=tuple(h for h, _ in holders[:SHOWN]) if tracked else (),
        layer=peak.layer, numbers=numbers)


def _by_line(facts: Facts, activations: pd.DataFrame) -> tuple[list[tuple[str, int]], tuple]:
    """([(the user's "file:line" in the forward, bytes)], most first; the stack ids shown)."""
    per_stack = activations.groupby("stack_id")["bytes"].sum()
    frames = facts.chains([int(s) for s in per_stack.index if s >= 0])
    lines: dict[str, int] = {}
    stacks: dict[str, int] = {}
    for stack_id, n_bytes in per_stack.sort_values(ascending=False, kind="stable").items():
        frame = user_frame(frames.get(int(stack_id), []))
        key = where(frame) if frame is not None else "(no line of the user's code)"
        lines[key] = lines.get(key, 0) + int(n_bytes)
        stacks.setdefault(key, int(stack_id))
    ranked = sorted(lines.items(), key=lambda item: -item[1])
    return ranked, tuple(stacks[key] for key, _ in ranked[:SHOWN] if stacks[key] >= 0)


RULE_ID = "activations-peak"
RULE = Rule(
    id=RULE_ID,
    title="Activations make the peak",
    trigger=(f"in a recording where a backward ran, at a tensor layer's peak (torch_cpu, cuda_block) the tensors "
             f"made inside module forwards during the peak's step, not model state, are "
             f"{ACTIVATION_SHARE.value:.0%} of it or more, and {format_bytes(int(MIN_ACTIVATIONS.value))} or more"),
    evidence=("the peak, the activations' bytes and share, the model state's; the bytes per module (with "
              "--torch-modules; else per line of the forward), and the checkpointing estimate"),
    advice=("activation checkpointing (torch.utils.checkpoint) of the modules that hold the most at the peak, "
            "or micro-batching with gradient accumulation"),
    saving=("checkpointing each child of the best parent module: what they hold at the peak, less their outputs "
            "(kept as the next one's input) and the largest (recomputed during backward); without a plan, "
            f"micro-batching in {MICRO_BATCHES}: half the activations"),
    thresholds=THRESHOLDS,
    check=check,
    needs="--torch-modules for module paths and the checkpointing estimate (without: lines of the forward)",
)
