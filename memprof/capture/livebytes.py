"""Live bytes per layer while recording, for the status line.

Exact, and cheap at millions of events a second: within a batch only the *last* event of
each (layer, address) matters, so Python touches each distinct address once per batch."""
from __future__ import annotations

from collections import defaultdict

import numpy as np


class LiveBytes:
    def __init__(self):
        self._live: dict[int, tuple[str, int]] = {}  # key -> (layer, bytes)
        self.bytes_by_layer: dict[str, int] = defaultdict(int)

    def update(self, columns: dict) -> None:
        """`columns`: an events batch (layer and action as pandas Categoricals)."""
        layer, action = columns["layer"], columns["action"]  # pandas Categoricals
        is_alloc = np.asarray(action == "alloc")
        memory = is_alloc | np.asarray(action == "free")
        if not memory.any():
            return
        ts = np.asarray(columns["ts_ns"])[memory]
        # Addresses are at least 8-aligned: the layer code fits in the low bits of the key.
        keys = np.asarray(columns["addr"])[memory] | layer.codes[memory].astype(np.uint64)
        order = np.argsort(ts, kind="stable")
        keys, allocs = keys[order], is_alloc[memory][order]
        import pandas as pd  # here, not at import: a recording imports it after the command starts (issue 24)
        sizes = np.asarray(pd.array(columns["size_bytes"])[memory].fillna(0), dtype=np.int64)[order]
        names = np.asarray(layer.categories, dtype=object)[layer.codes[memory][order]]
        _, last_rev = np.unique(keys[::-1], return_index=True)
        for i in (keys.size - 1 - last_rev).tolist():
            self._apply(int(keys[i]), names[i], bool(allocs[i]), int(sizes[i]))

    def _apply(self, key: int, layer: str, alloc: bool, size: int) -> None:
        old = self._live.pop(key, None)
        if old is not None:
            self.bytes_by_layer[old[0]] -= old[1]
        if alloc:
            self._live[key] = (layer, size)
            self.bytes_by_layer[layer] += size
