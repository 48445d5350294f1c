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
