"""Memory that is held on purpose: what is live at the end but is not a leak.

- PyTorch's caching allocator keeps segments (layer `cuda_segment`) after the tensors in them
  are freed, to reuse them; a segment with no live block (`cuda_block`) inside is cache.
- The kernel keeps page cache, dentries, inodes and extent caches after the files are closed;
  they are reclaimed under memory pressure, not freed by the process.

Pure functions; no I/O. Times are CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import labels
from memprof.model.schema import FrameKind, Layer

_NEVER = np.iinfo(np.int64).max

# Kernel functions that fill reclaimable caches (Linux 5.x–6.18 names): page cache, the
# xarray nodes that index it, dentries, inodes of filesystems, ext4's extent-status cache.
_KERNEL_CACHE_FUNCTIONS = re.compile(
    r"^(__filemap_add_folio|filemap_alloc_folio\w*|filemap_add_folio|page_cache_ra_\w+|"
    r"add_to_page_cache_lru|__page_cache_alloc|xas_alloc|xas_nomem|radix_tree_node_alloc\w*|"
    r"__d_alloc|d_alloc\w*|alloc_inode|\w+_alloc_inode|ext4_es_alloc_extent|__es_alloc_extent)$")
# Filesystems' inode allocators that are not caches: a socket or pipe inode lives as long as
# its file descriptor.
_NOT_CACHE_INODES = {"sock_alloc_inode"}


def kernel_cache_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids whose kernel frames include a cache-filling function (module docstring)."""
    kernel = frames[frames["kind"] == FrameKind.KERNEL.value]
    names = kernel["function"].fillna("").str.replace(r"\+0x[0-9a-f]+$", "", regex=True)
    is_cache = names.str.match(_KERNEL_CACHE_FUNCTIONS) & ~names.isin(_NOT_CACHE_INODES)
    cache_frames = kernel.loc[is_cache.to_numpy(), "frame_id"]
    return frozenset(int(s) for s in stacks.loc[stacks["frame_id"].isin(cache_frames), "stack_id"].unique())


def cached_segments(allocations: pd.DataFrame, at_ns: np.ndarray) -> np.ndarray:
    """Per allocation: True for a `cuda_segment` live at its `at_ns` with no `cuda_block`
    of the same device live then at an address inside it ([addr, addr + size_bytes))."""
    layer = labels(allocations["layer"])
    is_segment = layer == Layer.CUDA_SEGMENT.value
    out = np.zeros(len(allocations), dtype=bool)
    if not is_segment.any():
        return out
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = allocations["end_ts_ns"].to_numpy(dtype=np.int64, na_value=_NEVER)
    device = labels(allocations["device"])
    addr = allocations["addr"].to_numpy().astype(np.uint64)
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0).astype(np.uint64)
    when = float(np.max(at_ns[is_segment]))  # blocks are judged at the latest segment time
    live_block = (layer == Layer.CUDA_BLOCK.value) & (alloc_ts <= when) & (when < end_ts)
    for dev in np.unique(device[is_segment].astype(str)):
        blocks = np.sort(addr[live_block & (device == dev)])
        segs = np.flatnonzero(is_segment & (device == dev))
        inside = np.searchsorted(blocks, addr[segs] + size[segs], "left") - np.searchsorted(blocks, addr[segs], "left")
        out[segs] = inside == 0
    return out
