"""Advice rule `allocator-fragmentation`: PyTorch's CUDA caching allocator is fragmented.

At a GPU's peak (memprof.analysis.gpu: the peak of its outermost measured term) the
allocator's segments (cuda_segment: reserved) hold much more than its live blocks
(cuda_block: allocated), or many segments hold free space beside live blocks: memory that
fixed-size segments keep but cannot hand to a request larger than any one free piece. With
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the allocator grows one mapped range per
stream instead, and the cached-free bytes at the peak are what it can reuse or give back.

Pure: reads the recording's analyses through Facts; sizes in bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memprof.analysis.advice.chain_text import frame_label, innermost_python
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.lifetimes import end_times, labels, live_mask
from memprof.model.schema import Layer
from memprof.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.gpu import DeviceBreakdown

FRAGMENTATION_FRACTION = Threshold(
    "FRAGMENTATION_FRACTION", 0.25, "fraction",
    "cached free / reserved at the GPU's peak at or above this: reserved is much larger than allocated")
MIN_SPLIT_SEGMENTS = Threshold(
    "MIN_SPLIT_SEGMENTS", 8, "count",
    "this many segments at the peak holding free blocks beside live ones is fragmentation at a lower fraction")
MIN_CACHED_FREE_BYTES = Threshold(
    "MIN_CACHED_FREE_BYTES", float(256 << 20), "bytes",
    "less cached free at the peak than this is not worth a change")
THRESHOLDS: tuple[Threshold, ...] = (FRAGMENTATION_FRACTION, MIN_SPLIT_SEGMENTS, MIN_CACHED_FREE_BYTES)

_SEGMENT, _BLOCK = Layer.CUDA_SEGMENT.value, Layer.CUDA_BLOCK.value
TOP_CHAINS = 3


@dataclass(frozen=True)
class _Segments:
    """The segments live on one device at one time: how many (`live`), how many hold free
    space beside live blocks (`split`) and with no live block at all (`empty`), and the
    stack ids of the split ones that hold the most free bytes (most first)."""

    live: int
    split: int
    empty: int
    split_free_bytes: int
    chains: tuple[int | None, ...]


def check(facts: Facts) -> Verdict:
    """Advice for each GPU whose caching allocator is fragmented at its peak."""
    devices = facts.gpu().result.devices
    if not devices:
        return silent("no GPU memory in this recording (needs the caching allocator's cuda_segment and cuda_block)")
    if _expandable_already(facts.rec.meta):
        return silent("expandable segments are already on (the snapshot's allocator settings say so)")
    judged = [(device, _why_not(device)) for device in devices]
    advice = [_advice(facts, device, _segments(facts, device)) for device, why in judged if why is None]
    advice = [a for a in advice if a is not None]
    if advice:
        return fired(*advice)
    reasons = [why for _, why in judged if why] or [_not_split_why()]
    return silent("; ".join(reasons))


def _expandable_already(meta) -> bool:
    """Whether an imported snapshot says expandable_segments was on (a live recording does not
    record the allocator's settings: then False)."""
    stats = (getattr(meta, "sources", None) or {}).get("torch_snapshot")
    files = ((stats.detail or {}).get("files") or []) if stats is not None else []
    for entry in files:
        settings = entry.get("allocator_settings") if isinstance(entry.get("allocator_settings"), dict) else {}
        if entry.get("expandable_segments") is True or settings.get("expandable_segments") is True:
            return True
    return False


def _why_not(device: DeviceBreakdown) -> str | None:
    """None when `device` may be fragmented enough to advise on (its segments still to be
    counted when under the fraction), else why not."""
    peak = device.peak
    if peak is None or peak.reserved is None or peak.allocated is None:
        missing = device.missing.get("cached_free") or "no peak"
        return f"{device.device}: cached free at the peak not computable ({missing})"
    if peak.cached_free < MIN_CACHED_FREE_BYTES.value:
        return (f"{device.device}: {format_bytes(peak.cached_free)} cached free at the peak "
                f"(reserved {format_bytes(peak.reserved)}, allocated {format_bytes(peak.allocated)}), under "
                f"{MIN_CACHED_FREE_BYTES.name} {format_bytes(MIN_CACHED_FREE_BYTES.value)}")
    return None


def _not_split_why() -> str:
    return (f"cached free under {FRAGMENTATION_FRACTION.name} {FRAGMENTATION_FRACTION.value:.0%} of reserved at the "
            f"peak and fewer than {MIN_SPLIT_SEGMENTS.name} {int(MIN_SPLIT_SEGMENTS.value)} segments holding free "
            "blocks beside live ones")


def _segments(facts: Facts, device: DeviceBreakdown) -> _Segments:
    """The device's segments live at its peak, each judged by the live blocks inside it."""
    allocations = facts.lifetimes.allocations
    on_device = labels(allocations["device"]) == device.device
    layer = labels(allocations["layer"])
    at = device.peak.ts_ns
    segments = _live(allocations[on_device & (layer == _SEGMENT)], at)
    blocks = _live(allocations[on_device & (layer == _BLOCK)], at)
    if segments.empty:
        return _Segments(0, 0, 0, 0, ())
    used = _used_bytes(segments, blocks)
    size = segments["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    free = np.maximum(size - used, 0)
    split = (used > 0) & (free > 0)
    stacks = segments["stack_id"].to_numpy(dtype=float, na_value=np.nan)
    order = np.argsort(-free[split], kind="stable")
    chains = []
    for stack in stacks[split][order]:
        stack_id = None if np.isnan(stack) else int(stack)
        if stack_id not in chains:
            chains.append(stack_id)
    return _Segments(live=len(segments), split=int(split.sum()), empty=int((used == 0).sum()),
                     split_free_bytes=int(free[split].sum()), chains=tuple(chains[:TOP_CHAINS]))


def _live(rows: pd.DataFrame, at: int) -> pd.DataFrame:
    alloc_ts = rows["alloc_ts_ns"].to_numpy(dtype=np.int64)
    return rows[live_mask(alloc_ts, end_times(rows), at)]


def _used_bytes(segments: pd.DataFrame, blocks: pd.DataFrame) -> np.ndarray:
    """Per segment (in `segments`' order), the bytes of live blocks whose address is inside it."""
    starts = segments["addr"].to_numpy(dtype=np.uint64)
    ends = starts + segments["size_bytes"].to_numpy(dtype=np.uint64, na_value=0)
    order = np.argsort(starts, kind="stable")
    addr = blocks["addr"].to_numpy(dtype=np.uint64)
    index = np.searchsorted(starts[order], addr, side="right") - 1
    inside = (index >= 0) & (addr < ends[order][np.maximum(index, 0)])
    used_sorted = np.zeros(len(starts), dtype=np.int64)
    np.add.at(used_sorted, index[inside], blocks["size_bytes"].to_numpy(dtype=np.int64, na_value=0)[inside])
    used = np.empty_like(used_sorted)
    used[order] = used_sorted
    return used


def _advice(facts: Facts, device: DeviceBreakdown, segments: _Segments) -> Advice | None:
    peak = device.peak
    if peak.fragmentation < FRAGMENTATION_FRACTION.value and segments.split < MIN_SPLIT_SEGMENTS.value:
        return None
    at = f"at the peak of {device.peak_of}" + (f" (step {peak.step})" if peak.step is not None else "")
    numbers = {"peak_ts_ns": peak.ts_ns, "peak_of": device.peak_of, "step": peak.step, "reserved_bytes": peak.reserved,
               "allocated_bytes": peak.allocated, "cached_free_bytes": peak.cached_free,
               "fragmentation": peak.fragmentation, "amplification": device.amplification,
               "peak_reserved_bytes": device.peak_reserved_bytes, "peak_requested_bytes": device.peak_requested_bytes,
               "segments_live": segments.live, "segments_split": segments.split, "segments_empty": segments.empty,
               "split_free_bytes": segments.split_free_bytes}
    return Advice(
        rule=RULE_ID,
        title=(f"The caching allocator on {device.device} holds {format_bytes(peak.cached_free)} free at the peak "
               f"({peak.fragmentation:.0%} of reserved)"),
        evidence=_evidence(device, segments, at) + _made_where(facts, segments.chains),
        change=("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the job's environment (torch >= 2.1): the "
                "allocator then grows one range per stream instead of keeping fixed segments whose free pieces "
                "no larger request fits"),
        saving=(f"up to {format_bytes(peak.cached_free)} less reserved at the peak: the cached-free bytes there "
                "(reserved − allocated), which expandable segments can reuse or give back; an upper bound, as "
                "blocks are still rounded up"),
        saving_bytes=int(peak.cached_free), chains=segments.chains, layer=_SEGMENT, device=device.device,
        numbers=numbers)


def _evidence(device: DeviceBreakdown, segments: _Segments, at: str) -> tuple[str, ...]:
    peak = device.peak
    lines = [f"{at.capitalize()}, reserved (cuda_segment) is {format_bytes(peak.reserved)} and allocated (cuda_block) "
             f"{format_bytes(peak.allocated)}: {format_bytes(peak.cached_free)} cached free, fragmentation "
             f"{peak.fragmentation:.1%}."]
    if segments.live:
        lines.append(f"{segments.split} of the {segments.live} segments live then hold free blocks beside live ones "
                     f"({format_bytes(segments.split_free_bytes)} free in them); {segments.empty} hold no live block.")
    if device.amplification is not None:
        lines.append(f"Peak reserved {format_bytes(device.peak_reserved_bytes)} is {device.amplification:.2f}× the "
                     f"peak requested {format_bytes(device.peak_requested_bytes)}.")
    return tuple(lines)


def _made_where(facts: Facts, chains: tuple[int | None, ...]) -> tuple[str, ...]:
    """Where the split segment with the most free space was made: its innermost Python frame."""
    frames = facts.chains([chains[0]]).get(chains[0], []) if chains and chains[0] is not None else []
    python = innermost_python(frames)
    if python is None:
        return ()
    return (f"The segment with the most free space was made in {frame_label(python)}.",)


RULE_ID = "allocator-fragmentation"
RULE = Rule(
    id=RULE_ID,
    title="The caching allocator is fragmented",
    trigger=(f"at a GPU's peak, cached free (reserved − allocated) is at least {MIN_CACHED_FREE_BYTES.name}, and "
             f"at least {FRAGMENTATION_FRACTION.name} of reserved or at least {MIN_SPLIT_SEGMENTS.name} segments "
             "hold free blocks beside live ones"),
    evidence=("reserved, allocated, cached free and the fragmentation fraction at the peak, the amplification "
              "(peak reserved / peak requested), and how many segments live at the peak hold free blocks, with "
              "the chains that allocated the emptiest ones"),
    advice="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    saving="the cached-free bytes at the peak (reserved − allocated there): what expandable segments can reuse or "
           "give back, an upper bound",
    thresholds=THRESHOLDS,
    check=check,
    needs="a GPU (PyTorch's CUDA caching allocator: a recording of a CUDA job, or `memprof import` of a snapshot)",
)
