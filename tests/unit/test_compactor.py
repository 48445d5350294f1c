"""Issue 23 item 1: `record --max-size` folds the oldest parts while the recording is written
(capture/compactor.py). The same events written twice, once with a compactor after every
flush: the folded recording is smaller, says what was folded, reads with every part it
replaced gone, and reports the same leaks, peaks and per-chain totals as the full one."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memprof.capture.compactor import Compactor, events_parts, recording_bytes
from memprof.cli.main import cli
from memprof.model.meta import RecordingMeta
from memprof.recording.reader import open_recording
from memprof.recording.writer import RecordingWriter
from tests.diff_factories import stacks_frames

MS = 1_000_000
S = 1000 * MS
SECONDS = 30
CHURN_PER_S = 2000     # chain 1: 256-byte buffers, each freed 0.2 ms later
LEAK_PER_S = 10        # chain 2: 4 KiB buffers, never freed: 300 held at the end
CROSSING_PER_S = 3     # chain 3: 1 KiB buffers freed 0.7 s later (most outlive their second)
CHAINS = {1: [("python", "churn", "train.py", "train.py", 10)],
          2: [("python", "leak", "train.py", "train.py", 20)],
          3: [("python", "carry", "train.py", "train.py", 30)],
          4: [("python", "spike", "train.py", "train.py", 40)]}


def second_of_events(second: int, rng: np.random.Generator) -> dict:
    """The events of one second (plus a 64 x 1 MiB spike, the peak, in second 17)."""
    rows: list[tuple] = []  # (ts, action, addr, size, stack)
    base = second * S
    for i in range(CHURN_PER_S):
        ts = base + int(i * (S // CHURN_PER_S)) + int(rng.integers(0, 1000))
        addr = 0x10_0000 + (i % 64) * 0x100
        rows += [(ts, "alloc", addr, 256, 1), (ts + 200_000, "free", addr, None, None)]
    for i in range(LEAK_PER_S):
        rows.append((base + i * 7 * MS + 3, "alloc", 0x9000_0000 + (second * LEAK_PER_S + i) * 0x1000, 4096, 2))
    for i in range(CROSSING_PER_S):
        ts, addr = base + 400 * MS + i * MS, 0x7000_0000 + (second * CROSSING_PER_S + i) * 0x1000
        rows += [(ts, "alloc", addr, 1024, 3), (ts + 700 * MS, "free", addr, None, None)]
    if second == 17:
        for i in range(64):
            rows += [(base + 500 * MS + i, "alloc", 0x5000_0000 + i * 0x10_0000, 1 << 20, 4),
                     (base + 510 * MS + i, "free", 0x5000_0000 + i * 0x10_0000, None, None)]
    ts, action, addr, size, stack = zip(*rows)
    return {"ts_ns": np.array(ts, dtype=np.int64), "action": list(action), "addr": np.array(addr, dtype=np.uint64),
            "size_bytes": [s for s in size], "stack_id": [s for s in stack], "layer": "native_heap",
            "device": "cpu", "pid": 100, "tid": 100}


def write(path, max_bytes: int | None, events_of_second=None, chains=None):
    """The same 30 s of events (`events_of_second`, default second_of_events, over `chains`),
    one flush per 250 ms of them (frees that come later than their flush go in the next one,
    as the recorder's would), folded after each flush when `max_bytes` is given."""
    events_of_second = events_of_second or second_of_events
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=100, start_ns=0)
    writer = RecordingWriter(path, meta, read_back=bool(max_bytes))  # as record makes it
    stacks, frames = stacks_frames(chains or CHAINS)
    writer.append("stacks", {name: stacks[name] for name in stacks.columns})
    writer.append("frames", {name: frames[name] for name in frames.columns})
    compactor = Compactor(writer, max_bytes, origin_ns=0, chunk_rows=8000) if max_bytes else None
    rng = np.random.default_rng(7)
    pool, seq = None, 0
    for second in range(SECONDS + 1):
        if second < SECONDS:
            pool = _joined(pool, events_of_second(second, rng))
        for quarter in range(4):
            end = second * S + (quarter + 1) * (S // 4) if second < SECONDS else np.iinfo(np.int64).max
            batch, pool = _split(pool, end)
            if batch is None:
                continue
            batch["seq"] = np.arange(seq, seq + len(batch["ts_ns"]))
            seq += len(batch["ts_ns"])
            writer.append("events", {**batch, "layer": "native_heap", "device": "cpu", "pid": 100, "tid": 100})
            writer.flush()
            if compactor:
                compactor.after_flush()
    writer.finalize(end_ns=(SECONDS + 1) * S)
    return compactor


_COLUMNS = ("ts_ns", "action", "addr", "size_bytes", "stack_id")


def _joined(pool, cols):
    if pool is None:
        return {name: np.asarray(cols[name], dtype=object) for name in _COLUMNS}
    return {name: np.concatenate([pool[name], np.asarray(cols[name], dtype=object)]) for name in _COLUMNS}


def _split(pool, end):
    """(rows of `pool` before `end`, as append() takes them, or None; the rest, or None)."""
    if pool is None:
        return None, None
    now = pool["ts_ns"].astype(np.int64) < end
    later = {name: v[~now] for name, v in pool.items()} if (~now).any() else None
    if not now.any():
        return None, later
    batch = {name: v[now] for name, v in pool.items()}
    batch = {"ts_ns": batch["ts_ns"].astype(np.int64), "addr": batch["addr"].astype(np.uint64),
             "action": list(batch["action"]), "size_bytes": list(batch["size_bytes"]),
             "stack_id": list(batch["stack_id"])}
    return batch, later


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    root = tmp_path_factory.mktemp("compactor")
    full, folded = root / "full.memprof", root / "folded.memprof"
    write(full, None)
    compactor = write(folded, 600_000)
    return full, folded, compactor


def report(*args) -> dict:
    result = CliRunner().invoke(cli, ["report", *map(str, args), "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_folded_recording_is_smaller_and_says_what_was_folded(recordings):
    full, folded, compactor = recordings
    meta = open_recording(folded).meta
    assert meta.folds and meta.format_version == 2 and not compactor.stopped
    assert recording_bytes(folded) < recording_bytes(full) / 3
    assert all(f["events_after"] < f["events_before"] for f in meta.folds)
    parts = events_parts(folded / "events", {})
    assert sum(p.folded for p in parts) == 1  # each fold replaced the one before, and the parts it folded
    assert sum(p.size for p in parts if not p.folded) >= 0.25 * 600_000  # the newest quarter: never folded
    assert meta.flushed_rows["events"] == sum(p.rows for p in parts)


def second_with_a_large_live_set(second: int, rng: np.random.Generator) -> dict:
    """second_of_events, and 400 more 64-byte allocations of chain 2 that are never freed: a
    folded part that is a large share of a small limit."""
    cols = second_of_events(second, rng)
    n = 400
    ts = second * S + np.arange(n) * (S // n) + 11
    addr = np.uint64(0xA000_0000) + (np.uint64(second * n) + np.arange(n, dtype=np.uint64)) * np.uint64(0x40)
    return {**cols, "ts_ns": np.concatenate([cols["ts_ns"], ts]), "action": cols["action"] + ["alloc"] * n,
            "addr": np.concatenate([cols["addr"], addr]), "size_bytes": cols["size_bytes"] + [64] * n,
            "stack_id": cols["stack_id"] + [2] * n}


def test_the_disk_holds_no_more_than_the_limit_while_a_fold_writes(tmp_path, monkeypatch):
    """A fold writes its new folded part beside the old one and the parts it replaces, and
    deletes them only once it is renamed in. Measured right then, with a folded part of about
    a quarter of the limit, the recording is within it (counting the folded part once, the
    disk held about 468,000 bytes against a limit of 450,000)."""
    from memprof.recording.writer import RecordingWriter as Writer
    at_folds, write_file = [], Writer._write_file

    def measured(self, folder, name, table):
        written = write_file(self, folder, name, table)
        if name.endswith("-f.parquet"):
            at_folds.append(recording_bytes(self.path))
        return written
    monkeypatch.setattr(Writer, "_write_file", measured)
    path = tmp_path / "r.memprof"
    compactor = write(path, 450_000, second_with_a_large_live_set)
    meta = open_recording(path).meta
    [folded] = [p for p in events_parts(path / "events", {}) if p.folded]
    assert len(meta.folds) == len(at_folds) > 5 and not compactor.stopped and not meta.notes, meta.notes
    assert folded.size > 450_000 / 5
    assert max(at_folds) <= 450_000, at_folds


def test_leaks_are_the_same_as_on_the_full_recording(recordings):
    full, folded, _ = recordings

    def findings(path):
        leaks = report("leaks", path)
        return sorted(json.dumps({k: v for k, v in f.items() if k != "explanation"}, sort_keys=True)
                      for f in leaks["findings"] + leaks["not_leaks"])
    assert findings(folded) == findings(full)
    [leak] = report("leaks", full)["findings"]
    assert (leak["kind"], leak["live_count"], leak["live_bytes"], leak["stack"][0]["function"]) == \
        ("grows_per_step", SECONDS * LEAK_PER_S, SECONDS * LEAK_PER_S * 4096, "leak")


def test_peak_and_what_held_it_are_the_same(recordings):
    full, folded, _ = recordings

    def peak(path):
        layer = report("peak", path)
        return json.dumps({k: v for k, v in layer.items() if k not in ("notes", "recording")}, sort_keys=True)
    assert peak(folded) == peak(full)


def test_allocations_and_bytes_per_chain_are_the_same(recordings):
    full, folded, _ = recordings

    full_layers, folded_layers = report("layers", full), report("layers", folded)
    assert json.dumps(full_layers["layers"], sort_keys=True) == json.dumps(folded_layers["layers"], sort_keys=True)
    [native] = [layer for layer in full_layers["layers"] if layer["layer"] == "native_heap"]
    assert native["alloc_count"] == SECONDS * (CHURN_PER_S + LEAK_PER_S + CROSSING_PER_S) + 64, native


def test_a_folded_recording_notes_it_in_every_report(recordings):
    _, folded, _ = recordings
    notes = [n["text"] for n in report("summary", folded)["notes"]]
    assert any(n.startswith("record --max-size: the events up to +") for n in notes), notes


def test_superseded_parts_left_by_a_killed_recorder_are_not_read(recordings, tmp_path):
    """The folded part is renamed in before the parts it replaces are deleted: a recorder
    killed in between leaves them, and the recording reads the same."""
    _, folded, _ = recordings
    copy = tmp_path / "copy.memprof"
    os.system(f"cp -r {folded} {copy}")
    [latest] = [p for p in events_parts(copy / "events", {}) if p.folded]
    (copy / "events" / "part-000000.parquet").write_bytes((copy / "events" / latest.path.name).read_bytes())
    assert len(open_recording(copy).events) == len(open_recording(folded).events)


def test_a_fold_that_fails_stops_folding_and_loses_nothing(tmp_path, monkeypatch):
    """Folding is an optimisation: if it fails, the recording goes on whole and says why."""
    def broken(*args, **kwargs):
        raise RuntimeError("simulated")
    monkeypatch.setattr("memprof.analysis.compaction.fold_events", broken)  # imported at the fold
    path = tmp_path / "r.memprof"
    compactor = write(path, 600_000)
    recording = open_recording(path)
    assert compactor.stopped and not recording.meta.folds
    assert any("folding stopped (RuntimeError: simulated)" in n for n in recording.meta.notes), recording.meta.notes
    expected = SECONDS * (2 * CHURN_PER_S + LEAK_PER_S + 2 * CROSSING_PER_S) + 2 * 64
    assert len(recording.events) == expected


def test_a_limit_smaller_than_what_stays_live_is_noted_at_once_and_the_window_kept(tmp_path):
    """Under 20 KB nothing fits: the leaked allocations, live when they are folded, take it
    with the tables' own overhead. The window widens while that folds a tenth more of the
    churn, then stays (a wider one would fold none of the leak, and only lose detail), and
    meta.json says once what took the limit and what limit would hold it."""
    path = tmp_path / "r.memprof"
    compactor = write(path, 20_000)
    assert 1 * S <= compactor.window_ns <= 16 * S
    meta = open_recording(path).meta
    notes = [n for n in meta.notes if n.startswith("record --max-size: the recording passed its limit of 19.5 KiB "
                                                   "(20,000 bytes)")]
    assert len(notes) == 1, meta.notes
    live = int(re.search(r"\): ([\d,]+) allocations still live", notes[0]).group(1).replace(",", ""))
    assert 0 < live <= SECONDS * LEAK_PER_S  # the leak's, counted where the limit was passed
    assert "a wider window would not shrink it" in notes[0]
    assert "a --max-size of at least 16MiB would hold what it keeps now" in notes[0]
    assert all("live_allocations" in f and "crossing_allocations" in f for f in meta.folds)


WIDE_CHAINS = {k: [("python", f"churn{k}", "train.py", "train.py", k)] for k in range(1, 401)}


def many_chains_churning(second: int, rng: np.random.Generator) -> dict:
    """Each of 400 chains allocates 5 buffers a second, each freed 1 ms later: nothing stays
    live, and the folded part is one group per chain and second."""
    rows: list[tuple] = []
    for k in range(1, 401):
        for i in range(5):
            ts = second * S + i * 190 * MS + k * 1000 + int(rng.integers(0, 100))
            addr = 0x10_0000 + k * 0x1000 + i * 0x100
            rows += [(ts, "alloc", addr, 64 * k, k), (ts + MS, "free", addr, None, None)]
    ts, action, addr, size, stack = zip(*rows)
    return {"ts_ns": np.array(ts, dtype=np.int64), "action": list(action), "addr": np.array(addr, dtype=np.uint64),
            "size_bytes": list(size), "stack_id": list(stack)}


def test_a_folded_part_of_many_groups_widens_the_window_and_keeps_the_limit(tmp_path):
    """Where the folded part is groups of short allocations, twice the window halves it: the
    window widens, the recording ends under its limit, no note says it passed it, and the
    per-chain totals are exact."""
    path, full = tmp_path / "r.memprof", tmp_path / "full.memprof"
    compactor = write(path, 120_000, many_chains_churning, WIDE_CHAINS)
    write(full, None, many_chains_churning, WIDE_CHAINS)
    meta = open_recording(path).meta
    assert compactor.window_ns > 1 * S and meta.folds, (compactor.window_ns, meta.notes)
    assert recording_bytes(path) <= 120_000 < recording_bytes(full)
    assert not [n for n in meta.notes if "passed its limit" in n], meta.notes
    assert report("layers", path)["layers"] == report("layers", full)["layers"]


def test_meta_json_keeps_the_first_fold_and_the_latest(tmp_path):
    """meta.json is rewritten at every flush: of many folds it keeps the first and the
    latest, each numbered, and the notes count them all."""
    from memprof.recording import writer as writer_module
    path = tmp_path / "r.memprof"
    original = writer_module.MAX_FOLDS_KEPT
    writer_module.MAX_FOLDS_KEPT = 4
    try:
        write(path, 20_000)
    finally:
        writer_module.MAX_FOLDS_KEPT = original
    folds = open_recording(path).meta.folds
    numbers = [f["n"] for f in folds]
    assert len(folds) == 4 and numbers[0] == 1 and numbers[1:] == list(range(numbers[-1] - 2, numbers[-1] + 1))
    notes = [n["text"] for n in report("summary", path)["notes"]]
    assert any(f"folded ({numbers[-1]} times," in n for n in notes), notes


def test_record_says_in_its_last_line_whether_the_recording_kept_its_limit(tmp_path):
    from memprof.capture.session import RecordResult
    from memprof.cli.record import _summary
    under = RecordResult(tmp_path / "r.memprof", 0, 1000, 0, 0, False, 3, 10 << 20, 16 << 20)
    over = RecordResult(tmp_path / "r.memprof", 0, 1000, 0, 0, False, 8, 25_237_246, 16 << 20)
    unbounded = RecordResult(tmp_path / "r.memprof", 0, 1000, 0, 0, False, 0, 0, None)
    passed = RecordResult(tmp_path / "r.memprof", 0, 1000, 0, 0, False, 16, 30_853_658, 34 << 20, True)
    assert ("it takes 29.4 MiB after 16 folds, but passed --max-size 34.0 MiB while it ran: its notes say why "
            "and the limit that would hold it") in _summary(passed)
    assert "folded 3 times to stay under --max-size" in _summary(under)
    assert ("it takes 24.1 MiB, over --max-size 16.0 MiB after 8 folds: what it must keep took it, its notes say "
            "what and the limit that would hold it") in _summary(over)
    assert "max-size" not in _summary(unbounded)


def test_a_part_the_command_planted_in_its_recording_is_never_folded(tmp_path):
    """The recorded command runs as the recording's owner and can write into it: a folded part
    or a plain part it puts in events/ (an audit's held 3,000,000 rows in 147 KB, read whole
    by the next fold) is not one the writer put there, and the folds leave it alone."""
    import shutil
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=100, start_ns=0)
    path = tmp_path / "r.memprof"
    writer = RecordingWriter(path, meta, read_back=True)
    writer.append("events", {"ts_ns": [1, 2], "seq": [0, 1], "action": "alloc", "addr": [16, 32], "size_bytes": 8,
                             "stack_id": 1, "layer": "native_heap", "device": "cpu", "pid": 100, "tid": 100})
    writer.flush()
    [own] = events_parts(path / "events", {}, writer.wrote)
    shutil.copy(own.path, path / "events" / "part-000000-f.parquet")  # a folded part, as planted
    shutil.copy(own.path, path / "events" / "part-099999.parquet")
    os.replace(path / "events" / "part-099999.parquet", path / "events" / "part-000001.parquet")
    assert [p.path.name for p in events_parts(path / "events", {})] == \
        ["part-000000.parquet", "part-000000-f.parquet", "part-000001.parquet"]  # all there, by name
    assert [p.path.name for p in events_parts(path / "events", {}, writer.wrote)] == ["part-000000.parquet"]
    os.unlink(own.path)
    shutil.copy(path / "events" / "part-000001.parquet", own.path)  # another file at the writer's name
    assert events_parts(path / "events", {}, writer.wrote) == []


def test_the_writer_keeps_in_mind_only_the_events_parts_a_fold_may_read(tmp_path):
    """A flush writes parts, for hours: the writer keeps the identities (for wrote()) of the
    events parts still on disk under --max-size, whose folds remove the rest, and of none
    without it."""
    compactor = write(tmp_path / "f.memprof", 450_000, second_with_a_large_live_set)
    on_disk = {str(part.path) for part in events_parts(tmp_path / "f.memprof" / "events", {})}
    assert set(compactor.writer._written) == on_disk and len(compactor.writer._written) < SECONDS * 4 / 3
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=100, start_ns=0)
    writer = RecordingWriter(tmp_path / "plain.memprof", meta)
    for n in range(5):
        writer.append("events", {"ts_ns": [n], "seq": [n], "action": "alloc", "addr": [16], "size_bytes": 8,
                                 "stack_id": 1, "layer": "native_heap", "device": "cpu", "pid": 100, "tid": 100})
        writer.flush()
    assert len(events_parts(tmp_path / "plain.memprof" / "events", {})) == 5 and writer._written == {}


def test_a_recording_in_a_folder_named_with_bytes_that_are_not_utf8_is_folded_and_read(tmp_path):
    """Python holds such a name's bytes as lone surrogates, which pyarrow's file system
    refuses: every report of such a recording ended in a traceback, and --max-size's folds
    stopped at their first read (a note said so). The parts are opened by memprof then."""
    from memprof.recording import open_recording
    from memprof.recording.stream import event_parts
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    compactor = write(folder / "r.memprof", 600_000)
    meta = open_recording(folder / "r.memprof").meta
    assert meta.folds and not compactor.stopped and not meta.notes, meta.notes
    parts = event_parts(folder / "r.memprof")
    assert sum(part.rows for part in parts) == len(open_recording(folder / "r.memprof").events) > 0
