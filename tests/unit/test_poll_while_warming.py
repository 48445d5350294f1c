"""EbpfSource.poll while the decoder warms on its thread (warm_decoder: pandas imported
once the command runs): lifecycle records are applied at once, so a library the target
maps is probed without waiting; memory records are held, in order, and decoded with the
first poll after the warm-up; the last poll waits for it; nothing drained is dropped."""
from __future__ import annotations

import threading

import numpy as np

from memprof.sources.ebpf.records import EVENT_DTYPE
from memprof.sources.ebpf.source import EbpfSource


class _Ring:
    def __init__(self):
        self.batches: list[np.ndarray] = []

    def drain(self) -> np.ndarray:
        return self.batches.pop(0) if self.batches else np.empty(0, EVENT_DTYPE)


def _records(*timestamps: int) -> np.ndarray:
    recs = np.zeros(len(timestamps), EVENT_DTYPE)
    recs["ts_ns"] = timestamps
    return recs


def _source(release: threading.Event) -> tuple[EbpfSource, _Ring, list, list]:
    source = EbpfSource()
    ring, applied, decoded = _Ring(), [], []
    source._ring = ring
    source._apply_lifecycle = lambda recs: applied.append(recs["ts_ns"].tolist())
    source.decoder.decode = lambda recs: decoded.append(recs["ts_ns"].tolist()) or recs.size
    source._warming = threading.Thread(target=release.wait, daemon=True)
    source._warming.start()
    return source, ring, applied, decoded


def test_memory_records_wait_for_the_warm_up_and_lifecycle_ones_do_not():
    release = threading.Event()
    source, ring, applied, decoded = _source(release)
    ring.batches = [_records(1, 2), _records(3)]
    assert source.poll() is None and source.poll() is None
    assert applied == [[1, 2], [3]] and decoded == [] and source.last_drained == 1
    release.set()
    source._warming.join()
    ring.batches = [_records(4)]
    assert source.poll() == 4  # the stub decode's row count: all held, in order, at once
    assert decoded == [[1, 2, 3, 4]] and source.stats.events == 4
    assert source.poll() is None and decoded == [[1, 2, 3, 4]]


def test_the_last_poll_waits_for_the_warm_up():
    release = threading.Event()
    source, ring, applied, decoded = _source(release)
    ring.batches = [_records(7, 8)]
    assert source.poll() is None
    threading.Timer(0.2, release.set).start()
    assert source.poll(wait=True) == 2
    assert decoded == [[7, 8]]
