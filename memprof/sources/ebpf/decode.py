"""Ring-buffer records (`struct mp_event`, records.py) → columns of the events table.

Array operations only: no Python object per event, since a kernel-heavy job makes over a
million events a second. Kernel addresses are replaced by their images under the
recording's key (addrkey.py) before they reach any table. The columns are numpy and pyarrow
arrays (category columns as DictionaryArrays, nullable integers as masked Arrow arrays), what
the writer stores as they are: the recorder never imports pandas (~45 MB and ~0.25 s of CPU
beside the command, issue 24)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple

from memprof.lazy_import import numpy as np, pyarrow as pa
from memprof.model import Action, Layer
from memprof.model.schema import Mark
from memprof.recording import arrow_build
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.addrkey import AddressKey

LAYER_NAMES = [layer.value for layer in Layer]
ACTION_NAMES = [action.value for action in Action]
DEVICE_NAMES = ["cpu", "cuda"]
# The mark records' `category`: the index of each kind's label in MARK_NAMES.
MARK_NAMES = [Mark.EXIT.value, Mark.EXEC.value]
# The record's layer bytes that record --native-sample-bytes and --kernel-sample-bytes sample.
_NATIVE_LAYERS = [R.LAYER_CODES.index(Layer.NATIVE_HEAP.value)]
_KERNEL_LAYERS = [R.LAYER_CODES.index(Layer.KERNEL_SLAB.value), R.LAYER_CODES.index(Layer.KERNEL_PAGE.value)]


class _Lookups(NamedTuple):
    """Per record byte (0-255): the layer byte's index in LAYER_NAMES, the kind's in
    ACTION_NAMES, and the kind's in MARK_NAMES (-1: none)."""

    layer: "np.ndarray"
    action: "np.ndarray"
    mark: "np.ndarray"


@functools.cache
def _lookups() -> _Lookups:
    """Built at the first decode, not at import: importing this module imports no numpy
    (memprof/lazy_import.py)."""
    layer = np.full(256, -1, dtype=np.int8)
    for code, name in enumerate(R.LAYER_CODES):
        layer[code] = LAYER_NAMES.index(name)
    action = np.full(256, ACTION_NAMES.index(Action.FREE.value), dtype=np.int8)
    action[list(R.ALLOC_KINDS)] = ACTION_NAMES.index(Action.ALLOC.value)
    action[[R.EXIT_MARK, R.PROC_EXEC]] = ACTION_NAMES.index(Action.MARK.value)
    mark = np.full(256, -1, dtype=np.int8)
    mark[R.EXIT_MARK], mark[R.PROC_EXEC] = 0, 1
    return _Lookups(layer, action, mark)


@dataclass
class EventBatch:
    """Decoded memory events as columns of the events table (no `seq`: the session adds it)."""

    columns: dict
    rows: int


