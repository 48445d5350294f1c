"""Allocation chains as users see them: a chain is its frames, not the ids it was captured
under. Two raw stacks can read the same once symbolized (a tracing frame that comes and goes
when another tracer attaches, return addresses within one line), and must count as one."""
from __future__ import annotations

import enum
from typing import Mapping

import numpy as np
import pandas as pd

from memprof.model.schema import EVAL_LOOP_FUNCTIONS, FrameKind


class NativeFrames(str, enum.Enum):
    """How a chain reads where CPython's evaluation loop ran Python frames (--native-frames)."""

    MERGED = "merged"  # the eval-loop frames are dropped from chains that hold the Python frames they ran
    ALL = "all"        # every native frame is kept


NATIVE_FRAMES = tuple(mode.value for mode in NativeFrames)
DEFAULT_NATIVE_FRAMES = NativeFrames.MERGED.value


def check_native_frames(native_frames: str) -> None:
    """ValueError unless `native_frames` is one of NATIVE_FRAMES."""
    if native_frames not in NATIVE_FRAMES:
        raise ValueError(f"native_frames must be one of {NATIVE_FRAMES}, not {native_frames!r}")


def canonical_stacks(stacks: pd.DataFrame) -> dict[int, int]:
    """stack_id -> the smallest stack_id with exactly the same frame sequence; only ids that
    have a smaller twin appear (the rest are their own canonical id).

    Vectorized: stacks are grouped by (length, two 64-bit fingerprints of their frames), and
    every twin found is then compared frame by frame with its canonical stack, so the answer
    is exact; on a fingerprint collision (never seen) the per-stack comparison decides."""
    if stacks.empty:
        return {}
    ids, frames, starts, lengths = _sorted_sequences(stacks)
    first = _first_with_same_fingerprint(frames, starts, lengths, ids[starts])
    twins = np.flatnonzero(first != np.arange(len(starts)))
    if not _same_frames(frames, starts[twins], starts[first[twins]], lengths[twins]):
        return _canonical_by_tuples(stacks)
    return {int(ids[starts[i]]): int(ids[starts[first[i]]]) for i in twins}


def _sorted_sequences(stacks: pd.DataFrame):
    """(stack ids, frame ids) in (stack_id, depth) order; each stack's first row and row count."""
    ids, depth = stacks["stack_id"].to_numpy(), stacks["depth"].to_numpy()
    order = np.lexsort((depth, ids))
    ids, frames = ids[order], stacks["frame_id"].to_numpy()[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return ids, frames, starts, np.diff(np.r_[starts, len(ids)])


def _first_with_same_fingerprint(frames, starts, lengths, stack_ids) -> np.ndarray:
    """Per stack: the index (into `starts`) of the smallest-id stack with its length and fingerprints."""
    position = np.arange(len(frames)) - np.repeat(starts, lengths)
    value = frames.astype(np.uint64) + np.uint64(1)
    prints = {f"h{k}": np.add.reduceat(_mix(value * np.uint64(2 * k + 1) + _mix(position.astype(np.uint64) + np.uint64(k))),
                                       starts) for k in range(2)}
    table = pd.DataFrame({"length": lengths, "stack": np.arange(len(starts)), "id": stack_ids, **prints})
    smallest = table.sort_values("id", kind="stable").groupby(["length", "h0", "h1"], sort=False)["stack"].transform("first")
    return smallest.sort_index().to_numpy()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: uint64 → well-spread uint64 (wrapping arithmetic intended)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _same_frames(frames, starts_a, starts_b, lengths) -> bool:
    """Whether each stack a (rows from starts_a) has the frames of b (rows from starts_b)."""
    if len(lengths) == 0:
        return True
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return bool((frames[np.repeat(starts_a, lengths) + offsets] == frames[np.repeat(starts_b, lengths) + offsets]).all())


def _canonical_by_tuples(stacks: pd.DataFrame) -> dict[int, int]:
    """The exact, slow way (one tuple per stack): only after a fingerprint collision."""
    ordered = stacks.sort_values(["stack_id", "depth"], kind="stable")
    sequences = ordered.groupby("stack_id", sort=True)["frame_id"].agg(tuple)
    first = sequences.groupby(sequences).transform(lambda ids: ids.index.min())
    return {int(sid): int(canon) for sid, canon in first.items() if sid != canon}


def with_canonical_stacks(allocations: pd.DataFrame, canonical: Mapping[int, int] | None) -> pd.DataFrame:
    """`allocations` with each stack_id replaced by its canonical id."""
    if not canonical:
        return allocations
    ids = allocations["stack_id"]
    values = ids.to_numpy(dtype=np.int64, na_value=0)  # a fresh copy: changed below
    aliased = np.flatnonzero(np.isin(values, np.fromiter(canonical, dtype=np.int64, count=len(canonical)))
                             & ids.notna().to_numpy())
    if len(aliased) == 0:
        return allocations
    # Only the aliased rows change (a few chains), not a whole-column map of millions of rows.
    values[aliased] = pd.Series(values[aliased]).map(canonical).to_numpy(dtype=np.int64)
    return allocations.assign(stack_id=pd.arrays.IntegerArray(values, ids.isna().to_numpy()))


def chain_frame_ids(stacks: pd.DataFrame, frames: pd.DataFrame, stack_ids,
                    native_frames: str = DEFAULT_NATIVE_FRAMES) -> pd.DataFrame:
    """The frames of each chain in `stack_ids` as rows (stack_id, frame_id), both int64: stacks
    by id, each innermost (depth 0) first — the chains `leaks.chain_frames` gives as one dict
    per frame, here as two columns (a million frames in well under a second). Null ids are
    skipped; an id with no stack rows has no rows. `native_frames` "merged" drops the
    interpreter's eval-loop frames from chains that hold a Python frame, as chain_frames does;
    "all" keeps them. A frame_id missing from `frames` is kept (it reads as unknown)."""
    check_native_frames(native_frames)
    wanted = pd.array(list(stack_ids), dtype="Int64").dropna().to_numpy(dtype=np.int64)
    rows = stacks[stacks["stack_id"].isin(np.unique(wanted))]
    order = np.lexsort((rows["depth"].to_numpy(), rows["stack_id"].to_numpy()))
    chain = rows["stack_id"].to_numpy(dtype=np.int64)[order]
    frame = rows["frame_id"].to_numpy(dtype=np.int64)[order]
    if native_frames == NativeFrames.MERGED and len(chain):
        keep = ~_eval_loop_under_python(chain, frame, frames)
        chain, frame = chain[keep], frame[keep]
    return pd.DataFrame({"stack_id": chain, "frame_id": frame})


def _eval_loop_under_python(chain: np.ndarray, frame: np.ndarray, frames: pd.DataFrame) -> np.ndarray:
    """Per row: an eval-loop native frame in a chain (rows grouped by chain) that holds a Python frame."""
    table = frames.drop_duplicates("frame_id").set_index("frame_id")
    kind = table["kind"].reindex(frame).to_numpy(dtype=object)
    function = table["function"].reindex(frame).to_numpy(dtype=object)
    starts = np.flatnonzero(np.r_[True, chain[1:] != chain[:-1]])
    has_python = np.maximum.reduceat((kind == FrameKind.PYTHON.value).astype(np.int8), starts).astype(bool)
    in_python_chain = np.repeat(has_python, np.diff(np.r_[starts, len(chain)]))
    is_eval_loop = (kind == FrameKind.NATIVE.value) & np.isin(function, list(EVAL_LOOP_FUNCTIONS))
    return is_eval_loop & in_python_chain
