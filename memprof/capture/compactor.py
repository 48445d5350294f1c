"""Keeping a recording under `record --max-size` while it is written (issue 23 item 1).

After each flush, on the thread that writes the recording, the compactor looks at what the
recording takes on disk, counting its folded part twice: a fold writes the new folded part
beside the old one, and deletes the old only once the new is renamed in (a recorder killed
in between loses nothing), so for that moment the disk holds both. Past three quarters of
the limit, so counted, it folds the oldest events parts,
together with what it folded before, into one folded part (analysis/compaction.py says what
is kept row for row and what is folded), and deletes the parts it replaced
(recording/writer.py, PART_NAME, says why a reader never sees both).

What it never folds: the newest parts, a quarter of the limit (full detail for the most
recent window); anything while the recording is under three quarters of the limit (a short
run is never folded). It folds a chunk of at least CHUNK_ROWS / 2 rows at a time (any,
past URGENT_AT of the limit), so the folded part is rewritten seldom.

What it reads at once is bounded, and with it the recorder's own memory: at most CHUNK_ROWS
rows of parts plus the folded part, and the folded part is kept near FOLDED_ROWS_MAX rows: when
a fold leaves it larger, or leaves what folding keeps (the folded part, the other tables)
with the newest quarter over the limit, the compactor folds the new part again, in memory,
with twice the window; if that leaves at least MIN_GAIN fewer rows,
the next folds use the wider window (up to MAX_WINDOW_NS), which merges each pair of windows'
folded allocations. What no window folds is kept whatever its size: allocations still live
when they are folded (the program's own data, a leak's allocations), and the folded
allocations of each step (a step of LLM generation is one token, and folding keeps steps
apart). When that is what passes the limit, wider windows would only lose detail: the
window stays, and meta.json's notes say at once, and once, what took the limit and what
limit would hold it (`over_limit_note`); the recording then grows with what stays live.
If folding fails (a bug, a damaged part), it stops and says so in meta.json's notes: the
recording goes on unfolded, and nothing already recorded is lost."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from memprof.heap import trim_heap
from memprof.recording.parts import row_count
from memprof.recording.writer import PART_NAME, TABLES, RecordingWriter, table_of
from memprof.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_WINDOW_NS = 1_000_000_000     # 1 s: live bytes are exact at every second's edge
MAX_WINDOW_NS = 3600 * 1_000_000_000  # an hour: coarser windows would say little of growth
CHUNK_ROWS = 500_000                  # rows of parts folded at once (at least half, unless urgent)
FOLDED_ROWS_MAX = 1_000_000           # rows of the folded part: past this, the window doubles
START_AT = 0.75                       # of the limit: fold past this much
URGENT_AT = 0.95                      # of the limit: fold whatever can be, however little
# A free this long before the newest event folded that follows no allocation is unmatched for
# good: the ring buffer reorders events by milliseconds, so its allocation is not still coming.
SETTLE_NS = 1_000_000_000
RECENT_SHARE = 0.25                   # of the limit: the newest parts, never folded
MIN_GAIN = 0.1                        # of the folded part's rows: what a doubled window must save


@dataclass(frozen=True)
class _Folded:
    """What one fold left: the folded part's `rows`, and of the allocations kept row for row,
    how many were `still_live` and how many `crossing` window edges
    (analysis/compaction.FoldResult)."""

    rows: int
    still_live: int
    crossing: int


@dataclass(frozen=True)
class _Sizes:
    """What a recording takes on disk, in bytes: `total` now; `kept`, what of it folding keeps
    (the latest folded part and the other tables: all but the plain events parts); `folded`,
    the latest folded part, which a fold's new one joins on disk for a moment."""

    total: int
    kept: int
    folded: int

    @property
    def at_fold(self) -> int:
        """What the disk holds while the next fold writes its folded part (about the old one's size)."""
        return self.total + self.folded

    @property
    def floor(self) -> int:
        """What no fold of plain parts takes away, counted as at_fold counts it."""
        return self.kept + self.folded


@dataclass(frozen=True)
class _Part:
    index: int
    folded: bool
    path: Path
    size: int
    rows: int


