"""Which module: the nn.Module instance path an allocation was made in, per allocation and
per chain (issue 21, item 5).

`timeline.with_modules` gives every alloc row of the timeline the path of the innermost
module forward running on its thread at that moment (`transformer.h.3.attn`; "" is the
outermost module; null when none ran, or when the recording has no module boundaries).
Pure functions over the lifetimes; no I/O.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.model.schema import Action

MODULE = "module"  # the column, on the timeline and on lifetimes' allocations


def alloc_modules(allocations: pd.DataFrame, events: pd.DataFrame | None) -> pd.Categorical:
    """Each allocation's module path as a categorical (NaN: no module). From the allocations'
    own `module` column where lifetimes carried it, else from `events` (the timeline the
    lifetimes were paired from: its alloc rows are the allocations, in order); all NaN when
    neither has one."""
    if MODULE in allocations:
        return _categorical(allocations[MODULE])
    if events is None or MODULE not in events:
        return pd.Categorical.from_codes(np.full(len(allocations), -1, dtype=np.int8), categories=[])
    modules = _categorical(events[MODULE])[(events["action"] == Action.ALLOC.value).to_numpy()]
    if len(modules) != len(allocations):
        raise ValueError("`events` are not the events these lifetimes were paired from")
    return modules


def _categorical(column: pd.Series) -> pd.Categorical:
    return pd.Categorical(column) if not isinstance(column.dtype, pd.CategoricalDtype) else column.array


def chain_modules(allocations: pd.DataFrame, events: pd.DataFrame | None, stack_ids: Iterable[int],
                  canonical_stack: Mapping[int, int] | None = None,
                  folded: pd.DataFrame | None = None) -> dict[int, str | None]:
    """{stack id: the module its allocations were made in} for each of `stack_ids` (chains as
    the reports show them: `canonical_stack` maps each stack to its chain's id).

    Paths that differ only in their numbered parts are one module repeated (the same
    attention in each layer: `transformer.h.0.attn` … `h.5.attn`) and count together, named
    with `*` (`transformer.h.*.attn`) when more than one of them is the chain's. The module
    with the most of the chain's allocations wins (counted in allocations, not bytes); a tie
    goes to the path the timeline met first. None for a chain whose allocations ran in no
    module, or more of them in none than in any one module. `folded` (stack_id, module,
    count: fold.FoldTotals.modules) counts the allocations a fold dropped too."""
    wanted = pd.unique(np.asarray(list(stack_ids), dtype=np.int64))
    found: dict[int, str | None] = {int(s): None for s in wanted}
    modules = alloc_modules(allocations, events)
    has_folded = folded is not None and len(folded) and folded["module"].notna().any()
    if not len(wanted) or not (len(modules.categories) or has_folded):
        return found
    stacks = with_canonical_stacks(allocations, canonical_stack)["stack_id"].to_numpy(dtype=np.int64, na_value=-1)
    mine = np.isin(stacks, wanted)
    counts = pd.DataFrame({"stack": stacks[mine], "code": np.asarray(modules.codes)[mine]}).value_counts(sort=False)
    names = modules.categories
    per_chain: dict[int, dict[str | None, int]] = {}
    for stack, paths in counts.groupby(level="stack", sort=False):  # a few chains, each a few paths
        per_chain[int(stack)] = {None if code < 0 else str(names[code]): int(n)
                                 for (_, code), n in sorted(paths.items(), key=lambda item: item[0][1])}
    if has_folded:
        for stack, module, n in _folded_counts(folded, canonical_stack, wanted):
            chain = per_chain.setdefault(stack, {})
            chain[module] = chain.get(module, 0) + n
    for stack, paths in per_chain.items():
        found[stack] = _winner(paths)
    return found


def _folded_counts(folded: pd.DataFrame, canonical_stack: Mapping[int, int] | None, wanted: np.ndarray):
    """(chain id, module or None, allocations) of the wanted chains, from a fold's tally."""
    canonical = canonical_stack or {}
    for stack, module, n in zip(folded["stack_id"], folded["module"], folded["count"]):
        chain = canonical.get(int(stack), int(stack))
        if chain in wanted:
            yield chain, None if module is None or pd.isna(module) else str(module), int(n)


_NUMBERED = re.compile(r"(?<=\.)[0-9]+(?=\.|$)|^[0-9]+(?=\.|$)")


def _winner(counts: dict[str | None, int]) -> str | None:
    """The module of the most allocations in {path or None: allocations} (in first-met
    order), numbered siblings counted as one (chain_modules)."""
    groups: dict[str | None, list] = {}  # pattern -> [allocations, paths]
    for path, n in counts.items():
        group = groups.setdefault(None if path is None else _NUMBERED.sub("*", path), [0, set()])
        group[0] += n
        group[1].add(path)
    pattern, (n, paths) = max(groups.items(), key=lambda item: item[1][0])  # max keeps the first of a tie
    if pattern is None or len(paths) > 1:
        return pattern
    return next(iter(paths))


def with_chain_modules(findings: list, allocations: pd.DataFrame, events: pd.DataFrame | None = None, *,
                       folded: pd.DataFrame | None = None, canonical_stack: Mapping[int, int] | None = None) -> list:
    """`findings` (frozen dataclasses with `stack_id` and `module` fields: leak findings,
    growth chains) with `module` set to their chain's most common module path
    (chain_modules over `allocations`, whose stack ids are the findings' own: canonical; and
    over a fold's tally `folded`, whose stack ids `canonical_stack` maps)."""
    ids = [f.stack_id for f in findings if f.stack_id is not None]
    if not ids:
        return findings
    names = chain_modules(allocations, events, ids, folded=_canonical(folded, canonical_stack))
    return [replace(f, module=names.get(f.stack_id)) for f in findings]


def _canonical(folded: pd.DataFrame | None, canonical_stack: Mapping[int, int] | None) -> pd.DataFrame | None:
    """A fold's tally with its stack ids mapped to their chains' (chains.canonical_stacks)."""
    if folded is None or not canonical_stack or not len(folded):
        return folded
    ids = folded["stack_id"].to_numpy(dtype=np.int64)
    return folded.assign(stack_id=[canonical_stack.get(int(i), int(i)) for i in ids])
