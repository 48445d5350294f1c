"""The on-disk recording: writer → Parquet parts + meta.json → reader, and every way it can be bad."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memprof.errors import BadRecordingError, UsageError
from memprof.model.meta import ClockAnchor, RecordingMeta, SourceStats
from memprof.recording import (
    NOT_FINALIZED_NOTE, RecordingWriter, find_latest_recording, open_recording, read_meta,
)

REPO = Path(__file__).resolve().parents[2]


def meta(**values) -> RecordingMeta:
    return RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], start_ns=1_000, **values)


def events(n: int, start: int = 0, **columns) -> dict:
    """n events with only the required columns set (plus any overrides)."""
    i = np.arange(start, start + n, dtype=np.int64)
    base = dict(
        ts_ns=i * 10, seq=i, layer="native_heap", action=np.where(i % 2 == 0, "alloc", "free"),
        addr=(0x7F00_0000_0000 + i // 2 * 64).astype(np.uint64), device="cpu",
        pid=np.full(n, 4242, np.int32), tid=np.full(n, 4243, np.int32),
    )
    return {**base, **columns}


def write(path: Path, *batches: dict, table: str = "events", finalize: bool = True) -> Path:
    writer = RecordingWriter(path, meta())
    for batch in batches:
        writer.append(table, batch)
        writer.flush()
    if finalize:
        writer.finalize(end_ns=9_000)
    return path


def parts(path: Path, table: str = "events") -> list[str]:
    return sorted(p.name for p in (path / table).iterdir())


# --- round trip ---------------------------------------------------------------------------

def test_events_round_trip_every_column_kind(tmp_path):
    rec_path = write(tmp_path / "r.memprof", {
        "ts_ns": np.array([5, 6, 7], np.int64), "seq": [0, 1, 2],
        "layer": np.array(["cuda_block", "kernel_slab", "cuda_block"]),
        "action": ["alloc", "free", "mark"],
        "addr": np.array([2**63 + 1, 0x10, 0], np.uint64),
        "size_bytes": pa.array([512, None, None], pa.int64()),
        "requested_bytes": np.array([500.0, np.nan, np.nan]),  # NaN means null
        "device": pd.Categorical(["cuda:0", "cpu", "cpu"]),
        "pid": 7, "tid": [7, 8, 7],
        "stack_id": [3, None, None], "alloc_id": pd.array([11, 12, None], dtype="Int64"),
        "step": [None, 2, 2], "category": ["activation", None, "exit"],
    })
    rec = open_recording(rec_path)
    ev = rec.events
    assert rec.complete and rec.meta.end_ns == 9_000 and rec.meta.notes == []
    assert ev["ts_ns"].tolist() == [5, 6, 7] and ev["seq"].tolist() == [0, 1, 2]
    assert ev["layer"].tolist() == ["cuda_block", "kernel_slab", "cuda_block"]
    assert ev["action"].tolist() == ["alloc", "free", "mark"]
    assert ev["addr"].tolist() == [2**63 + 1, 0x10, 0]
    assert ev["size_bytes"].tolist() == [512, pd.NA, pd.NA]
    assert ev["requested_bytes"].tolist() == [500, pd.NA, pd.NA]
    assert ev["device"].tolist() == ["cuda:0", "cpu", "cpu"]
    assert ev["pid"].tolist() == [7, 7, 7] and ev["tid"].tolist() == [7, 8, 7]
    assert ev["stack_id"].tolist() == [3, pd.NA, pd.NA] and ev["alloc_id"].tolist() == [11, 12, pd.NA]
    assert ev["step"].tolist() == [pd.NA, 2, 2]
    assert ev["category"].tolist()[0] == "activation" and pd.isna(ev["category"][1])


def test_event_dtypes_match_the_contract_also_when_empty(tmp_path):
    full = open_recording(write(tmp_path / "a.memprof", events(4))).events
    empty = open_recording(write(tmp_path / "b.memprof")).events
    for ev in (full, empty):
        dtypes = {name: str(dtype) for name, dtype in ev.dtypes.items()}
        assert dtypes == {
            "ts_ns": "int64", "seq": "int64", "layer": "category", "action": "category", "addr": "uint64",
            "size_bytes": "Int64", "requested_bytes": "Int64", "device": "category", "pid": "int32",
            "tid": "int32", "stack_id": "Int64", "alloc_id": "Int64", "step": "Int32", "category": "category", "weight": "float64",
        }
    assert len(empty) == 0
    assert list(full["layer"].cat.categories[:2]) == ["cuda_block", "cuda_segment"]  # every known layer


def test_missing_nullable_columns_are_null(tmp_path):
    ev = open_recording(write(tmp_path / "r.memprof", events(3))).events
    for name in ("size_bytes", "requested_bytes", "stack_id", "alloc_id", "step", "category"):
        assert ev[name].isna().all(), name


def test_several_flushes_make_several_parts_read_back_in_order(tmp_path):
    rec_path = write(
        tmp_path / "r.memprof",
        events(3, layer="kernel_page"),
        events(2, start=3, device="cuda:1"),
        events(4, start=5, layer="torch_cpu"),
    )
    assert parts(rec_path) == [f"part-00000{i}.parquet" for i in range(3)]
    ev = open_recording(rec_path).events
    assert ev["seq"].tolist() == list(range(9))
    # each part has its own dictionary of layers and devices
    assert ev["layer"].tolist() == ["kernel_page"] * 3 + ["native_heap"] * 2 + ["torch_cpu"] * 4
    assert ev["device"].tolist() == ["cpu"] * 3 + ["cuda:1"] * 2 + ["cpu"] * 4


def test_appends_between_flushes_become_one_part(tmp_path):
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    writer.append("events", events(2))
    writer.append("events", events(3, start=2, layer=np.array(["kernel_slab"] * 3)))
    assert writer.buffered_rows == 5
    writer.flush()
    writer.flush()  # nothing buffered: no empty part
    assert writer.buffered_rows == 0
    assert parts(writer.path) == ["part-000000.parquet"]
    assert open_recording(writer.path).events["layer"].tolist() == ["native_heap"] * 2 + ["kernel_slab"] * 3


def test_stacks_frames_samples_and_stack_frames(tmp_path):
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    writer.append("frames", {
        "frame_id": [10, 11, 12], "kind": ["python", "native", "kernel"],
        "function": ["train_step", "malloc", "__kmalloc"], "module": ["train", "libc.so.6", None],
        "file": ["train.py", None, None], "line": [42, None, None],
    })
    writer.append("stacks", {"stack_id": [1, 2, 1, 1], "depth": [2, 0, 0, 1], "frame_id": [10, 11, 12, 11]})
    writer.append("samples", {"ts_ns": [1, 2], "metric": ["rss_bytes", "nvml_used_bytes"],
                              "device": [None, "cuda:0"], "value": [1e6, 2e9]})
    writer.finalize()
    rec = open_recording(writer.path)
    assert [f["function"] for f in rec.stack_frames(1)] == ["__kmalloc", "malloc", "train_step"]
    assert rec.stack_frames(1)[2] == {
        "kind": "python", "function": "train_step", "module": "train", "file": "train.py", "line": 42,
    }
    assert type(rec.stack_frames(1)[2]["line"]) is int
    assert rec.stack_frames(2) == [
        {"kind": "native", "function": "malloc", "module": "libc.so.6", "file": None, "line": None},
    ]
    assert rec.stack_frames(99) == [] and rec.stack_frames(None) == [] and rec.stack_frames(pd.NA) == []
    assert rec.samples["value"].tolist() == [1e6, 2e9] and rec.samples["ts_ns"].dtype == np.int64
    assert list(rec.frames.columns) == ["frame_id", "kind", "function", "module", "file", "line"]


def test_empty_recording_has_every_table_with_its_columns(tmp_path):
    rec = open_recording(write(tmp_path / "r.memprof"))
    assert list(rec.stacks.columns) == ["stack_id", "depth", "frame_id"]
    assert list(rec.samples.columns) == ["ts_ns", "metric", "device", "value"]
    assert len(rec.frames) == 0 and rec.stack_frames(1) == []


# --- meta.json --------------------------------------------------------------------------

def test_meta_is_written_at_creation_flush_and_finalize(tmp_path):
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    assert read_meta(writer.path).status == "recording"
    writer.meta.sources["kmem"] = SourceStats(events=5, lost=2, missed={"kfree": 1})
    writer.meta.clock_anchors.append(ClockAnchor(monotonic_ns=1, realtime_ns=2))
    writer.flush()
    flushed = read_meta(writer.path)
    assert flushed.sources["kmem"].lost == 2 and flushed.clock_anchors == [ClockAnchor(1, 2)]
    writer.finalize(end_ns=77)
    writer.finalize(end_ns=88)  # idempotent
    final = read_meta(writer.path)
    assert (final.status, final.end_ns, final.command) == ("complete", 77, ["python", "train.py"])
    assert sorted(os.listdir(writer.path)) == ["events", "frames", "meta.json", "samples", "stacks"]


def test_append_after_finalize_is_refused(tmp_path):
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    writer.finalize()
    with pytest.raises(ValueError, match="finalized"):
        writer.append("events", events(1))


# --- append errors (caller bugs) ---------------------------------------------------------

@pytest.mark.parametrize("table, columns, match", [
    ("evnts", events(1), "unknown table"),
    ("events", {**events(1), "sizebytes": [1]}, "unknown columns"),
    ("events", {k: v for k, v in events(1).items() if k != "pid"}, "missing required columns"),
    ("events", events(2, size_bytes=[1, 2, 3]), "different lengths"),
    ("events", events(2, ts_ns=[1, None]), "nulls in a required column"),
    ("events", events(1, addr=[-1]), "events.addr"),
    ("events", {k: 1 for k in ("ts_ns", "seq", "addr", "pid", "tid")} | {"layer": "x", "action": "alloc",
                                                                            "device": "cpu"}, "batch length"),
])
def test_append_rejects_bad_batches(tmp_path, table, columns, match):
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    with pytest.raises(ValueError, match=match):
        writer.append(table, columns)


# --- existing output path ---------------------------------------------------------------

def test_an_existing_path_force_would_not_replace_is_not_offered_force(tmp_path):
    """A symlink (or a file, or another's folder) at -o: --force refuses it too, so the
    hint does not offer it (it did before 2026-12-07, and --force then refused)."""
    link = tmp_path / "r.memprof"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError) as err:
        RecordingWriter(link, meta())
    assert err.value.message == f"{link} exists and is a symlink, not a memprof recording: --force would not " \
                                "replace it either"
    assert err.value.hint == "choose another -o path"


def test_existing_path_needs_force(tmp_path):
    old = write(tmp_path / "r.memprof", events(3))
    with pytest.raises(UsageError) as err:
        RecordingWriter(old, meta())
    assert err.value.message == f"{old} exists" and "--force" in err.value.hint
    RecordingWriter(old, meta(), force=True).finalize()
    assert len(open_recording(old).events) == 0


def test_force_never_replaces_a_file_or_a_symlink(tmp_path):
    """--force replaces a recording, and nothing else: a file, or a link (to a file or to
    another recording), stays as it was."""
    plain = tmp_path / "r.memprof"
    plain.write_text("old")
    other = write(tmp_path / "other.memprof", events(3))
    link = tmp_path / "link.memprof"
    link.symlink_to(other)
    for path in (plain, link):
        with pytest.raises(UsageError, match="refusing to replace it"):
            RecordingWriter(path, meta(), force=True)
    assert plain.read_text() == "old" and os.readlink(link) == str(other)
    assert len(open_recording(other).events) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="a recording of another uid needs root to make")
def test_force_never_replaces_someone_elses_recording(tmp_path):
    theirs = write(tmp_path / "r.memprof", events(3))
    os.chown(theirs, 12345, 12345)
    with pytest.raises(UsageError, match="belongs to uid 12345"):
        RecordingWriter(theirs, meta(), force=True)
    assert len(open_recording(theirs).events) == 3


def test_force_refuses_a_directory_that_is_not_a_recording(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    (path / "precious.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a memprof recording"):
        RecordingWriter(path, meta(), force=True)
    assert (path / "precious.txt").read_text() == "keep me"


def test_uncreatable_path_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot create"):
        RecordingWriter(tmp_path / "file" / "r.memprof", meta())


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_writer_on_the_users_thread_makes_every_file_the_users(tmp_path):
    """Under sudo the writer runs on a UserThread: each file is the user's from its first
    byte, with no chown afterwards (docs/SECURITY.md)."""
    import tempfile
    from memprof.asuser import Owner, UserThread
    base = Path(tempfile.mkdtemp())  # pytest's tmp_path lies in a root-only folder
    os.chmod(base, 0o777)
    with UserThread(Owner(12345, 23456, (23456,))) as files:
        writer = files.run(RecordingWriter, base / "r.memprof", meta(), owner_uid=12345)
        writer.append("events", events(2))
        files.run(writer.finalize)
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [writer.path, *writer.path.rglob("*")]}
    assert owners == {(12345, 23456)}
    assert len(open_recording(writer.path).events) == 2
    shutil.rmtree(base)


def test_planted_links_at_temporary_names_are_replaced_not_followed(tmp_path):
    """The profiled program can write in its own recording: a symlink or FIFO it put at a
    temporary name is unlinked, never followed or opened."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    writer = RecordingWriter(tmp_path / "r.memprof", meta())
    (writer.path / ".meta.json.tmp").symlink_to(victim)
    (writer.path / "events" / ".part-000000.parquet.tmp").symlink_to(victim)
    os.mkfifo(writer.path / "stacks" / ".part-000000.parquet.tmp")
    writer.append("events", events(2))
    writer.append("stacks", {"stack_id": [1], "depth": [0], "frame_id": [1]})
    writer.finalize()
    assert victim.read_text() == "keep me"
    assert len(open_recording(writer.path).events) == 2


# --- bad recordings -------------------------------------------------------------------------

def bad(path, named=None) -> BadRecordingError:
    """open_recording(path) fails with one line naming `named` (default: path) and a hint."""
    with pytest.raises(BadRecordingError) as err:
        open_recording(path)
    assert str(named or path) in err.value.message and err.value.hint
    assert "\n" not in err.value.message
    return err.value


def test_missing_path(tmp_path):
    assert "does not exist" in bad(tmp_path / "nope.memprof").message


def test_empty_directory_is_not_a_recording(tmp_path):
    assert "not a memprof recording" in bad(tmp_path).message


def test_plain_text_file_is_not_a_recording(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert "not a memprof recording" in bad(path).message


def test_garbage_meta_json(tmp_path):
    path = write(tmp_path / "r.memprof", events(2))
    (path / "meta.json").write_bytes(b"\x00{not json")
    assert "meta.json is not readable JSON" in bad(path).message


def test_meta_json_without_format_version(tmp_path):
    path = write(tmp_path / "r.memprof")
    (path / "meta.json").write_text(json.dumps({"status": "complete"}))
    assert "no format_version" in bad(path).message


def test_newer_format_version_asks_for_an_upgrade(tmp_path):
    path = write(tmp_path / "r.memprof")
    data = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**data, "format_version": 999}))
    err = bad(path)
    assert "recorded by a newer memprof: format version 999, this memprof reads 1" in err.message
    assert "upgrade" in err.hint


