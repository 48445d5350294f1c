"""Bulk consumer of a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) through its mmap'd pages.

bcc's own consumer calls a Python function per record, which cannot keep up with millions
of kernel events a second. The ring buffer's layout is kernel ABI (kernel/bpf/ringbuf.c):
page 0 holds the consumer position (writable), page 1 the producer position, and the data
area follows, which the kernel maps twice back to back so a record that wraps is still
contiguous. Each record has an 8-byte header (u32 length with BUSY and DISCARD bits, u32
page offset) and is padded to 8 bytes. All our records have one size, so a batch is a
strided numpy view.

The consumer position is published with one aligned 8-byte store (`_publish`), as libbpf's
smp_store_release: the kernel reads it at every reservation. struct.pack_into zero-fills its
target before it packs the value, and a reservation that read the 0 in between saw the ring
full once the producer had passed one ring's length (`new_prod_pos - cons_pos > mask` in
kernel/bpf/ringbuf.c): ~1 event in 100,000 lost on kernel churn after the first wrap, with
the ring nearly empty.

This consumer maps the data area once, not twice: the kernel fills in every page of the
mapping at mmap, so the second copy would add the ring's whole size to the recorder's
resident size (128 MB at the default) for the few batches that wrap, which are joined
from their two pieces instead (issue 24: the recorder's size).
"""
from __future__ import annotations

import ctypes
import mmap
import struct
from typing import Callable

from memprof.lazy_import import numpy as np

_BUSY_BIT = 1 << 31
_DISCARD_BIT = 1 << 30
_HEADER_BYTES = 8
_PAGE = mmap.PAGESIZE


class RingBufferConsumer:
    """Reads fixed-size records of `dtype` from a ring buffer map fd of `size_bytes` data.

    `drain()` returns every committed record since the last call as a structured numpy array
    (a copy), and advances the consumer position so the kernel can reuse the space.
    """

    def __init__(self, map_fd: int, size_bytes: int, record_bytes: int, dtype: Callable[[], np.dtype]):
        """`dtype()` gives the records' numpy dtype (of `record_bytes` each), asked at the first
        drain, so that importing the recorder imports no numpy (memprof/lazy_import.py)."""
        if size_bytes & (size_bytes - 1):
            raise ValueError("ring buffer size must be a power of two")
        self._size = size_bytes
        self._mask = size_bytes - 1
        self._record_bytes = record_bytes
        self._dtype_of = dtype
        self._stride = (_HEADER_BYTES + record_bytes + 7) & ~7
        self._consumer = mmap.mmap(map_fd, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._consumer_word = ctypes.c_uint64.from_buffer(self._consumer)  # page-aligned: one store
        self._producer = mmap.mmap(map_fd, _PAGE + size_bytes, mmap.MAP_SHARED, mmap.PROT_READ, offset=_PAGE)
        self._views: tuple[np.ndarray, np.dtype] | None = None  # the data area's bytes, the records' dtype

    def _data_and_dtype(self) -> tuple[np.ndarray, np.dtype]:
        if self._views is None:
            dtype = self._dtype_of()
            if dtype.itemsize != self._record_bytes:
                raise ValueError(f"records of {dtype.itemsize} bytes, not {self._record_bytes}")
            self._views = np.frombuffer(self._producer, dtype=np.uint8, offset=_PAGE), dtype
        return self._views

    @property
    def consumer_pos(self) -> int:
        return self._consumer_word.value

    def _publish(self, position: int) -> None:
        """Hand the kernel back the space before `position`: one aligned 8-byte store, never
        a value in between (see the module's docstring)."""
        self._consumer_word.value = position

    @property
    def producer_pos(self) -> int:
        return struct.unpack_from("<Q", self._producer, 0)[0]

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Committed records since the last drain, oldest first (at most `max_records`)."""
        data, dtype = self._data_and_dtype()
        cons = self.consumer_pos
        avail = self.producer_pos - cons
        n = avail // self._stride
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return np.empty(0, dtype=dtype)
        raw = self._span(data, cons & self._mask, n * self._stride).reshape(n, self._stride)
        lengths = raw[:, :4].copy().view("<u4").ravel()
        n = self._committed_prefix(lengths)
        if n == 0:
            return np.empty(0, dtype=dtype)
        self._check_lengths(lengths[:n])
        body = raw[:n, _HEADER_BYTES:_HEADER_BYTES + self._record_bytes]
        # A copy always: the slots are the kernel's again once the consumer position moves.
        # (np.ascontiguousarray copied only when it had to, and a one-row slice counts as
        # contiguous: a drain of one record was a view of the mapping.)
        records = body.copy().view(dtype).ravel()
        self._publish(cons + n * self._stride)
        return records

    def _span(self, data: np.ndarray, start: int, length: int) -> np.ndarray:
        """`length` bytes of the data area `data` from `start`: a view, or, for a batch that
        wraps past the end, a copy of its two pieces joined (`length` never exceeds the ring)."""
        end = start + length
        if end <= self._size:
            return data[start:end]
        return np.concatenate((data[start:], data[:end - self._size]))

    @staticmethod
    def _committed_prefix(lengths: np.ndarray) -> int:
        """Records are committed out of order across CPUs; stop at the first still BUSY."""
        busy = np.flatnonzero(lengths & _BUSY_BIT)
        return int(busy[0]) if busy.size else int(lengths.size)

    def _check_lengths(self, lengths: np.ndarray) -> None:
        # We never discard and every record has one size; anything else means the map is
        # shared with a program of another layout, which would make every later row garbage.
        bad = (lengths & ~np.uint32(_DISCARD_BIT)) != self._record_bytes
        if bad.any():
            raise RuntimeError(f"ring buffer record of unexpected length {int(lengths[bad][0])}")

    def close(self) -> None:
        self._views = None
        self._consumer_word = None  # an exported pointer: the mapping cannot close while it lives
        self._producer.close()
        self._consumer.close()
