"""What changed between two recordings — A, the baseline, and B — for regressions between
commits: per layer, the peak and the bytes held at the end; per (layer, chain), the bytes the
chain held at the end and at its layer's peak.

Pure functions over lifetimes and the stacks/frames tables; no I/O. Bytes are bytes; times
are CLOCK_MONOTONIC ns of each recording's own host and boot, so a time of A is never
compared with a time of B, only bytes are. Bytes are never added across layers.

Chains are matched across recordings by what they are, not by the ids they were captured
under (stack ids are per recording): a chain's identity is its frames, innermost first, each
as (kind, function, module, file) — without line numbers, and function names without a
trailing `+0x…` offset — so a chain still matches after a commit moved its lines or its code.
Allocations without a stack, or whose stack is missing from `stacks`, make the chain `()` of
their layer.

"At the end" is at each side's `end_ns` (when its target began to exit, see
leaks.end_of_target): an allocation counts when alloc_ts_ns ≤ end_ns < end_ts_ns. A layer's
peak is its highest live bytes, first reached at `peak_ns` (layers.live_curve); a chain's bytes
"at the peak" are its live bytes at that `peak_ns` of its own recording. Sampled allocations
count by their weight (bytes are estimates then).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of, live_mask
from memprof.model.schema import LAYERS

# One frame of a chain's identity: (kind, function, module, file); None where unknown.
FrameKey = tuple[Optional[str], Optional[str], Optional[str], Optional[str]]
ChainKey = tuple[FrameKey, ...]
NO_STACK: ChainKey = ()
STATUSES = ("both", "new", "gone")

_NO_STACK = np.iinfo(np.int64).max  # above every stack id: min() picks a known one
_OFFSET = r"\+0x[0-9a-fA-F]+$"  # kernel symbols come as "kmalloc_trace+0x2f"
_IDENTITY_COLUMNS = ("kind", "function", "module", "file")


@dataclass(frozen=True)
class Recorded:
    """One side of a diff: a recording's lifetimes, its `stacks` and `frames` tables, and
    `end_ns`, when its target began to exit (CLOCK_MONOTONIC ns of that recording)."""

    lifetimes: Lifetimes
    stacks: pd.DataFrame
    frames: pd.DataFrame
    end_ns: int


@dataclass(frozen=True)
class ChainDiff:
    """One chain of one layer in A and B. `status`: "both", "new" (only B made allocations
    with it) or "gone" (only A did). `stack_id_a`/`stack_id_b`: the smallest stack id of the
    chain in that layer of each recording (None where it has none there, or for NO_STACK),
    to show its frames with their lines. Bytes held at the end and at the layer's peak."""

    layer: str
    frames: ChainKey
    status: str
    stack_id_a: int | None
    stack_id_b: int | None
    end_a: int
    end_b: int
    peak_a: int
    peak_b: int

    @property
    def end_delta(self) -> int:
        return self.end_b - self.end_a

    @property
    def peak_delta(self) -> int:
        return self.peak_b - self.peak_a


@dataclass(frozen=True)
class LayerDiff:
    """One layer in A and B: peak bytes (first reached at `peak_ns_*`, None where the layer has
    no allocations) and bytes held at the end. `chains`: the changed chains, by the larger of
    |Δ at end| and |Δ at peak|, descending, at most `top`; `changed` counts them all (new and
    gone chains count as changed even when they held nothing at those times); `new`/`gone`
    count chains only in B / only in A."""

    layer: str
    peak_a: int
    peak_b: int
    peak_ns_a: int | None
    peak_ns_b: int | None
    end_a: int
    end_b: int
    chains: list[ChainDiff] = field(default_factory=list)
    changed: int = 0
    new: int = 0
    gone: int = 0

    @property
    def peak_delta(self) -> int:
        return self.peak_b - self.peak_a

    @property
    def end_delta(self) -> int:
        return self.end_b - self.end_a

    @property
    def peak_pct(self) -> float | None:
        """Δ peak in % of A's peak; None when A's is 0."""
        return 100.0 * self.peak_delta / self.peak_a if self.peak_a else None

    @property
    def end_pct(self) -> float | None:
        """Δ end in % of A's bytes at the end; None when those are 0."""
        return 100.0 * self.end_delta / self.end_a if self.end_a else None


@dataclass
class DiffResult:
    """Layers present in A or B, outermost first (schema order, unknown names after, sorted);
    `end_ns_a`/`end_ns_b` are the times "the end" was judged at in each recording."""

    layers: list[LayerDiff]
    end_ns_a: int
    end_ns_b: int