def test_truncated_part_is_named(tmp_path):
    path = write(tmp_path / "r.memprof", events(100), events(100, start=100))
    part = path / "events" / "part-000001.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    err = bad(path, named=part)
    assert "truncated or corrupt Parquet part" in err.message


def test_part_lacking_required_columns(tmp_path):
    path = write(tmp_path / "r.memprof", events(3))
    pq.write_table(pa.table({"ts_ns": [1, 2]}), path / "events" / "part-000001.parquet")
    err = bad(path, named=path / "events" / "part-000001.parquet")
    assert "lacks required columns" in err.message and "'seq'" in err.message


# --- a recorder killed mid-write ---------------------------------------------------------------

KILLED_WRITER = textwrap.dedent("""
    import os, sys
    import numpy as np
    from memprof.model.meta import RecordingMeta
    from memprof.recording import RecordingWriter

    def batch(start, n):
        i = np.arange(start, start + n, dtype=np.int64)
        return dict(ts_ns=i, seq=i, layer="native_heap", action="alloc", addr=i.astype(np.uint64),
                    device="cpu", pid=1, tid=1)

    writer = RecordingWriter(sys.argv[1], RecordingMeta())
    writer.append("events", batch(0, 1000)); writer.flush()
    writer.append("events", batch(1000, 500)); writer.flush()
    writer.append("events", batch(1500, 700))
    os.replace = lambda *args: os.kill(os.getpid(), 9)  # die with the third part written but not renamed
    writer.flush()
""")


