"""Memory budgets for CI: is a recording within its peak and leak limits?

Pure functions over lifetimes; no I/O. Bytes are bytes, times CLOCK_MONOTONIC ns. Every
budget is judged per layer, because bytes are never added across layers (a tensor's bytes are
in torch_cpu and again in native_heap).

- peak: a layer's peak is its highest live bytes (layers.layer_summary); a PeakBudget without
  a layer holds every layer to its limit, one with a layer that layer only.
- absent layers: a PeakBudget naming a layer with no allocations in the recording is not met
  (it is most likely a typo, or a source that was not recorded: `cuda_block` needs the agent
  and CUDA): an ABSENT violation, unless `allow_absent`, which skips it (CheckResult.skipped)
  rather than counting it as met.
- leaks: the findings of `memprof report leaks` (overview.leak_report) — chains holding memory when the target began to
  exit, at least `min_age_ns` old then — all of them, whether the exit's teardown released
  them or not (a budget is about what the program kept, not who cleaned up after it), and
  unconfirmed ones too (a budget errs towards failing). Findings whose `kind` is
  "not_a_leak" are not counted. `max_leak_bytes` limits the bytes of those findings per
  layer; `fail_on_leak` allows none at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from memprof.analysis.layers import layer_summary
from memprof.analysis.leaks import LeakResult
from memprof.analysis.lifetimes import Lifetimes
from memprof.model.schema import LAYERS

NOT_A_LEAK = "not_a_leak"
PEAK, LEAK, ANY_LEAK, ABSENT = "peak", "leak", "fail_on_leak", "absent_layer"  # Violation.budget


@dataclass(frozen=True)
class PeakBudget:
    """A layer's peak must be ≤ `limit_bytes`; `layer` None: every layer's."""

    limit_bytes: int
    layer: str | None = None


@dataclass(frozen=True)
class Budgets:
    """What `check` holds a recording to (module docstring). `count` is how many budgets
    were given: one per PeakBudget, one for max_leak_bytes, one for fail_on_leak.
    `allow_absent`: a peak budget on a layer the recording has no allocations in is skipped,
    not failed (module docstring)."""

    peaks: tuple[PeakBudget, ...] = ()
    max_leak_bytes: int | None = None
    fail_on_leak: bool = False
    allow_absent: bool = False

    @property
    def count(self) -> int:
        return len(self.peaks) + (self.max_leak_bytes is not None) + bool(self.fail_on_leak)

    @property
    def on_leaks(self) -> bool:
        return self.max_leak_bytes is not None or self.fail_on_leak


@dataclass(frozen=True)
class Violation:
    """One budget broken in one layer. `budget`: PEAK, LEAK, ANY_LEAK or ABSENT (a peak budget
    on a layer without allocations); `actual_bytes`: the layer's peak, or its counted leak
    bytes (0 for ABSENT); `limit_bytes`: the budget (0 for ANY_LEAK);
    `at_ns`: when the peak was first reached (PEAK only); `findings`: leak findings counted,
    `growing` of them growing per step (the others held at the end)."""

    budget: str
    layer: str
    actual_bytes: int
    limit_bytes: int
    at_ns: int | None = None
    findings: int = 0
    growing: int = 0


@dataclass
class CheckResult:
    """`budgets` checked (Budgets.count) and the violations, in the order budgets were given
    (peaks, then max_leak, then fail_on_leak; layers outermost first within one). `skipped`:
    the layer of each peak budget skipped as absent (Budgets.allow_absent); neither met nor
    broken."""

    budgets: int
    violations: list[Violation] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def met(self) -> int:
        """Budgets met: those checked, less those skipped (a passed check has no violation)."""
        return self.budgets - len(self.skipped)


@dataclass(frozen=True)
class LeakTotal:
    """Counted leak findings of one layer: bytes and how many findings, `growing` of them
    growing per step (kind "grows_per_step"; the others are held at the end)."""

    layer: str
    live_bytes: int
    findings: int
    growing: int = 0


def check_recording(lifetimes: Lifetimes, budgets: Budgets, leaks: Callable[[], LeakResult]) -> CheckResult:
    """Judge `budgets` on one recording: peaks as `layers.layer_summary` computes them, leaks
    as `leaks()` finds them (the caller's `overview.leak_report`, as `memprof report leaks`
    shows them: held at the end and growing per step). Only what a budget needs is computed."""
    violations, skipped = [], []
    if budgets.peaks:
        peaks = {s.layer: (s.peak_bytes, s.peak_ns) for s in layer_summary(lifetimes, None, top=0).layers}
        judged = budgets.peaks
        if budgets.allow_absent:
            judged = tuple(b for b in budgets.peaks if not _absent(b, peaks))
            skipped = [b.layer for b in budgets.peaks if _absent(b, peaks)]
        violations += peak_violations(judged, peaks)
    if budgets.on_leaks:
        violations += leak_violations(budgets, leak_totals(leaks()))
    return CheckResult(budgets=budgets.count, violations=violations, skipped=skipped)


def peak_violations(budgets: tuple[PeakBudget, ...], peaks: Mapping[str, tuple[int, int]]) -> list[Violation]:
    """Violations of peak budgets, given layer -> (peak_bytes, peak_ns) of the layers with
    allocations, in layer order. A budget on a layer not in `peaks` is an ABSENT violation."""
    violations = []
    for budget in budgets:
        if _absent(budget, peaks):
            violations.append(Violation(ABSENT, budget.layer, 0, budget.limit_bytes))
            continue
        layers = list(peaks) if budget.layer is None else [budget.layer]
        for layer in layers:
            peak_bytes, peak_ns = peaks.get(layer, (0, None))
            if peak_bytes > budget.limit_bytes:
                violations.append(Violation(PEAK, layer, int(peak_bytes), budget.limit_bytes, at_ns=peak_ns))
    return violations


def _absent(budget: PeakBudget, peaks: Mapping[str, tuple[int, int]]) -> bool:
    """The budget names a layer with no allocations in the recording."""
    return budget.layer is not None and budget.layer not in peaks


def leak_totals(result: LeakResult) -> list[LeakTotal]:
    """Per layer with any (outermost first, schema order): the bytes and number of the
    findings that count as leaks (kind other than "not_a_leak"; a finding without a kind is
    held at the end, and counts)."""
    totals: dict[str, list[int]] = {}
    for finding in result.findings:  # one per chain, not per allocation
        kind = getattr(finding, "kind", "held_at_end")
        if kind == NOT_A_LEAK:
            continue
        total = totals.setdefault(finding.layer, [0, 0, 0])
        total[0] += int(finding.live_bytes)
        total[1] += 1
        total[2] += kind == "grows_per_step"
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return [LeakTotal(layer, live_bytes, n, growing) for layer, (live_bytes, n, growing)
            in sorted(totals.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))]


def leak_violations(budgets: Budgets, totals: list[LeakTotal]) -> list[Violation]:
    """Violations of max_leak_bytes (layers over it), then of fail_on_leak (layers with any)."""
    violations = []
    if budgets.max_leak_bytes is not None:
        violations += [Violation(LEAK, t.layer, t.live_bytes, budgets.max_leak_bytes, findings=t.findings,
                                 growing=t.growing) for t in totals if t.live_bytes > budgets.max_leak_bytes]
    if budgets.fail_on_leak:
        violations += [Violation(ANY_LEAK, t.layer, t.live_bytes, 0, findings=t.findings, growing=t.growing)
                       for t in totals]
    return violations
