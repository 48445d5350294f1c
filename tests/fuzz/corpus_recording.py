"""Tampered recordings, generated from one small good one (tests/export_factories.py): meta.json
with one field replaced by a hostile JSON value or broken as a file, and Parquet parts with
extreme values, wrong types, missing columns, garbage bytes, or paths that are not files.

`recording_corpus(folder)` writes them and returns [(name, recording path, expected)], with
expected "refused" (exit 5 from every command), "readable" (the tampering leaves a recording
that every command must read: exit 0), "no-perfetto" (read, but the Perfetto export exits 5)
or "either" (random bytes overwritten in a part).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from memprof.model.meta import SourceStats
from memprof.recording import RecordingWriter, open_recording
from tests.export_factories import write_recording

INT64_MAX, INT64_MIN, UINT64_MAX = 2**63 - 1, -2**63, 2**64 - 1
PLACEHOLDER = "@@HOSTILE@@"

# JSON text of hostile values; whether each is refused where the schema wants an integer.
JSON_VALUES = {
    "nan": "NaN", "inf": "Infinity", "neg_inf": "-Infinity", "1e30_float": "1e30", "1e30_int": str(10**30),
    "digits_5000": "7" * 5000, "int64_max_plus_1": str(2**63), "int64_min_minus_1": str(-2**63 - 1),
    "neg": "-1", "half": "0.5", "str": '"x"', "list": "[[1]]", "dict": '{"a": {}}', "null": "null", "true": "true",
    "deep_40": "[" * 40 + "]" * 40, "deep_100k": "[" * 100_000 + "]" * 100_000,
}
# Values no field may hold: refused wherever they are (parse, int64 or depth limits).
ALWAYS_REFUSED = {"nan", "inf", "neg_inf", "1e30_int", "digits_5000", "int64_max_plus_1", "int64_min_minus_1",
                  "deep_40", "deep_100k"}
# meta.json fields -> the values the schema lets through there (the rest must be refused).
META_FIELDS = {
    ("format_version",): set(), ("memprof_version",): {"str"}, ("status",): set(), ("command",): {"null"},
    ("command", 0): {"str"}, ("pid",): {"null"}, ("host",): {"str"}, ("clock",): {"str"}, ("start_ns",): {"neg"},
    ("end_ns",): {"neg", "null"}, ("exit_status",): {"neg", "null"}, ("clock_anchors",): set(),
    ("clock_anchors", 0): set(), ("clock_anchors", 0, "realtime_ns"): {"neg"}, ("sources",): {"dict"},
    ("sources", "ebpf"): {"dict"}, ("sources", "ebpf", "lost"): set(), ("sources", "ebpf", "events"): set(),
    ("sources", "ebpf", "missed"): set(), ("sources", "ebpf", "missed", "kfree"): set(),
    ("sources", "ebpf", "stack_sample_every"): set(), ("sources", "ebpf", "enabled"): {"true"},
    ("sources", "ebpf", "detail"): {"dict"}, ("sources", "ebpf", "detail", "stack_failures"): {"null"},
    ("sources", "ebpf", "detail", "uprobes"): {"null", "dict"},
    ("sources", "ebpf", "detail", "python"): {"null", "dict"},
    ("sources", "ebpf", "detail", "nvml"): {"null", "dict"}, ("sources", "ebpf", "detail", "free_form"): {
        "1e30_float", "neg", "half", "str", "list", "dict", "null", "true"},
    ("notes",): set(), ("notes", 0): {"str"}, ("processes",): set(), ("processes", 0): {"dict"},
    ("processes", 0, "pid"): {"null"}, ("processes", 0, "comm"): {"str", "null"},
    ("processes", 0, "exe"): {"str", "null"},
    ("processes", 0, "start_ns"): {"neg", "null"}, ("exits",): set(), ("exits", 0, "ts_ns"): {"neg", "null"},
}


def base_recording(path: Path) -> Path:
    """The good recording every case starts from: export_factories' known events, with an
    eBPF source's stats, a note and an exit in meta.json."""
    write_recording(path)
    meta = json.loads((path / "meta.json").read_text())
    meta["sources"] = {"ebpf": {**SourceStats(events=11, missed={"kfree": 2}).__dict__,
                                "detail": {"stack_failures": 1, "uprobes": {}, "python": {}, "nvml": {},
                                           "free_form": 1}}}
    meta["notes"] = ["a note"]
    meta["exits"] = [{"pid": 100, "ts_ns": 40_000 * 10**6, "reason": "exit_group"}]
    (path / "meta.json").write_text(json.dumps(meta))
    open_recording(path)  # it is good
    return path


def _replaced_meta(meta: dict, where: tuple, value_text: str) -> str:
    copy = json.loads(json.dumps(meta))
    target = copy
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = PLACEHOLDER
    return json.dumps(copy).replace(json.dumps(PLACEHOLDER), value_text, 1)


