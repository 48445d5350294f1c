"""memprof's ring-buffer consumer against the kernel's producer, past many wraps of the ring.

A small BPF program writes one record of memprof's event size for every system call of one
command (`dd` copying byte by byte: two system calls a byte) into a 64 MiB ring, and counts
what it tried and what the kernel refused. `RingBufferConsumer` drains it on a thread
every 5 ms (bench/bpf_floor.py's `Drain`), as the recorder does every 20. The command writes
~240 MB of records: the ring wraps about four times, while it never holds more than a few MB
(a drain would have to stall ~0.5 s for it to fill).

Every record must be drained once: none refused, none read twice. Until the consumer
published its position with one 8-byte store, struct.pack_into zero-filled the position
before writing it, a reservation that read the 0 saw the ring full once the producer had
passed one ring's length, and this test lost ~1 record in 100,000 after the first wrap.
"""
from __future__ import annotations

import mmap
import subprocess

from memprof.sources.ebpf.records import EVENT_BYTES
from tests.bench_modules import load_bench

RING_BYTES = 64 << 20
BYTES_COPIED = 1_500_000  # dd bs=1: a read and a write each, ~3 M records, ~240 MB of ring

PROGRAM = """
BPF_RINGBUF_OUTPUT(events, %(pages)d);
BPF_ARRAY(target, u32, 1);
BPF_ARRAY(tally, u64, 2);  /* [0] records tried, [1] records the kernel refused */
struct rec { u8 bytes[%(record)d]; };

RAW_TRACEPOINT_PROBE(sys_enter)
{
    u32 zero = 0, one = 1;
    u32 *tgid = target.lookup(&zero);
    if (!tgid || *tgid != bpf_get_current_pid_tgid() >> 32)
        return 0;
    u64 *tried = tally.lookup(&zero), *refused = tally.lookup(&one);
    if (!tried || !refused)
        return 0;
    __sync_fetch_and_add(tried, 1);
    struct rec *r = events.ringbuf_reserve(sizeof(struct rec));
    if (!r) {
        __sync_fetch_and_add(refused, 1);
        return 0;
    }
    __builtin_memset(r, 0, sizeof(*r));
    events.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
    return 0;
}
""" % {"pages": RING_BYTES // mmap.PAGESIZE, "record": EVENT_BYTES}


def test_every_record_is_drained_once_across_many_wraps_of_the_ring():
    from bcc import BPF
    bpf = BPF(text=PROGRAM.encode(), cflags=["-w"])  # attaches sys_enter by the function's name
    try:
        # The command waits for a line before it execs, so that its pid is the filter's first.
        child = subprocess.Popen(["sh", "-c", 'read _ && exec "$0" "$@"', "dd", "if=/dev/zero", "of=/dev/null",
                                  "bs=1", f"count={BYTES_COPIED}"],
                                 stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        target = bpf[b"target"]
        target[target.Key(0)] = target.Leaf(child.pid)
        drain = load_bench("bpf_floor").Drain(bpf[b"events"].map_fd, RING_BYTES)  # every 5 ms, on a thread
        child.stdin.write(b"\n")
        child.stdin.close()
        assert child.wait(timeout=120) == 0
        drain.close()  # after a last drain
        tally = bpf[b"tally"]
        tried, refused = (tally[tally.Key(i)].value for i in (0, 1))
    finally:
        bpf.cleanup()
    producer_laps = drain.produced_bytes / RING_BYTES
    assert tried >= 2 * BYTES_COPIED
    assert producer_laps > 3, "the ring must wrap several times for this test to mean anything"
    assert refused == 0, f"the kernel refused {refused} of {tried} records with the ring drained every 5 ms"
    assert drain.records == tried
