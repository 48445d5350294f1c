"""The target's kernel allocations still held, by address: what the teardown waits for.

After the target's tree exits, the kernel still frees what it held (RCU callbacks, deferred
work), and the recorder listens on for those frees (capture/session.py, TEARDOWN_*). Other
frees come too. The address filter in BPF (bpf/common.bpf.c) lets through every address the
target was ever handed, and the kernel hands a freed address to its next taker at once, so
other processes' frees of reused addresses pass it: 1,000-3,000 in the second after a
training run's exit, against 100-1,000 of the target's own (bench/RESULTS.md). Counted as
"frees still coming", they kept the teardown waiting. This keeps the target's held kernel
addresses, so that the teardown counts only the frees of those.

Cheap on the hot path: a batch's addresses are appended as they come and folded into a
sorted array of held addresses only every COMPACT_AT events, or when asked."""
from __future__ import annotations

import numpy as np

from memprof.model.schema import Action, Layer
from memprof.recording import arrow_build

COMPACT_AT = 1 << 18  # events kept unfolded at most: 9 bytes each
_PAGE_BIT = np.uint64(1)  # slab and page addresses are 8-aligned: the layer fits in bit 0


class KernelLiveAddresses:
    """Kernel slab and page addresses the recorded processes were handed and did not free."""

    def __init__(self, compact_at: int = COMPACT_AT) -> None:
        self._compact_at = compact_at
        self._held = np.empty(0, np.uint64)  # sorted keys, as of the last fold
        self._keys: list[np.ndarray] = []    # keys since then, in event order
        self._allocs: list[np.ndarray] = []  # True: that event handed the key out
        self._unfolded = 0

    def update(self, columns: dict) -> None:
        """Take in an events batch as the decoder gives it (sources/ebpf/decode.py)."""
        keys, allocs = _kernel_events(columns)
        if keys.size == 0:
            return
        self._keys.append(keys)
        self._allocs.append(allocs)
        self._unfolded += keys.size
        if self._unfolded >= self._compact_at:
            self._fold()

    def frees_of_held(self, columns: dict) -> int:
        """How many frees in the batch `columns` are of addresses held before it (call it
        before update() with the same batch)."""
        keys, allocs = _kernel_events(columns)
        freed = keys[~allocs]
        if freed.size == 0:
            return 0
        return int(np.isin(freed, self.held(), assume_unique=False).sum())

    def held(self) -> np.ndarray:
        """The held keys (address | 1 for a page), sorted."""
        if self._keys:
            self._fold()
        return self._held

    def _fold(self) -> None:
        keys = np.concatenate([self._held, *self._keys])
        allocs = np.concatenate([np.ones(self._held.size, bool), *self._allocs])
        # The last event of each key decides whether it is held: np.unique on the reversed
        # events gives each key's first index there, which is its last event.
        distinct, last = np.unique(keys[::-1], return_index=True)
        self._held = distinct[allocs[::-1][last]]
        self._keys, self._allocs, self._unfolded = [], [], 0


def _kernel_events(columns: dict) -> tuple[np.ndarray, np.ndarray]:
    """The batch's kernel allocations and frees, in time order: (keys, is_alloc)."""
    layer = columns["layer"]
    layer_codes = arrow_build.to_numpy(layer, null_as=-1).astype(np.int64)
    layer_names = layer.dictionary.to_pylist()
    action = columns["action"]
    action_codes = arrow_build.to_numpy(action, null_as=-1).astype(np.int64)
    action_names = action.dictionary.to_pylist()
    page = layer_codes == _code_of(layer_names, Layer.KERNEL_PAGE.value)
    kernel = page | (layer_codes == _code_of(layer_names, Layer.KERNEL_SLAB.value))
    alloc = action_codes == _code_of(action_names, Action.ALLOC.value)
    chosen = kernel & (alloc | (action_codes == _code_of(action_names, Action.FREE.value)))
    if not chosen.any():
        return np.empty(0, np.uint64), np.empty(0, bool)
    # A batch holds each CPU's events in turn: a free on one CPU and the address's reuse on
    # another must be taken in the order they happened.
    order = np.argsort(np.asarray(columns["ts_ns"])[chosen], kind="stable")
    keys = np.asarray(columns["addr"]).astype(np.uint64)[chosen] | np.where(page[chosen], _PAGE_BIT, np.uint64(0))
    return keys[order], alloc[chosen][order]


def _code_of(names: list[str], name: str) -> int:
    return names.index(name) if name in names else -2  # -2 matches no code, not even a null's
