"""Advice rule `autograd-graph-kept`: the autograd graph is kept across steps. (Being built: see issue 22.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memprof.analysis.advice.model import Rule, Threshold, Verdict, silent

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts

THRESHOLDS: tuple[Threshold, ...] = ()


def check(facts: Facts) -> Verdict:
    """Not built yet."""
    return silent("not built yet")


RULE = Rule(
    id="autograd-graph-kept",
    title="The autograd graph is kept across steps",
    trigger="",
    evidence="",
    advice="",
    saving="",
    thresholds=THRESHOLDS,
    check=check,
)