def meta_cases(base: Path, folder: Path) -> list[tuple[str, Path, str]]:
    meta, cases = json.loads((base / "meta.json").read_text()), []
    for where, allowed in META_FIELDS.items():
        for name, text in JSON_VALUES.items():
            label = ".".join(map(str, where))
            rec = _copy(base, folder / f"meta-{label}-{name}.memprof")
            (rec / "meta.json").write_text(_replaced_meta(meta, where, text))
            cases.append((rec.name, rec, "readable" if name in allowed and name not in ALWAYS_REFUSED else "refused"))
    return cases


def meta_file_cases(base: Path, folder: Path) -> list[tuple[str, Path, str]]:
    """meta.json broken as a file: empty, garbage, not UTF-8, a JSON list, a FIFO, a directory,
    a dangling symlink, 65 MiB (sparse), duplicate keys with a bad last value."""
    def make(name: str, change) -> tuple[str, Path, str]:
        rec = _copy(base, folder / f"metafile-{name}.memprof")
        change(rec / "meta.json")
        return rec.name, rec, "refused"

    def replace_with(kind):
        def change(meta: Path):
            meta.unlink()
            kind(meta)
        return change

    text = (base / "meta.json").read_text()
    return [
        make("empty", lambda m: m.write_bytes(b"")),
        make("garbage", lambda m: m.write_bytes(b"\x00\xff" * 100)),
        make("latin1", lambda m: m.write_bytes(text.replace('"a note"', '"caf\u00e9"').encode("latin-1"))),
        make("list", lambda m: m.write_text("[]")),
        make("truncated", lambda m: m.write_text(text[: len(text) // 2])),
        make("fifo", replace_with(os.mkfifo)),
        make("directory", replace_with(os.mkdir)),
        make("dangling-symlink", replace_with(lambda m: os.symlink("/nonexistent/meta.json", m))),
        make("huge-sparse", lambda m: os.truncate(m, 65 << 20)),
        make("duplicate-keys", lambda m: m.write_text(text[:-1] + ', "start_ns": NaN}')),
        make("no-format-version", lambda m: m.write_text(json.dumps({k: v for k, v in json.loads(text).items()
                                                                       if k != "format_version"}))),
        make("format-version-99", lambda m: m.write_text(text.replace('"format_version": 1', '"format_version": 99'))),
    ]


# --- Parquet parts --------------------------------------------------------------------------

def _events_part(rec: Path) -> Path:
    return rec / "events" / "part-000000.parquet"


def _set_value(rec: Path, column: str, value, row: int = 0, table: str = "events") -> None:
    part = rec / table / "part-000000.parquet"
    data = pq.read_table(part)
    values = data[column].to_pylist()
    values[row] = value
    index = data.column_names.index(column)
    data = data.set_column(index, data.field(column), pa.array(values, type=data.field(column).type))
    pq.write_table(data, part)


def _set_column(rec: Path, column: str, array: pa.Array | None, table: str = "events") -> None:
    part = rec / table / "part-000000.parquet"
    data = pq.read_table(part)
    index = data.column_names.index(column)
    data = data.remove_column(index) if array is None else data.set_column(index, column, array)
    pq.write_table(data, part)


# (table, column, value, expected): one cell replaced by an extreme value of its own type. A
# negative time is read (one bogus row must not make a recording unreadable) but cannot be in a
# Perfetto trace ("no-perfetto": that export exits 5).
EXTREME_CELLS = [
    ("events", "ts_ns", INT64_MAX, "readable"), ("events", "ts_ns", INT64_MIN, "no-perfetto"),
    ("events", "ts_ns", -1, "no-perfetto"), ("events", "addr", UINT64_MAX, "readable"),
    ("events", "size_bytes", INT64_MAX, "readable"), ("events", "size_bytes", INT64_MIN, "readable"),
    ("events", "size_bytes", -1, "readable"), ("events", "requested_bytes", -1, "readable"),
    ("events", "pid", -2**31, "readable"), ("events", "pid", 2**31 - 1, "readable"), ("events", "tid", -1, "readable"),
    ("events", "seq", INT64_MIN, "readable"), ("events", "stack_id", INT64_MAX, "readable"),
    ("events", "stack_id", -1, "readable"), ("events", "alloc_id", INT64_MIN, "readable"),
    ("events", "layer", "no_such_layer", "readable"), ("events", "action", "explode", "readable"),
    ("events", "device", "\x1b]0;pwned\x07", "readable"), ("events", "device", "x" * 100_000, "readable"),
    ("frames", "line", -2**31, "readable"), ("frames", "kind", "martian", "readable"),
    ("frames", "function", "\x1b[2J" * 1000, "readable"), ("samples", "value", float("nan"), "readable"),
    ("samples", "value", float("inf"), "readable"), ("samples", "value", -1e308, "readable"),
    ("samples", "ts_ns", INT64_MIN, "no-perfetto"), ("samples", "metric", "", "readable"),
]


def part_cases(base: Path, folder: Path) -> list[tuple[str, Path, str]]:
    cases = []
    for i, (table, column, value, expected) in enumerate(EXTREME_CELLS):
        rec = _copy(base, folder / f"cell-{i:02d}-{table}-{column}.memprof")
        _set_value(rec, column, value, table=table)
        cases.append((rec.name, rec, expected))

    def make(name: str, change, expected: str = "refused") -> None:
        rec = _copy(base, folder / f"part-{name}.memprof")
        change(rec)
        cases.append((rec.name, rec, expected))

    n = pq.read_table(_events_part(base)).num_rows
    make("ts-as-string", lambda r: _set_column(r, "ts_ns", pa.array(["x"] * n)))
    make("addr-as-float", lambda r: _set_column(r, "addr", pa.array([1.5] * n)))
    make("size-as-float-nan", lambda r: _set_column(r, "size_bytes", pa.array([float("nan")] * n)))
    make("pid-int64-huge", lambda r: _set_column(r, "pid", pa.array([2**40] * n, pa.int64())))
    make("no-ts-column", lambda r: _set_column(r, "ts_ns", None))
    make("no-layer-column", lambda r: _set_column(r, "layer", None), "readable")
    make("ts-nulls", lambda r: _set_column(r, "ts_ns", pa.array([None] * n, pa.int64())))
    make("extra-column", lambda r: pq.write_table(pq.read_table(_events_part(r)).append_column(
        "evil", pa.array([1] * n)), _events_part(r)), "readable")
    make("zero-bytes", lambda r: _events_part(r).write_bytes(b""))
    make("garbage", lambda r: _events_part(r).write_bytes(b"PAR1" + os.urandom(200) + b"PAR1"))
    make("truncated", lambda r: _events_part(r).write_bytes(_events_part(r).read_bytes()[:-100]))
    make("footer-only", lambda r: _events_part(r).write_bytes(_events_part(r).read_bytes()[-200:]))
    make("part-is-directory", lambda r: (_events_part(r).unlink(), _events_part(r).mkdir()))
    make("part-is-fifo", lambda r: (_events_part(r).unlink(), os.mkfifo(_events_part(r))))
    make("part-to-dev-zero", lambda r: (_events_part(r).unlink(), os.symlink("/dev/zero", _events_part(r))))
    make("events-is-file", lambda r: (shutil.rmtree(r / "events"), (r / "events").write_bytes(b"")))
    make("stacks-is-file", lambda r: (shutil.rmtree(r / "stacks"), (r / "stacks").write_bytes(b"x")))
    make("events-is-symlink-loop", lambda r: (shutil.rmtree(r / "events"), os.symlink(r / "events", r / "events")))
    make("frames-part-garbage", lambda r: (r / "frames" / "part-000000.parquet").write_bytes(b"not parquet"))
    make("samples-wrong-schema", lambda r: pq.write_table(pa.table({"ts_ns": ["a"], "metric": [1], "value": ["v"]}),
                                                         r / "samples" / "part-000000.parquet"))
    make("labels-5000", lambda r: _many_labels(r, 5000), "readable")
    return cases


def _many_labels(rec: Path, count: int) -> None:
    """A second events part of `count` step marks, each with its own label."""
    meta = open_recording(rec).meta
    writer = RecordingWriter(rec.parent / (rec.name + ".tmp"), meta)
    writer.append("events", {"ts_ns": list(range(count)), "seq": list(range(10**6, 10**6 + count)),
                             "action": "mark", "addr": 0, "device": "cpu", "pid": 100, "tid": 100,
                             "category": [f"batch {i}" for i in range(count)]})
    writer.finalize()
    shutil.copy(rec.parent / (rec.name + ".tmp") / "events" / "part-000000.parquet",
                rec / "events" / "part-000001.parquet")
    shutil.rmtree(rec.parent / (rec.name + ".tmp"))


def random_part_cases(base: Path, folder: Path, count: int, seed: int = 19) -> list[tuple[str, Path, str]]:
    """Parts with one to eight random bytes overwritten (seeded): read or refused, either way
    never an internal error."""
    rng, cases = random.Random(seed), []
    parts = sorted(p.relative_to(base) for p in base.rglob("part-*.parquet"))
    for i in range(count):
        rec = _copy(base, folder / f"rand-part-{i:03d}.memprof")
        part = rec / rng.choice(parts)
        data = bytearray(part.read_bytes())
        for _ in range(rng.choice([1, 2, 4, 8])):
            data[rng.randrange(len(data))] = rng.randrange(256)
        part.write_bytes(bytes(data))
        cases.append((rec.name, rec, "either"))
    return cases


def _copy(base: Path, to: Path) -> Path:
    shutil.copytree(base, to, symlinks=True)
    return to


def recording_corpus(folder: Path) -> list[tuple[str, Path, str]]:
    """Every tampered recording under `folder`: [(name, path, expected)] (module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = base_recording(folder / "base.memprof")
    return [*meta_cases(base, folder), *meta_file_cases(base, folder), *part_cases(base, folder),
            *random_part_cases(base, folder, 120)]
