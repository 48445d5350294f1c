"""Advice rule `memory-outside-pytorch`: memory grows outside pytorch. (Being built: see issue 22.)"""
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
    id="memory-outside-pytorch",
    title="Memory grows outside PyTorch",
    trigger="",
    evidence="",
    advice="",
    saving="",
    thresholds=THRESHOLDS,
    check=check,
)
