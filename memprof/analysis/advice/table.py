"""The rule table: every advice rule, in the order reports list them.

Each rule is one module of this package: a `check(facts) -> Verdict` function and its
`RULE` entry (trigger, evidence, advice, saving, named thresholds) beside it. To add a rule,
write such a module (tests/unit/test_advice_*.py show the pattern: a recording that sets it
off with the right numbers, and a control that does not) and list its RULE here.
"""
from __future__ import annotations

from memprof.analysis.advice import autograd
from memprof.analysis.advice import kv_cache
from memprof.analysis.advice import attention
from memprof.analysis.advice import fragmentation
from memprof.analysis.advice import activations
from memprof.analysis.advice import optimizer_state
from memprof.analysis.advice import dataloader
from memprof.analysis.advice import outside_torch
from memprof.analysis.advice.model import Rule

RULES: tuple[Rule, ...] = (
    autograd.RULE, kv_cache.RULE, attention.RULE, fragmentation.RULE, activations.RULE, optimizer_state.RULE, dataloader.RULE, outside_torch.RULE,
)
