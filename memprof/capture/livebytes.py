"""Live bytes per layer while recording, for the status line.

Exact, and cheap at millions of events a second: within a batch only the *last* event of
each (layer, address) matters, so Python touches each distinct address once per batch."""
from __future__ import annotations

from collections import defaultdict

from memprof.lazy_import import numpy as np
from memprof.recording import arrow_build


class LiveBytes:
    def __init__(self):
        self._live: dict[int, tuple[str, int]] = {}  # key -> (layer, bytes)
        self.bytes_by_layer: dict[str, int] = defaultdict(int)

    def update(self, columns: dict) -> None:
        """`columns`: an events batch as the decoder gives it (sources/ebpf/decode.py: layer
        and action as Arrow DictionaryArrays, size_bytes a nullable Arrow array)."""
        layer_codes, layer_names = _codes_and_names(columns["layer"])
        action_codes, action_names = _codes_and_names(columns["action"])
        is_alloc = action_codes == _code_of(action_names, "alloc")
        memory = is_alloc | (action_codes == _code_of(action_names, "free"))
        if not memory.any():
            return
        ts = np.asarray(columns["ts_ns"])[memory]
        # Addresses are at least 8-aligned: the layer code fits in the low bits of the key.
        codes = layer_codes[memory]
        keys = np.asarray(columns["addr"])[memory] | codes.astype(np.uint64)
        order = np.argsort(ts, kind="stable")
        keys, allocs = keys[order], is_alloc[memory][order]
        sizes = arrow_build.to_numpy(columns["size_bytes"], null_as=0)[memory][order]
        names = np.asarray(layer_names, dtype=object)[codes[order]]
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


def _codes_and_names(column) -> tuple[np.ndarray, list[str]]:
    """An Arrow DictionaryArray's codes (null as -1, int64) and its dictionary."""
    return arrow_build.to_numpy(column, null_as=-1).astype(np.int64), column.dictionary.to_pylist()


def _code_of(names: list[str], name: str) -> int:
    return names.index(name) if name in names else -2  # -2 matches no code, not even a null's
