"""Advice rule `allocator-fragmentation`: the caching allocator is fragmented. (Being built: see issue 22.)"""
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
    id="allocator-fragmentation",
    title="The caching allocator is fragmented",
    trigger="",
    evidence="",
    advice="",
    saving="",
    thresholds=THRESHOLDS,
    check=check,
)
