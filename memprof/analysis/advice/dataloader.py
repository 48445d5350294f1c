"""Advice rule `dataloader-copy-on-read`: dataloader workers copy the dataset on read. (Being built: see issue 22.)"""
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
    id="dataloader-copy-on-read",
    title="DataLoader workers copy the dataset on read",
    trigger="",
    evidence="",
    advice="",
    saving="",
    thresholds=THRESHOLDS,
    check=check,
)
