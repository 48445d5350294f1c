"""Each chain's live bytes at the checkpoints, and its trend (grows, plateau, sawtooth, flat).

Pure functions; no I/O. A chain is (layer, stack_id) — stack ids already canonical. Times are
CLOCK_MONOTONIC ns, sizes bytes (weighted for sampled allocations).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from memprof.analysis.checkpoints import Checkpoints, checkpoint_spans, live_by_span
from memprof.analysis.lifetimes import category_codes, end_times, label_of
from memprof.analysis.trend import MIN_POINTS, Trend, classify

Chain = tuple  # (layer: str, stack_id: int | None)


@dataclass
class ChainSeries:
    """Live bytes and counts of each chain at each checkpoint: `chains[i]` is row i."""

    chains: list[Chain]
    live_bytes: np.ndarray  # (chains, checkpoints), float
    live_count: np.ndarray  # (chains, checkpoints), float (weighted)

    def __post_init__(self):
        self.row_of = {chain: row for row, chain in enumerate(self.chains)}


@dataclass
class ChainTrends:
    """The verdicts: `by_chain` holds a Trend for every chain whose live bytes varied by at
    least `min_growth` bytes over the checkpoints; `growing` lists the chains that grow;
    `chain_of_row` is each allocation's row in `series` (-1: live at no checkpoint). `judged` is False when there were too few
    checkpoints to judge any trend."""

    judged: bool
    growing: list[Chain] = field(default_factory=list)
    chain_of_row: np.ndarray | None = None
    by_chain: dict[Chain, Trend] = field(default_factory=dict)
    series: ChainSeries | None = None
    checkpoints: Checkpoints | None = None

    @classmethod
    def none(cls) -> "ChainTrends":
        return cls(judged=False)

    def peak_of(self, chain: Chain) -> tuple[float, float, int]:
        """(bytes, count, checkpoint index) at the chain's highest checkpoint."""
        row = self.series.row_of[chain]
        at = int(np.argmax(self.series.live_bytes[row]))
        return float(self.series.live_bytes[row, at]), float(self.series.live_count[row, at]), at


def chain_series(allocations: pd.DataFrame, checkpoints: Checkpoints) -> tuple[ChainSeries, np.ndarray]:
    """(series of every chain live at one checkpoint or more, chain row of each allocation
    (-1: live at none)). Allocations that span no checkpoint (most, in churn) are dropped first.
    A process with checkpoints of its own (Checkpoints.by_pid: a rank of a job) has its
    allocations read at its own step marks, so a chain's value at step k adds up what each
    process held at its own step k."""
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = end_times(allocations)
    pid = allocations["pid"].to_numpy(dtype=np.int64, na_value=-1) if checkpoints.by_pid else None
    rows, first, stop = checkpoint_spans(checkpoints, alloc_ts, end_ts, pid)
    layer_codes, layer_names = category_codes(allocations["layer"])
    stack = allocations["stack_id"]
    stack_values = stack.to_numpy(dtype=np.int64, na_value=0)[rows]
    has_stack = stack.notna().to_numpy()[rows]
    group, chains = _chain_codes(layer_codes[rows], layer_names, stack_values, has_stack)
    weight = allocations["weight"].to_numpy(dtype=float)[rows]
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)[rows] * weight
    n, k = len(chains), len(checkpoints.times_ns)
    live_bytes = live_by_span(group, n, first, stop, size, k)
    live_count = live_by_span(group, n, first, stop, weight, k)
    group_of_row = np.full(len(allocations), -1, dtype=np.int64)
    group_of_row[rows] = group
    return ChainSeries(chains, live_bytes, live_count), group_of_row


def _chain_codes(layer_codes: np.ndarray, layer_names: np.ndarray, stack_values: np.ndarray,
                 has_stack: np.ndarray) -> tuple[np.ndarray, list[Chain]]:
    """(dense chain code per row, the chains in code order). Stack ids are factorized first,
    so (layer, stack, has_stack) packs into one int64 whatever the ids' range."""
    stack_codes, stack_uniques = pd.factorize(stack_values)
    width = 2 * (len(layer_names) + 1)
    packed = stack_codes.astype(np.int64) * width + (layer_codes.astype(np.int64) + 1) * 2 + has_stack
    group, keys = pd.factorize(packed)
    layer_of, stack_of, has_of = (keys % width) // 2 - 1, stack_uniques[keys // width], keys % 2 == 1
    chains = [(label_of(layer_names[code]) if code >= 0 else "?", int(sid) if has else None)
              for code, sid, has in zip(layer_of.tolist(), stack_of.tolist(), has_of.tolist())]
    return group, chains