class Compactor:
    """Folds the events of the recording `writer` writes to keep it under `max_bytes`.
    `origin_ns`: where fold windows are counted from (the recording's start). The writer is
    made with read_back=True: the folds take only the parts it says it wrote."""

    def __init__(self, writer: RecordingWriter, max_bytes: int, origin_ns: int, window_ns: int = DEFAULT_WINDOW_NS,
                 chunk_rows: int = CHUNK_ROWS):
        self.writer = writer
        self.max_bytes = max_bytes
        self.origin_ns = origin_ns
        self.window_ns = window_ns
        self.chunk_rows = chunk_rows
        self.stopped = False
        self.said_over = False  # a note said the recording passed its limit (at most one does)
        self.final_bytes = 0  # what the finalized recording takes (at_end)
        self._fruitless_trial_rows: int | None = None  # rows of the folded part when a trial last saved too little
        self._rows: dict[str, int] = {}  # rows of each part seen, by path: footers read once

    def after_flush(self) -> bool:
        """Fold once if the recording is past START_AT of the limit and old parts can be
        folded; True if it folded. Never raises: a failure stops folding (module docstring)."""
        if self.stopped:
            return False
        try:
            return self._fold_if_needed()
        except Exception as e:  # noqa: BLE001 - the recording must survive any failure here
            self.stopped = True
            self.writer.meta.notes.append(f"record --max-size: folding stopped ({type(e).__name__}: {e}); "
                                          "the recording went on without folding, nothing was lost")
            return False

    def _fold_if_needed(self) -> bool:
        parts = events_parts(self.writer.path / "events", self._rows, self.writer.wrote)
        sizes = _sizes_of(recording_bytes(self.writer.path), parts)
        if sizes.at_fold <= START_AT * self.max_bytes:
            return False
        folded, chunk = self._chunk(parts)
        if not chunk:
            self._note_if_over(None)  # all that is left to fold is the newest quarter
            return False
        if sum(p.rows for p in chunk) < self.chunk_rows // 2 and sizes.at_fold <= URGENT_AT * self.max_bytes:
            return False  # wait for a chunk worth rewriting the folded part for
        outcome, events = self._fold(folded, chunk)
        # Over the limit with what folding keeps and the newest quarter alone: folding more of
        # the same kind cannot help (a backlog of plain parts is folded by the next folds).
        beyond = self._sizes().floor + RECENT_SHARE * self.max_bytes > self.max_bytes
        if beyond or outcome.rows > FOLDED_ROWS_MAX:
            if self.window_ns < MAX_WINDOW_NS and self._worth_a_trial(outcome.rows) \
                    and self._wider_window_helps(events, outcome.rows):
                self.window_ns = min(2 * self.window_ns, MAX_WINDOW_NS)
            elif beyond:
                self._note_if_over(outcome)
        del events
        _give_back_memory()
        return True

    def at_end(self) -> bool:
        """Once the recording is finalized (on the thread that writes it): keep what it takes
        in `final_bytes`, and if it ended over the limit and no note said so yet, say it now (a
        last flush can pass it). True if a note was added."""
        self.final_bytes = recording_bytes(self.writer.path)
        if self.stopped or self.said_over:
            return False
        self._note_if_over(None, at_end=True)
        return self.said_over

    def _chunk(self, parts: list[_Part]) -> tuple[_Part | None, list[_Part]]:
        """The latest folded part (None: none yet) and the oldest plain parts after it to fold
        now: at most chunk_rows rows (at least one part), none of the newest RECENT_SHARE."""
        latest = max((p for p in parts if p.folded), key=lambda p: p.index, default=None)
        plain = [p for p in parts if not p.folded and (latest is None or p.index > latest.index)]
        recent, kept = 0, len(plain)
        while kept > 0 and recent < RECENT_SHARE * self.max_bytes:
            kept -= 1
            recent += plain[kept].size
        chunk, rows = [], 0
        for part in plain[:kept]:
            if chunk and rows + part.rows > self.chunk_rows:
                break
            chunk.append(part)
            rows += part.rows
        return latest, chunk

    def _fold(self, folded: _Part | None, chunk: list[_Part]) -> tuple[_Folded, pd.DataFrame]:
        """Fold `chunk` with the folded part before it (if any) into a new folded part; what
        the fold left, and the folded part's frame (for a trial at a wider window)."""
        # The folding machinery is pandas: imported at the first fold, which a recording under
        # three quarters of its limit never makes (the recorder imports no pandas, issue 24).
        from memprof.analysis.compaction import fold_events
        from memprof.recording.reader import _read_part, frame_of_tables
        began = time.monotonic_ns()
        inputs = ([folded] if folded else []) + chunk
        tables = [_read_part(p.path, "events", TABLES["events"]) for p in inputs]
        events = frame_of_tables("events", tables)
        del tables
        order = np.lexsort((events["seq"].to_numpy(), events["ts_ns"].to_numpy()))
        events = events.iloc[order].reset_index(drop=True)
        latest = int(events["ts_ns"].max())
        result = fold_events(events, origin_ns=self.origin_ns, window_ns=self.window_ns, module=_module_codes(events),
                             settled_before_ns=latest - SETTLE_NS)
        table = table_of("events", {name: result.events[name] for name in TABLES["events"].names})
        fold = {"at_ns": began, "took_ns": time.monotonic_ns() - began, "through_ns": latest,
                "window_ns": self.window_ns,
                "events_before": len(events), "events_after": table.num_rows,
                "folded_allocations": result.folded_pairs, "protected_allocations": result.protected,
                "unmatched_frees_dropped": sum(result.unmatched_frees_dropped.values()),
                "live_allocations": result.still_live, "crossing_allocations": result.crossing}
        self.writer.install_folded_events(chunk[-1].index, table, [p.path for p in inputs], fold)
        del events, table
        return _Folded(fold["events_after"], result.still_live, result.crossing), result.events

    def _worth_a_trial(self, rows: int) -> bool:
        """A trial fold costs about a fold: after one that saved too little, the next waits
        until the folded part has grown by a quarter."""
        return self._fruitless_trial_rows is None or rows > 1.25 * self._fruitless_trial_rows

    def _wider_window_helps(self, events: pd.DataFrame, rows: int) -> bool:
        """Whether folding the folded part (`events`, `rows` rows) again with twice the window
        leaves at least MIN_GAIN fewer rows (in memory only: the next fold does it for good).
        It does not where what is kept is live, or apart by step."""
        if not len(events):
            return False
        from memprof.analysis.compaction import fold_events
        trial = fold_events(events, origin_ns=self.origin_ns, window_ns=2 * self.window_ns,
                            module=_module_codes(events))
        helps = len(trial.events) <= (1 - MIN_GAIN) * rows
        self._fruitless_trial_rows = None if helps else rows
        return helps

    def _sizes(self) -> _Sizes:
        """What the recording takes on disk now (module docstring)."""
        return _sizes_of(recording_bytes(self.writer.path),
                         events_parts(self.writer.path / "events", self._rows, self.writer.wrote))

    def _note_if_over(self, outcome: _Folded | None, at_end: bool = False) -> None:
        """Once, when the recording is over the limit, and what folding keeps with the newest
        quarter of the limit is too (before the end; a backlog of plain parts, or a last part
        that took the newest quarter past its share, is folded by the next folds):
        over_limit_note into meta.json's notes."""
        if self.said_over:
            return
        sizes = self._sizes()
        if at_end:  # no fold comes: what it takes is what it takes
            if sizes.total <= self.max_bytes:
                return
        elif sizes.at_fold <= self.max_bytes or sizes.floor + RECENT_SHARE * self.max_bytes <= self.max_bytes:
            return
        self.said_over = True
        at_s = (time.monotonic_ns() - self.origin_ns) / 1e9
        self.writer.meta.notes.append(over_limit_note(self.max_bytes, sizes, at_s, self.window_ns,
                                                      outcome.still_live if outcome else None,
                                                      outcome.crossing if outcome else None))


