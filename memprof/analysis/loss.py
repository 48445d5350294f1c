"""What the recording could not see, per layer, from its metadata."""
from __future__ import annotations

from memprof.model import Layer, RecordingMeta

# Which layer's frees each kernel tracepoint reports.
_FREE_TRACEPOINT_LAYER = {
    "kfree": Layer.KERNEL_SLAB.value,
    "kmem_cache_free": Layer.KERNEL_SLAB.value,
    "mm_page_free": Layer.KERNEL_PAGE.value,
    "mm_page_free_batched": Layer.KERNEL_PAGE.value,
}


def skipped_frees_by_layer(meta: RecordingMeta) -> dict[str, int]:
    """Frees the kernel skipped (BPF recursion protection), per layer: each could be the free
    of an allocation a report shows as still live."""
    out: dict[str, int] = {}
    for stats in meta.sources.values():
        for tracepoint, n in stats.missed.items():
            layer = _FREE_TRACEPOINT_LAYER.get(tracepoint)
            if layer and n:
                out[layer] = out.get(layer, 0) + int(n)
    return out


def recording_notes(meta: RecordingMeta) -> list[str]:
    """Plain-words notes on how complete the chains are, for every report."""
    notes = list(meta.notes)
    for name, stats in meta.sources.items():
        failures = int(stats.detail.get("stack_failures", 0) or 0)
        if failures:
            notes.append(f"{name}: {failures} stacks could not be captured (stack map full, or a bucket taken by another stack); those allocations "
                         "are shown with their call site only")
        if stats.detail.get("site_cache_full"):
            notes.append(f"{name}: the call-site stack cache overflowed {stats.detail['site_cache_full']} times; "
                         "more allocations than usual took a fresh stack")
        if stats.stack_sample_every > 1:
            notes.append(f"{name}: one slab allocation in {stats.stack_sample_every} (pages: one in "
                         f"{stats.detail.get('page_stack_sample_every', 1)}) took its own stack; the others share the "
                         "latest stack taken at the same call site and user stack depth (record --stack-every 1 for all)")
    return notes