def chain_trends(allocations: pd.DataFrame, checkpoints: Checkpoints, confidence: float = 0.99,
                 min_growth: float = 1024.0) -> ChainTrends:
    """Judge every chain whose live bytes at the checkpoints vary by `min_growth` or more."""
    if len(checkpoints.times_ns) < MIN_POINTS or allocations.empty:
        return ChainTrends.none()
    series, group_of_row = chain_series(allocations, checkpoints)
    varies = np.flatnonzero(np.ptp(series.live_bytes, axis=1) >= min_growth) if series.chains else np.zeros(0, int)
    verdicts = classify(series.live_bytes[varies], confidence=confidence, min_growth=min_growth)
    by_chain = {series.chains[row]: trend for row, trend in zip(varies, verdicts)}
    if checkpoints.by_pid:
        by_chain = _grown_in_a_process(allocations, checkpoints, series, group_of_row, by_chain, confidence, min_growth)
    growing = [chain for chain, trend in by_chain.items() if trend.shape == "grows"]
    return ChainTrends(judged=True, growing=growing, chain_of_row=group_of_row, by_chain=by_chain, series=series,
                       checkpoints=checkpoints)


def _grown_in_a_process(allocations: pd.DataFrame, checkpoints: Checkpoints, series: ChainSeries,
                        group_of_row: np.ndarray, by_chain: dict, confidence: float, min_growth: float) -> dict:
    """`by_chain` where a chain that grows over the processes' steps added up (Checkpoints.by_pid)
    grows in one process's own series at least; else it is "flat". A leak grows in the process
    that makes it: one allocation kept by each rank, each at another step, adds up to a
    staircase, and noise in when each rank's step mark falls against its allocations adds up
    to troughs that rise; neither is growth. Judged on the growing chains' allocations alone."""
    grown = [chain for chain, trend in by_chain.items() if trend.shape == "grows"]
    if not grown:
        return by_chain
    rows = np.flatnonzero(np.isin(group_of_row, [series.row_of[chain] for chain in grown]))
    mine = allocations.iloc[rows]
    pid = mine["pid"].to_numpy(dtype=np.int64, na_value=-1)
    at, first, stop = checkpoint_spans(checkpoints, mine["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(mine), pid)
    chain_code = pd.factorize(group_of_row[rows][at])[0]
    pid_code, pids = pd.factorize(pid[at])
    weight = mine["weight"].to_numpy(dtype=float)[at]
    size = mine["size_bytes"].to_numpy(dtype=np.int64, na_value=0)[at] * weight
    live = live_by_span(chain_code * len(pids) + pid_code, (chain_code.max() + 1) * len(pids), first, stop, size,
                        len(checkpoints.times_ns))
    varies = np.flatnonzero(np.ptp(live, axis=1) >= min_growth)
    verdicts = classify(live[varies], confidence=confidence, min_growth=min_growth)
    grows_in = {int(row) // len(pids) for row, trend in zip(varies, verdicts) if trend.shape == "grows"}
    row_of_code = pd.unique(group_of_row[rows][at])  # code -> series row, in factorize's order
    kept = {series.chains[int(row_of_code[code])] for code in grows_in}
    return {chain: trend if trend.shape != "grows" or chain in kept else replace(trend, shape="flat")
            for chain, trend in by_chain.items()}


def rows_of_chains(allocations: pd.DataFrame, chains: list[Chain]) -> np.ndarray:
    """Per allocation: True when its (layer, stack_id) is one of `chains` (one pass per layer)."""
    out = np.zeros(len(allocations), dtype=bool)
    if not chains:
        return out
    layer_codes, layer_names = category_codes(allocations["layer"])
    stack = allocations["stack_id"]
    has_stack = stack.notna().to_numpy()
    stack_values = stack.to_numpy(dtype=np.int64, na_value=0)
    for code, name in enumerate(layer_names):
        ids = [sid for layer, sid in chains if layer == label_of(name)]
        if not ids:
            continue
        in_layer = layer_codes == code
        wanted = np.isin(stack_values, [sid for sid in ids if sid is not None]) & has_stack
        if None in ids:
            wanted |= ~has_stack
        out |= in_layer & wanted
    return out
