"""The bulk ring-buffer consumer, on a memfd laid out like a BPF ring buffer map: consumer
page, producer page, then the data area once. (The kernel maps the data area twice so that
a record crossing the end is contiguous; the consumer maps one copy, to keep its resident
size down, and joins a batch that wraps. The fake holds one copy only, so that a consumer
reading past the end would read zeros and fail.)"""
import mmap
import os
import struct

import numpy as np
import pytest

from memprof.sources.ebpf.records import EVENT_DTYPE
from memprof.sources.ebpf.ringbuf import RingBufferConsumer

PAGE = mmap.PAGESIZE
SIZE = 4 * PAGE
STRIDE = 8 + EVENT_DTYPE.itemsize  # 8-byte header + the record (8-aligned)
BUSY = 1 << 31


class FakeRing:
    def __init__(self):
        self.fd = os.memfd_create("ring")
        os.ftruncate(self.fd, 2 * PAGE + 2 * SIZE)  # the size of the kernel's area; the second copy stays zeros
        self.map = mmap.mmap(self.fd, 2 * PAGE + 2 * SIZE)
        self.prod = 0

    def produce(self, ts: int, busy: bool = False) -> None:
        rec = np.zeros(1, EVENT_DTYPE)
        rec["ts_ns"], rec["addr"], rec["kind"] = ts, 0x1000 + ts, 1
        header = struct.pack("<II", EVENT_DTYPE.itemsize | (BUSY if busy else 0), 0)
        blob = header + rec.tobytes()
        start = 2 * PAGE + (self.prod % SIZE)
        end = min(start + len(blob), 2 * PAGE + SIZE)
        self.map[start:end] = blob[: end - start]
        if (self.prod % SIZE) + len(blob) > SIZE:  # wrapped: the tail is at the start of the data area
            tail = blob[SIZE - (self.prod % SIZE):]
            self.map[2 * PAGE:2 * PAGE + len(tail)] = tail
        self.prod += STRIDE
        struct.pack_into("<Q", self.map, PAGE, self.prod)

    def commit(self, position: int) -> None:
        struct.pack_into("<I", self.map, 2 * PAGE + (position % SIZE), EVENT_DTYPE.itemsize)


@pytest.fixture
def ring():
    r = FakeRing()
    yield r
    r.map.close()
    os.close(r.fd)


def test_drains_committed_records_in_order_and_advances_the_consumer(ring):
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: EVENT_DTYPE)
    for ts in range(1, 6):
        ring.produce(ts)
    out = consumer.drain()
    assert out["ts_ns"].tolist() == [1, 2, 3, 4, 5]
    assert out["addr"].tolist() == [0x1001, 0x1002, 0x1003, 0x1004, 0x1005]
    assert consumer.consumer_pos == 5 * STRIDE
    assert consumer.drain().size == 0


def test_stops_at_the_first_record_still_being_written(ring):
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: EVENT_DTYPE)
    ring.produce(1)
    ring.produce(2, busy=True)
    ring.produce(3)
    assert consumer.drain()["ts_ns"].tolist() == [1]
    ring.commit(STRIDE)
    assert consumer.drain()["ts_ns"].tolist() == [2, 3]


def test_records_that_wrap_around_the_end_come_out_whole(ring):
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: EVENT_DTYPE)
    per_ring = SIZE // STRIDE
    seen = []
    for ts in range(1, 3 * per_ring):
        ring.produce(ts)
        if ts % 7 == 0:
            seen += consumer.drain()["ts_ns"].tolist()
    seen += consumer.drain()["ts_ns"].tolist()
    assert seen == list(range(1, 3 * per_ring))


def test_a_record_of_another_size_is_an_error_not_garbage(ring):
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: EVENT_DTYPE)
    ring.produce(1)
    struct.pack_into("<I", ring.map, 2 * PAGE, 24)
    with pytest.raises(RuntimeError, match="unexpected length 24"):
        consumer.drain()


def test_the_records_dtype_is_asked_at_the_first_drain_and_checked(ring):
    """`record` maps the ring before the command starts, without numpy: the dtype comes at
    the first drain, and one of another size than the records' is refused there."""
    asked = []
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: asked.append(1) or EVENT_DTYPE)
    assert asked == []
    ring.produce(1)
    assert consumer.drain()["ts_ns"].tolist() == [1] and consumer.drain().size == 0
    assert asked == [1]
    wrong = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize + 8, lambda: EVENT_DTYPE)
    with pytest.raises(ValueError, match="not 80"):
        wrong.drain()


@pytest.mark.parametrize("records", [1, 3])
def test_drained_records_are_a_copy_the_kernel_may_write_over(ring, records):
    """Once drained, a record's slot is the kernel's again: the records handed out must not
    alias the ring. numpy counts a one-row slice as contiguous, so a drain of one record
    came out as a view of the mapping."""
    consumer = RingBufferConsumer(ring.fd, SIZE, EVENT_DTYPE.itemsize, lambda: EVENT_DTYPE)
    for ts in range(1, records + 1):
        ring.produce(ts)
    out = consumer.drain()
    ring.map[2 * PAGE:2 * PAGE + records * STRIDE] = b"\xff" * (records * STRIDE)  # the kernel reuses the slots
    assert out["ts_ns"].tolist() == list(range(1, records + 1))