def diff_recordings(a: Recorded, b: Recorded, *, layers: Iterable[str] | None = None, top: int = 10) -> DiffResult:
    """Compare B with A (module docstring): every layer present in either (only `layers`, when
    given), with at most `top` changed chains each."""
    ids_a, ids_b = chain_identities(a.stacks, a.frames), chain_identities(b.stacks, b.frames)
    keys, codes_a, codes_b = _shared_codes(ids_a, ids_b)
    layers_a, chains_a = _profile(a, ids_a.index, codes_a)
    layers_b, chains_b = _profile(b, ids_b.index, codes_b)
    chains = _joined(chains_a, chains_b)
    wanted = None if layers is None else {label_of(layer) for layer in layers}
    names = [n for n in _layer_order(set(layers_a) | set(layers_b)) if wanted is None or n in wanted]
    return DiffResult(layers=[_layer_diff(name, layers_a.get(name), layers_b.get(name),
                                          chains[chains["layer"] == name], keys, top) for name in names],
                      end_ns_a=int(a.end_ns), end_ns_b=int(b.end_ns))


def chain_identities(stacks: pd.DataFrame, frames: pd.DataFrame) -> pd.Series:
    """stack_id -> its identity (ChainKey: (kind, function, module, file) per frame,
    innermost first, function without a `+0x…` offset), indexed by stack_id ascending.
    A frame_id missing from `frames` reads (None, None, None, None)."""
    if stacks.empty:
        return pd.Series([], index=pd.Index([], dtype=np.int64, name="stack_id"), dtype=object)
    ordered = stacks.sort_values(["stack_id", "depth"], kind="stable")
    keys = _frame_keys(frames).reindex(ordered["frame_id"].to_numpy()).to_numpy(dtype=object, copy=True)
    for i in np.flatnonzero(pd.isna(keys)):  # frames lost to the recording: rare
        keys[i] = (None,) * len(_IDENTITY_COLUMNS)
    stack_ids = ordered["stack_id"].to_numpy(dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, stack_ids[1:] != stack_ids[:-1]])
    chains = [tuple(part) for part in np.split(keys, starts[1:])]  # one tuple per stack, not per frame
    return pd.Series(chains, index=pd.Index(stack_ids[starts], name="stack_id"), dtype=object)


def _frame_keys(frames: pd.DataFrame) -> pd.Series:
    """frame_id -> FrameKey; missing values are None (never NaN: NaN != NaN breaks matching)."""
    columns = []
    for name in _IDENTITY_COLUMNS:
        array = frames[name].astype(object).to_numpy(dtype=object, copy=True)
        missing = pd.isna(array)
        array[missing] = None
        if name == "function" and (~missing).any():
            array[~missing] = pd.Series(array[~missing]).astype(str).str.replace(_OFFSET, "", regex=True).to_numpy()
        columns.append(array)
    return pd.Series(list(zip(*columns)), index=frames["frame_id"].to_numpy(dtype=np.int64), dtype=object)


