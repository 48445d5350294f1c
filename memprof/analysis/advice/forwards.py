"""What the PyTorch training rules (autograd-graph-kept, activations-peak) read in a chain and
in a recording: whether a chain ran inside an nn.Module's forward, the line of the user's own
code it came from, whether a backward ran, and when the step around a moment began.

Frames are the dicts of `Facts.chains` (innermost first: kind, function, module, file, line).
Pure; no I/O. Times are CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from memprof.analysis.advice.chain_text import user_frame
from memprof.analysis.checkpoints import step_marks
from memprof.analysis.model_state import state_roles
from memprof.model.schema import ModelStateRole

if TYPE_CHECKING:
    import pandas as pd

    from memprof.analysis.advice.facts import Facts

# Every nn.Module call runs through these (torch >= 2.0; Python 3.11+ names them
# `Module._call_impl`, `Module._call_impl.<locals>.inner`, 3.10 by their bare names).
MODULE_CALL_FUNCTIONS = frozenset({"_call_impl", "_wrapped_call_impl"})
OPTIMIZER_STEPS = "optimizer.step"  # the agent's step source when an optimizer counts the steps


def in_forward(frames: list[dict]) -> bool:
    """The chain ran inside an nn.Module call (its Python frames pass Module._call_impl)."""
    return any(_module_call(frame) for frame in frames)


def forward_caller(frames: list[dict]) -> dict | None:
    """The frame of the user's code that called the chain's outermost nn.Module (the line
    whose result the forward's tensors belong to: `loss = criterion(model(x), y)`), None when
    the chain passes no module call or nothing of the user's code called it."""
    calls = [i for i, frame in enumerate(frames) if _module_call(frame)]
    return user_frame(frames[calls[-1] + 1:]) if calls else None


def _module_call(frame: dict) -> bool:
    return frame.get("kind") == "python" and bool(MODULE_CALL_FUNCTIONS & set(str(frame.get("function")).split(".")))


def backward_ran(facts: Facts) -> bool:
    """A backward ran while recorded: the agent named gradients, or an optimizer counted the
    steps (meta.json's step sources)."""
    roles = state_roles(facts.lifetimes.allocations)
    if bool(np.any(roles == ModelStateRole.GRADIENT.value)):
        return True
    sources = getattr(facts.rec.meta, "sources", None) or {}
    return any(OPTIMIZER_STEPS in ((getattr(stats, "detail", None) or {}).get("step_sources") or {}).values()
               for stats in sources.values())


def step_began(events: pd.DataFrame, ts_ns: int) -> int | None:
    """When the step holding `ts_ns` began: the last step mark at or before it (None: no
    step mark before it)."""
    marks = step_marks(events)
    times = np.sort(marks["ts_ns"].to_numpy(dtype=np.int64))
    before = times[times <= ts_ns]
    return int(before[-1]) if len(before) else None
