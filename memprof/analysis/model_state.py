"""Model state: the model's own memory — parameters, buffers, gradients, optimizer state —
which the agent names and `timeline()` copies onto allocations as "state:ROLE:NAME"
(model.schema.STATE_PREFIX). A job holds it on purpose until it exits, so leak reports never
count it as a leak: they total it apart, by role, layer and device.

Pure functions; no I/O. Sizes are bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import category_codes, label_of
from memprof.model.schema import LAYERS, STATE_PREFIX, ModelStateRole

ROLES = tuple(role.value for role in ModelStateRole)


@dataclass(frozen=True)
class ModelStateTotal:
    """The model state of one `role` (a ModelStateRole value) in one `layer` and `device`
    live at the end: `count` allocations (a tensor's storage each; weighted where sampled)
    holding `live_bytes` bytes."""

    role: str
    layer: str
    device: str
    count: int
    live_bytes: int


def state_roles(allocations: pd.DataFrame) -> np.ndarray:
    """Per allocation, its model-state role (a ModelStateRole value), None for any other
    allocation (and for all of them when there is no `category` column). A category naming
    a role outside the closed set is not model state: what is not known to be the model's
    stays where a leak can be found. Judged on the column's labels, not per row."""
    if "category" not in allocations:
        return np.full(len(allocations), None, dtype=object)
    codes, names = category_codes(allocations["category"])
    role_of_label = np.array([_role(label_of(name)) for name in names] + [None], dtype=object)
    return role_of_label[codes]  # code -1 (no category) picks the trailing None


def _role(category: str) -> str | None:
    """ROLE of "state:ROLE:NAME", when ROLE is a ModelStateRole value; else None."""
    if not category.startswith(STATE_PREFIX):
        return None
    role = category[len(STATE_PREFIX):].partition(":")[0]
    return role if role in ROLES else None


def model_state_totals(role: np.ndarray, layer: np.ndarray, device: np.ndarray, size_bytes: np.ndarray,
                       weight: np.ndarray) -> list[ModelStateTotal]:
    """Totals per (role, layer, device) of the allocations given as parallel arrays
    (`size_bytes` each one's bytes already weighted, `weight` how many it stands for), in
    ModelStateRole order, then layers outermost first, then device."""
    if not len(role):
        return []
    frame = pd.DataFrame({"role": role, "layer": layer, "device": device, "bytes": size_bytes, "count": weight})
    sums = frame.groupby(["role", "layer", "device"], sort=False, dropna=False).sum().reset_index()
    rank_role = {name: i for i, name in enumerate(ROLES)}
    rank_layer = {name: i for i, name in enumerate(LAYERS)}
    order = sorted(range(len(sums)), key=lambda i: (rank_role.get(sums["role"][i], len(ROLES)),
                                                    rank_layer.get(sums["layer"][i], len(LAYERS)),
                                                    str(sums["device"][i])))
    return [ModelStateTotal(role=str(sums["role"][i]), layer=str(sums["layer"][i]), device=str(sums["device"][i]),
                            count=int(round(sums["count"][i])), live_bytes=int(round(sums["bytes"][i])))
            for i in order]
