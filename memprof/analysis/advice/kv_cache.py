"""Advice rule `kv-cache`: the kv cache dominates the peak and grows with the tokens. (Being built: see issue 22.)"""
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
    id="kv-cache",
    title="The KV cache dominates the peak and grows with the tokens",
    trigger="",
    evidence="",
    advice="",
    saving="",
    thresholds=THRESHOLDS,
    check=check,
)
