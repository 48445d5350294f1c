"""What an advice rule is and what it gives: the table entry (`Rule`), its named thresholds
(`Threshold`), one piece of advice computed from a recording (`Advice`) and a rule's answer
(`Verdict`: its advice, or why it said nothing).

Plain values, no I/O. Sizes are bytes, times CLOCK_MONOTONIC ns of the recording host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts


@dataclass(frozen=True)
class Threshold:
    """A named number a rule compares the recording with: `value` in `unit` ("bytes",
    "fraction", "R²", "count", …), and what crossing it means (`meaning`, one phrase).
    Reports print the thresholds with each rule, so a user can see why it fired or not."""

    name: str
    value: float
    unit: str
    meaning: str


@dataclass(frozen=True)
class Advice:
    """One piece of advice from one rule, computed from this recording.

    `title`: the finding in one line ("the autograd graph is kept across steps").
    `evidence`: sentences with this recording's numbers, steps and module paths.
    `change`: what to try. `saving`: the expected saving in words ("about 512 MiB less at
    the peak"), `saving_bytes` the same in bytes (None where it cannot be computed; `saving`
    then says why). `chains`: stack ids the evidence names (reports print their frames;
    None is allocations recorded without a stack). `modules`: nn.Module paths it names.
    `layer`/`device`: where the memory is (None: several or none). `numbers`: the figures
    behind the evidence, by name, for JSON (bytes, per-step slopes, R², …)."""

    rule: str
    title: str
    evidence: tuple[str, ...]
    change: str
    saving: str
    saving_bytes: int | None = None
    chains: tuple[int | None, ...] = ()
    modules: tuple[str, ...] = ()
    layer: str | None = None
    device: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """A rule's answer on one recording: the advice it gives, or, when none, `why_not` (one
    phrase: what it looked for and did not find, or what the recording lacks to judge)."""

    advice: tuple[Advice, ...] = ()
    why_not: str | None = None


def fired(*advice: Advice) -> Verdict:
    """A verdict that gives `advice` (at least one)."""
    return Verdict(advice=tuple(advice))


def silent(why_not: str) -> Verdict:
    """A verdict that gives no advice, saying why."""
    return Verdict(why_not=why_not)


@dataclass(frozen=True)
class Rule:
    """One entry of the rule table (memprof.analysis.advice.table): `id` (kebab-case, stable:
    JSON and tests use it), `title`, and in one phrase each its `trigger` (what in a recording
    sets it off), `evidence` (what it shows), `advice` (the change it suggests) and `saving`
    (how the saving is computed). `thresholds` are the named numbers `check` uses; `check`
    reads a recording's facts and answers a Verdict. `needs` names what the rule cannot judge
    without (e.g. "a GPU", "--torch-modules"), for reports; empty when nothing special."""

    id: str
    title: str
    trigger: str
    evidence: str
    advice: str
    saving: str
    thresholds: tuple[Threshold, ...]
    check: Callable[[Facts], Verdict]
    needs: str = ""


@dataclass(frozen=True)
class RuleOutcome:
    """One rule as judged on one recording."""

    rule: Rule
    verdict: Verdict


@dataclass
class AdviceResult:
    """Every rule of the table judged, in table order (`outcomes`), and the advice they gave,
    biggest expected saving first (`advice`; advice without a computed saving last, in table
    order)."""

    outcomes: list[RuleOutcome]
    advice: list[Advice]