def test_recorder_killed_mid_flush_leaves_data_up_to_the_last_flush(tmp_path):
    path = tmp_path / "killed.memprof"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=REPO, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    assert ".part-000002.parquet.tmp" in os.listdir(path / "events")  # killed while a temp part existed
    rec = open_recording(path)
    assert not rec.complete and NOT_FINALIZED_NOTE in rec.meta.notes
    assert rec.events["seq"].tolist() == list(range(1500))


# --- finding the latest recording ----------------------------------------------------------------

def test_find_latest_recording_by_meta_mtime(tmp_path):
    older = write(tmp_path / "a.memprof")
    newer = write(tmp_path / "b.memprof")
    os.utime(older / "meta.json", ns=(2 * 10**18, 2 * 10**18))
    os.utime(newer / "meta.json", ns=(10**18, 10**18))
    (tmp_path / "c.memprof").mkdir()  # no meta.json: not a candidate
    assert find_latest_recording(tmp_path) == older


def test_find_latest_recording_when_there_is_none(tmp_path):
    with pytest.raises(BadRecordingError) as err:
        find_latest_recording(tmp_path)
    assert str(tmp_path) in err.value.message
    assert err.value.hint == "run `sudo memprof record -- CMD` first, or pass a path"


def test_clock_anchors_stay_few_over_hours_and_the_last_is_the_latest():
    """One anchor a flush (4 a second) for 6 hours: meta.json keeps one per
    CLOCK_ANCHOR_SPACING_NS and the latest, and maps a time onto CLOCK_REALTIME as the whole
    series would, here with the realtime clock slewed 50 ppm."""
    from memprof.analysis.job import to_realtime
    from memprof.model.meta import CLOCK_ANCHOR_SPACING_NS
    meta, every = RecordingMeta(), RecordingMeta()
    period_ns, hours = 250_000_000, 6
    for i in range(hours * 3600 * 4 + 1):
        mono = 1_000_000_000 + i * period_ns
        anchor = ClockAnchor(monotonic_ns=mono, realtime_ns=1_700_000_000_000_000_000 + mono + (mono * 50) // 1_000_000)
        meta.note_clock_anchor(anchor)
        every.clock_anchors.append(anchor)
    assert len(meta.clock_anchors) <= hours * 3600 * 1_000_000_000 // CLOCK_ANCHOR_SPACING_NS + 2
    assert meta.clock_anchors[-1] == every.clock_anchors[-1] and meta.clock_anchors[0] == every.clock_anchors[0]
    gaps = np.diff([a.monotonic_ns for a in meta.clock_anchors[:-1]])
    assert gaps.min() >= CLOCK_ANCHOR_SPACING_NS
    times = np.linspace(0, hours * 3600e9, 1001).astype(np.int64) + 1_000_000_000
    assert np.abs(to_realtime(meta, times) - to_realtime(every, times)).max() <= 1
    assert len(json.dumps(meta.to_dict())) < 100_000