def _shared_codes(ids_a: pd.Series, ids_b: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ChainKey of each code, code of each stack of A, code of each stack of B): one code per
    distinct identity across both recordings; code 0 is NO_STACK."""
    both = pd.concat([pd.Series([NO_STACK], dtype=object), ids_a, ids_b], ignore_index=True)
    codes, keys = pd.factorize(both.to_numpy(dtype=object))
    return keys, codes[1:1 + len(ids_a)], codes[1 + len(ids_a):]


def _profile(side: Recorded, stack_index: pd.Index, stack_codes: np.ndarray) -> tuple[dict, pd.DataFrame]:
    """(layer -> (peak_bytes, peak_ns, end_bytes), one row per (layer, chain code) with
    end_bytes, peak_bytes and stack_id: the chain's smallest stack id in that layer)."""
    allocations = side.lifetimes.allocations
    layer_codes, layer_names = category_codes(allocations["layer"])
    cols = _columns(allocations, stack_index, stack_codes)
    at_peak = np.zeros(len(allocations), dtype=np.int64)  # each allocation's layer's peak_ns
    layers = {}
    for code in np.unique(layer_codes[layer_codes >= 0]).tolist():
        mask = layer_codes == code
        peak_bytes, peak_ns, end_bytes = _layer_numbers(cols, mask, side.end_ns)
        layers[label_of(layer_names[code])] = (peak_bytes, peak_ns, end_bytes)
        at_peak[mask] = peak_ns
    return layers, _chain_bytes(cols, layer_codes, layer_names, at_peak, side.end_ns)


def _columns(allocations: pd.DataFrame, stack_index: pd.Index, stack_codes: np.ndarray) -> dict[str, np.ndarray]:
    """Per allocation: alloc_ts, end_ts (int64 max: never ended), bytes (size × weight),
    chain (identity code) and stack (int64 max where none)."""
    stack = allocations["stack_id"]
    has_stack = stack.notna().to_numpy()
    stack_ids = stack.to_numpy(dtype=np.int64, na_value=0)
    position = stack_index.get_indexer(stack_ids)
    known = has_stack & (position >= 0)
    chain = np.zeros(len(allocations), dtype=np.int64)  # NO_STACK unless the stack is known
    chain[known] = stack_codes[position[known]]
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    return {
        "alloc_ts": allocations["alloc_ts_ns"].to_numpy(dtype=np.int64),
        "end_ts": end_times(allocations),
        "bytes": np.rint(size * allocations["weight"].to_numpy(dtype=float)).astype(np.int64),
        "chain": chain,
        "stack": np.where(known, stack_ids, _NO_STACK),
    }


def _layer_numbers(cols: dict[str, np.ndarray], mask: np.ndarray, end_ns: int) -> tuple[int, int, int]:
    """(peak bytes, when first reached, bytes held at `end_ns`) of the allocations in `mask`."""
    alloc_ts, end_ts, size = cols["alloc_ts"][mask], cols["end_ts"][mask], cols["bytes"][mask]
    times, live = live_curve(alloc_ts, end_ts, size)
    peak_at = int(np.argmax(live))
    held = live_mask(alloc_ts, end_ts, end_ns)
    return int(live[peak_at]), int(times[peak_at]), int(size[held].sum())


def _chain_bytes(cols: dict[str, np.ndarray], layer_codes: np.ndarray, layer_names: np.ndarray,
                 at_peak: np.ndarray, end_ns: int) -> pd.DataFrame:
    """One row per (layer, chain) that made allocations: layer, chain, end_bytes, peak_bytes, stack_id."""
    alloc_ts, end_ts, size = cols["alloc_ts"], cols["end_ts"], cols["bytes"]
    frame = pd.DataFrame({
        "layer_code": layer_codes, "chain": cols["chain"], "stack": cols["stack"],
        "end_bytes": np.where(live_mask(alloc_ts, end_ts, end_ns), size, 0),
        "peak_bytes": np.where(live_mask(alloc_ts, end_ts, at_peak), size, 0),
    })
    frame = frame[frame["layer_code"] >= 0]
    groups = frame.groupby(["layer_code", "chain"], sort=False).agg(
        end_bytes=("end_bytes", "sum"), peak_bytes=("peak_bytes", "sum"), stack_id=("stack", "min")).reset_index()
    names = np.array([label_of(x) for x in layer_names], dtype=object)
    stack_id = groups["stack_id"].astype("Int64").mask(groups["stack_id"] == _NO_STACK)  # no known stack
    return groups.assign(layer=names[groups["layer_code"].to_numpy()], stack_id=stack_id).drop(columns="layer_code")


def _joined(chains_a: pd.DataFrame, chains_b: pd.DataFrame) -> pd.DataFrame:
    """Both sides' chain rows side by side on (layer, chain), with status and deltas."""
    joined = chains_a.merge(chains_b, on=["layer", "chain"], how="outer", suffixes=("_a", "_b"), indicator=True)
    status = joined["_merge"].map({"both": "both", "left_only": "gone", "right_only": "new"}).astype(object)
    byte_columns = ("end_bytes_a", "end_bytes_b", "peak_bytes_a", "peak_bytes_b")
    numbers = {c: joined[c].fillna(0).astype(np.int64) for c in byte_columns}  # 0 on the side it is absent from
    joined = joined.assign(status=status, **numbers)
    end_delta = (joined["end_bytes_b"] - joined["end_bytes_a"]).abs()
    peak_delta = (joined["peak_bytes_b"] - joined["peak_bytes_a"]).abs()
    return joined.assign(score=np.maximum(end_delta, peak_delta), end_abs=end_delta)


def _layer_diff(name: str, in_a: tuple | None, in_b: tuple | None, chains: pd.DataFrame,
                keys: np.ndarray, top: int) -> LayerDiff:
    peak_a, peak_ns_a, end_a = in_a or (0, None, 0)
    peak_b, peak_ns_b, end_b = in_b or (0, None, 0)
    changed = chains[(chains["status"] != "both") | (chains["score"] > 0)]
    # Biggest change first; ties: bytes at the end, then first-seen identity (deterministic).
    ordered = changed.sort_values(["score", "end_abs", "chain"], ascending=[False, False, True], kind="stable")
    return LayerDiff(layer=name, peak_a=peak_a, peak_b=peak_b, peak_ns_a=peak_ns_a, peak_ns_b=peak_ns_b,
                     end_a=end_a, end_b=end_b,
                     chains=[_chain_diff(row, keys) for row in ordered.head(top).itertuples(index=False)],
                     changed=len(changed), new=int((chains["status"] == "new").sum()),
                     gone=int((chains["status"] == "gone").sum()))


def _chain_diff(row, keys: np.ndarray) -> ChainDiff:
    return ChainDiff(layer=row.layer, frames=keys[row.chain], status=row.status,
                     stack_id_a=_stack_id(row.stack_id_a), stack_id_b=_stack_id(row.stack_id_b),
                     end_a=int(row.end_bytes_a), end_b=int(row.end_bytes_b),
                     peak_a=int(row.peak_bytes_a), peak_b=int(row.peak_bytes_b))


def _stack_id(value) -> int | None:
    """A representative stack id; NA (no known stack, or the chain is absent on that side) → None."""
    return None if pd.isna(value) else int(value)


def _layer_order(names: set[str]) -> list[str]:
    """Schema order (outermost first), then unknown names sorted."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))
