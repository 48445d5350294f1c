"""How often EbpfSource does its fixed-cost work (issue 24: beside a GPT-2 generation most of
the recorder's CPU was such work). poll drains the ring at every call and decodes the drained
memory events only when asked, or once DECODE_MAX_RECORDS wait; what was drained comes back
once, in order, and lifecycle events and held frees are applied at the drain. periodic
re-reads the processes' maps at most once per PERIODIC_S."""
from __future__ import annotations

import numpy as np

from memprof.sources.ebpf import records as R
from memprof.sources.ebpf import source as source_module
from memprof.sources.ebpf.source import EbpfSource


class _Ring:
    """Hands out the prepared drains one per call, then empty ones."""

    def __init__(self, drains: list[np.ndarray]):
        self.drains = list(drains)

    def drain(self) -> np.ndarray:
        return self.drains.pop(0) if self.drains else np.empty(0, dtype=R.EVENT_DTYPE)


def _records(first_ts: int, n: int, kind: int = R.SLAB_ALLOC, flags: int = 0) -> np.ndarray:
    recs = np.zeros(n, dtype=R.EVENT_DTYPE)
    recs["ts_ns"] = np.arange(first_ts, first_ts + n)
    recs["kind"], recs["flags"], recs["pid"], recs["size"] = kind, flags, 100, 64
    return recs


def _source(drains) -> tuple[EbpfSource, list[int]]:
    source = EbpfSource()
    source._ring = _Ring(drains)
    decoded: list[int] = []
    real = source.decoder.decode
    source.decoder.decode = lambda recs: decoded.append(len(recs)) or real(recs)
    source.decoder.intern = lambda *columns: np.zeros(len(columns[0]), dtype=np.int64)
    return source, decoded


def test_drains_wait_undecoded_until_a_poll_asks_and_come_back_once_in_order():
    source, decoded = _source([_records(0, 3), _records(3, 2), _records(5, 4)])
    assert source.poll(decode=False) is None and source.poll(decode=False) is None
    assert source.stats.events == 5 and decoded == []
    batch = source.poll(decode=True)
    assert decoded == [9] and batch.rows == 9
    assert np.asarray(batch.columns["ts_ns"]).tolist() == list(range(9))
    assert source.poll(decode=True) is None  # nothing left, nothing twice


def test_too_many_waiting_are_decoded_without_being_asked(monkeypatch):
    monkeypatch.setattr(source_module, "DECODE_MAX_RECORDS", 5)
    source, decoded = _source([_records(0, 3), _records(3, 3), _records(6, 1)])
    assert source.poll(decode=False) is None
    assert source.poll(decode=False).rows == 6 and decoded == [6]
    assert source.poll(decode=False) is None and source.poll(decode=True).rows == 1


def test_held_frees_and_exits_are_applied_at_the_drain():
    source, decoded = _source([np.concatenate([_records(10, 2, R.SLAB_FREE, R.FLAG_HELD), _records(20, 1, R.PROC_EXIT)])])
    source.processes.add(100, None, 1)
    forgotten = []
    source._python = type("Frames", (), {"forget": lambda self, pid: forgotten.append(pid)})()
    assert source.poll(decode=False) is None and decoded == []
    assert source.last_held_free_ns == 11 and source._held_frees == 2
    assert source.last_exit_ns() == 20 and forgotten == [100]


def test_the_maps_are_reread_whole_at_most_once_a_period(monkeypatch):
    source = EbpfSource()
    rereads = []
    source._refresh_processes = lambda only_stale: rereads.append(only_stale)
    clock = [100.0]
    monkeypatch.setattr(source_module.time, "monotonic", lambda: clock[0])
    source.periodic()
    clock[0] += source_module.PERIODIC_S / 2
    source.periodic()  # a flush later: not yet
    assert rereads == [False]
    clock[0] += source_module.PERIODIC_S / 2
    source.periodic()
    assert rereads == [False, False]


def test_a_process_that_mapped_a_file_executable_has_its_maps_read_again_a_poll_later():
    """MAP_EXEC is sent as mmap is entered: the drain that reads it may read the maps before
    the mapping exists, so the next poll reads them once more (and the one after does not)."""
    source, _ = _source([_records(10, 1, R.MAP_EXEC), np.empty(0, dtype=R.EVENT_DTYPE)])
    source.processes.add(100, None, 1)
    source.processes.procs[100].stale = False
    reads = []
    source._refresh_processes = lambda only_stale, mapped_ns=None: reads.append(
        (only_stale, source.processes.procs[100].stale)) or setattr(source.processes.procs[100], "stale", False)
    source.poll(decode=False)
    assert reads == [(True, True)]
    source.poll(decode=False)
    assert reads == [(True, True), (True, True)]
    source.poll(decode=False)
    assert len(reads) == 2