class MemoryDecoder:
    """Decodes the memory records of a drained batch (allocations, frees, and the exit and
    exec marks).

    `intern(kstack_ids, ustacks, pids, call_sites, py_stacks) -> stack ids` is the stack
    interner's; `native_sample_bytes` and `kernel_sample_bytes` are the byte sampling the BPF
    side applied to the libc heap and to the kernel's allocations (0 = none), from which each
    sampled allocation's weight follows."""

    def __init__(self, intern: Callable[..., np.ndarray], native_sample_bytes: int = 0,
                 address_key: AddressKey | None = None, kernel_sample_bytes: int = 0):
        self.intern = intern
        self.native_sample_bytes = native_sample_bytes
        self.kernel_sample_bytes = kernel_sample_bytes
        # Drawn per recording, never saved: kernel addresses reach the events table only as
        # their images under it (see addrkey.py).
        self.address_key = address_key or AddressKey.generate()

    def decode(self, recs: np.ndarray) -> EventBatch:
        """Columns of the events table for the memory records among `recs`."""
        lookups = _lookups()
        kinds = recs["kind"]
        mem = recs[(kinds <= R.USER_FREE) | (lookups.mark[kinds] >= 0)]
        k, layer, flags = mem["kind"], mem["layer"], mem["flags"]
        is_alloc = np.isin(k, R.ALLOC_KINDS)
        mark_index = lookups.mark[k]
        is_mark = mark_index >= 0
        size = mem["size"].astype(np.int64)
        requested = np.where(k == R.USER_ALLOC, size, mem["requested"].astype(np.int64))
        stack_ids = np.zeros(mem.size, dtype=np.int64)
        stack_ids[is_alloc] = self.intern(
            mem["kstack_id"][is_alloc], mem["ustack"][is_alloc], mem["pid"][is_alloc], mem["call_site"][is_alloc],
            mem["py_stack"][is_alloc])
        is_device = (layer == R.LAYER_CODES.index(Layer.CUDA_DRIVER.value)) & ((flags & R.FLAG_HOST) == 0) & ~is_mark
        columns = {
            "ts_ns": mem["ts_ns"].astype(np.int64),
            "layer": _categorical(np.where(is_mark, -1, lookups.layer[layer]).astype(np.int8), LAYER_NAMES),
            "action": _categorical(lookups.action[k], ACTION_NAMES),
            "addr": self.keyed_addresses(k, mem["addr"]),
            "size_bytes": _masked(size, (~is_alloc & (size == 0)) | is_mark),
            "requested_bytes": _masked(requested, ~is_alloc),
            "device": _categorical(is_device.astype(np.int8), DEVICE_NAMES),
            "pid": mem["pid"].astype(np.int32),
            "tid": mem["tid"].astype(np.int32),
            "stack_id": _masked(stack_ids, ~is_alloc),
            "category": _categorical(mark_index, MARK_NAMES, pa.int32()),  # the schema's: labels are many
            "weight": self.weights(is_alloc, layer, size),
        }
        return EventBatch(columns, int(mem.size))

    def keyed_addresses(self, kinds: np.ndarray, addrs: np.ndarray) -> np.ndarray:
        """The `addr` column: kernel addresses (slab objects, struct pages) replaced by their
        images under this recording's key, so that the user's files do not show the kernel's
        layout; user-space addresses (the target's own) as they are."""
        # KERNEL_KINDS are 1..4 (records.py checks): one uint8 comparison, where a table
        # lookup costs twice as much and np.isin four times (ns an event, bench/addrkey_cost.py).
        kernel = (kinds - np.uint8(R.SLAB_ALLOC)) < np.uint8(len(R.KERNEL_KINDS))
        if not kernel.any():
            return addrs
        if kernel.all():  # the kernel-heavy case: one pass, no gather and scatter
            return self.address_key.apply(addrs)
        keyed = addrs.copy()
        keyed[kernel] = self.address_key.apply(addrs[kernel])
        return keyed

    def weights(self, is_alloc: np.ndarray, layer: np.ndarray, size: np.ndarray) -> np.ndarray:
        """A sampled allocation of a layer sampled at N bytes (libc's, the kernel's) stands for
        max(1, N/size) allocations; others: null (1)."""
        weight = np.full(size.size, np.nan)
        for n, layers in ((self.native_sample_bytes, _NATIVE_LAYERS), (self.kernel_sample_bytes, _KERNEL_LAYERS)):
            if n > 0:
                sampled = is_alloc & np.isin(layer, layers)
                weight[sampled] = np.maximum(1.0, n / np.maximum(size[sampled], 1))
        return weight


def _categorical(codes: np.ndarray, categories: list[str], index_type: pa.DataType | None = None) -> pa.DictionaryArray:
    """A category column: `codes` index `categories`, -1 is null; indices of the schema's
    `index_type` (None: int8), so that the writer stores the array as it is (recording/writer.py)."""
    indices = arrow_build.numeric(codes, index_type or pa.int8(), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(indices, _dictionary(tuple(categories)))


@functools.cache
def _dictionary(categories: tuple[str, ...]) -> pa.Array:
    """One Arrow array per category list, built once (four columns a poll, every 20 ms)."""
    return arrow_build.strings(categories)


def _masked(values: np.ndarray, null_mask: np.ndarray) -> pa.Array:
    """Nullable int64 column: `values` where `null_mask` is False, null elsewhere."""
    return arrow_build.numeric(values, pa.int64(), mask=null_mask)  # both already int64 and bool