def _sizes_of(total: int, parts: list[_Part]) -> _Sizes:
    """_Sizes of a recording that takes `total` bytes, with these events `parts`."""
    plain = sum(p.size for p in parts if not p.folded)
    latest = max((p for p in parts if p.folded), key=lambda p: p.index, default=None)
    return _Sizes(total, total - plain, latest.size if latest else 0)


def over_limit_note(max_bytes: int, sizes: _Sizes, at_s: float, window_ns: int,
                    still_live: int | None, crossing: int | None) -> str:
    """The note for a recording that passed --max-size at `at_s` s (from its start): what it
    took (`sizes`, the folded part counted twice: module docstring), what took it
    (`still_live`, `crossing`: of the latest fold's allocations kept row for row; None where
    no fold just ran), and the limit that would hold it, in MiB: twice what no fold takes
    away, so that the newest quarter and a chunk to fold fit beside it."""
    needed_mib = max(16, -(-2 * sizes.floor // (1 << 20)))  # 16 MiB: the least --max-size takes
    why = (f": {still_live:,} allocations still live when they were folded (the program's own data or a leak: "
           f"reports need each) and {crossing:,} freed in a later {window_ns / 1e9:g}s window than their own, "
           "beside the folded allocations of each step, kept apart; a wider window would not shrink it"
           if still_live is not None else "")
    return (f"record --max-size: the recording passed its limit of {format_bytes(max_bytes)} ({max_bytes:,} bytes) "
            f"at +{at_s:.0f}s, taking {sizes.total:,} bytes and {sizes.at_fold:,} while a fold rewrites its "
            f"{sizes.folded:,}-byte folded part: {sizes.kept:,} of them what folding keeps (the folded events, the "
            f"chains, the samples), {sizes.total - sizes.kept:,} events not folded yet (the newest quarter of the "
            f"limit and any that came faster than folding){why}. It grows from there with what stays live; a "
            f"--max-size of at least {needed_mib:,}MiB would hold what it keeps now")


def _module_codes(events) -> np.ndarray:
    """Per row of `events` (time order), the code of the nn.Module running on its thread (-1: none)."""
    from memprof.timeline import with_modules
    return with_modules(events)["module"].cat.codes.to_numpy().astype(np.int64)


def _give_back_memory() -> None:
    """Return what a fold freed to the system: Arrow's pool keeps freed buffers for reuse,
    and glibc keeps freed heap below its top; a recorder that runs for hours should not hold
    its largest fold's memory between folds."""
    pa.default_memory_pool().release_unused()
    trim_heap()


def events_parts(folder: Path, rows_seen: dict[str, int],
                 wrote: Callable[[str, os.stat_result], bool] | None = None) -> list[_Part]:
    """The events parts in `folder`, by index, with their size on disk and rows (footers
    read once: `rows_seen` keeps them by path; a folded part is a new file each time, so
    its entry is dropped when it is replaced). `wrote(path, lstat)`: whether memprof's writer
    put that file there; others are left out. The recorded command can write into its
    recording, and a part it planted (3,000,000 rows in 147 KB) was read whole by a fold."""
    parts = []
    for entry in os.scandir(folder):
        match = PART_NAME.match(entry.name)
        if match and entry.is_file(follow_symlinks=False) and (
                wrote is None or wrote(entry.path, entry.stat(follow_symlinks=False))):
            if entry.path not in rows_seen or match.group(2):
                rows_seen[entry.path] = row_count(Path(entry.path))
            parts.append(_Part(int(match.group(1)), bool(match.group(2)), Path(entry.path), entry.stat().st_size,
                               rows_seen[entry.path]))
    present = {str(p.path) for p in parts}
    for gone in [path for path in rows_seen if path not in present]:
        del rows_seen[gone]
    return sorted(parts, key=lambda p: (p.index, p.folded))


def recording_bytes(path: Path) -> int:
    """What the recording's files take, in bytes (every file under it: its tables' parts,
    the agent's folder, meta.json; links not followed)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # a temporary file renamed meanwhile
                continue
            total += info.st_size
    return total
