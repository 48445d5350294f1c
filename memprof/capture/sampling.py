"""The samplers (RSS/PSS, NVML) on a thread of their own: a PSS read of a large process
takes milliseconds, and the ring buffer must keep being drained meanwhile."""
from __future__ import annotations

import threading
import time

from memprof.model import SourceStats
from memprof.sources.samplers import Samplers, empty_rows


class SamplerThread:
    """Samples the processes in `pids` (a tuple the recorder replaces as the tree changes)
    every `samplers.period_s`; `take_rows()` hands over what was sampled since last time."""

    def __init__(self, samplers: Samplers | None = None):
        self.samplers = samplers or Samplers()
        self.pids: tuple[int, ...] = ()
        self._rows = empty_rows()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memprof-samplers", daemon=True)
        self.ticks = 0
        self._final_status: dict | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.samplers.due(time.monotonic()) and self.pids:
                rows = self.samplers.sample(self.pids, time.monotonic_ns())
                with self._lock:
                    for name, values in rows.items():
                        self._rows[name].extend(values)
                    self.ticks += 1
            self._stop.wait(self.samplers.period_s / 4)

    def take_rows(self) -> dict[str, list]:
        with self._lock:
            rows, self._rows = self._rows, empty_rows()
        return rows

    def stats(self) -> SourceStats:
        status = self._final_status or self.samplers.status()
        return SourceStats(events=self.ticks, timestamp_precision_ns=1, detail=status)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._final_status = self.samplers.status()  # before close(): it would say "closed"
        self.samplers.close()
