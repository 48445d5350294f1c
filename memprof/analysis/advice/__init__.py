"""Advice: what to change, with the evidence from the recording (`memprof report advice`).

`advise(facts)` judges every rule of the table (memprof.analysis.advice.table) on one
recording's analyses and returns an AdviceResult. Pure: no I/O; sizes in bytes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memprof.analysis.advice.model import Advice, AdviceResult, Rule, RuleOutcome, Threshold, Verdict, fired, silent

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts

__all__ = ["Advice", "AdviceResult", "Rule", "RuleOutcome", "Threshold", "Verdict", "advise", "fired", "silent"]


def advise(facts: Facts, rules: tuple[Rule, ...] | None = None) -> AdviceResult:
    """Judge `rules` (default: the whole table, in its order) on `facts`. The advice comes
    biggest expected saving first; advice whose saving could not be computed follows, in
    table order."""
    from memprof.analysis.advice.table import RULES
    outcomes = [RuleOutcome(rule, _judged(rule, facts)) for rule in (RULES if rules is None else rules)]
    given = [advice for outcome in outcomes for advice in outcome.verdict.advice]
    ranked = sorted((a for a in given if a.saving_bytes is not None), key=lambda a: -a.saving_bytes)
    return AdviceResult(outcomes=outcomes, advice=ranked + [a for a in given if a.saving_bytes is None])


def _judged(rule: Rule, facts: Facts) -> Verdict:
    """`rule`'s verdict on `facts`; on a folded recording whose fold cannot give a view the
    rule reads (FoldedRecordingError), a silent verdict that says so instead of no advice at all."""
    from memprof.errors import FoldedRecordingError
    try:
        return rule.check(facts)
    except FoldedRecordingError as e:
        return silent(f"not judged: this recording was folded, and {e.what or 'a view it reads'} needs every event")
