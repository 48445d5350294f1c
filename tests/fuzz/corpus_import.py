"""Hostile files for `memprof import`, generated (nothing is checked in): hand-made pickles
(opcode by opcode), snapshots and Chrome traces with one field replaced by a hostile value,
structural attacks (sharing, nesting, too many devices), gzip bombs and odd paths.

`import_corpus(folder)` writes them and returns [(name, path)]. Every file is small (at most
a few MB): what is measured is what memprof makes of it, not the size of the file.
"""
from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import struct
import zlib
from pathlib import Path

T0 = 1_700_000_000_000_000  # epoch µs
BASE = 0x7F00_0000_0000
MIB = 1 << 20
FRAMES = [{"filename": "/w/train.py", "line": 42, "name": "step"},
          {"filename": "/w/train.py", "line": 9, "name": "main"}]
PLACEHOLDER = "@@HOSTILE@@"


# --- hostile values -------------------------------------------------------------------------

def deep_list_ops(depth: int) -> bytes:
    """Pickle opcodes leaving one list nested `depth` deep (no recursion to build or load)."""
    return b"]" * depth + b"a" * (depth - 1)


def shared_dag_ops(levels: int, memo_base: int) -> bytes:
    """Pickle opcodes leaving a list of 2^levels leaves, each level two references to the one
    below (a billion laughs: a few hundred bytes)."""
    ops = b"]" + b"r" + struct.pack("<I", memo_base) + b"0"
    for level in range(levels):
        get = b"j" + struct.pack("<I", memo_base + level)
        ops += b"(" + get + get + b"l" + b"r" + struct.pack("<I", memo_base + level + 1) + b"0"
    return ops + b"j" + struct.pack("<I", memo_base + levels)


def long4(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


# Values that pickle plainly, by name.
PICKLE_VALUES = {
    "inf": float("inf"), "neg_inf": float("-inf"), "nan": float("nan"), "1e308": 1e308, "1e30_int": 10**30,
    "neg_1e30": -10**30, "minus_one": -1, "2_64": 2**64, "2_63": 2**63, "int64_min": -2**63, "float_half": 0.5,
    "empty_str": "", "long_str": "x" * 100_000, "bytes": b"\xff\xfe\x00", "none": None, "true": True,
    "empty_list": [], "empty_dict": {}, "list_of_list": [[1]], "tuple": (1, 2), "set_frozen": frozenset({1}),
    "str_number": "123", "dict_key_tuple": {(1, 2): 3},
}
# Values given as raw opcodes, spliced where the placeholder string was pickled.
RAW_VALUES = {
    "deep_list_100k": deep_list_ops(100_000),
    "dag_2_60": shared_dag_ops(60, 1000),
    "int_5000_digits": long4(10**5000),
    "int_100k_digits": long4(10**100_000),
}


def pickle_with(obj, raw: bytes | None = None) -> bytes:
    """Protocol-3 pickle of `obj` (BINPUT and LONG_BINPUT memo, as torch < 2 wrote), with the
    placeholder string's opcodes replaced by `raw`."""
    data = pickle.dumps(obj, protocol=3)
    if raw is None:
        return data
    key = PLACEHOLDER.encode()
    marker = b"X" + struct.pack("<I", len(key)) + key
    assert data.count(marker) == 1, "the placeholder must be pickled once"
    return data.replace(marker, raw)


# --- a snapshot and its fields --------------------------------------------------------------

def snapshot() -> dict:
    """A small, valid snapshot: one segment with a held block, a trace of each action, settings, an annotation."""
    entries = [
        {"action": "segment_alloc", "addr": BASE, "size": 2 * MIB, "stream": 0, "time_us": T0, "frames": FRAMES},
        {"action": "alloc", "addr": BASE, "size": MIB, "stream": 0, "time_us": T0 + 1, "frames": FRAMES},
        {"action": "free_requested", "addr": BASE, "size": MIB, "stream": 0, "time_us": T0 + 2, "frames": FRAMES},
        {"action": "free_completed", "addr": BASE, "size": MIB, "stream": 0, "time_us": T0 + 3, "frames": FRAMES},
        {"action": "segment_map", "addr": BASE + 4 * MIB, "size": 2 * MIB, "stream": 0, "time_us": T0 + 4},
        {"action": "segment_unmap", "addr": BASE + 4 * MIB, "size": MIB, "stream": 0, "time_us": T0 + 5},
        {"action": "oom", "size": 8 * MIB, "device_free": 0, "stream": 0, "time_us": T0 + 6},
        {"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": T0 + 7},
    ]
    blocks = [{"address": BASE + MIB, "size": MIB, "requested_size": 1000, "state": "active_allocated",
               "frames": FRAMES}, {"size": MIB, "state": "inactive"}]
    segment = {"device": 0, "address": BASE, "total_size": 2 * MIB, "allocated_size": MIB, "active_size": MIB,
               "stream": 0, "segment_type": "large", "frames": FRAMES, "blocks": blocks}
    return {"segments": [segment], "device_traces": [entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
            "external_annotations": [{"stage": "START", "name": "fwd", "device": 0, "time_us": T0}]}


SNAPSHOT_FIELDS = {
    "entry_time_us": ("device_traces", 0, 1, "time_us"), "entry_addr": ("device_traces", 0, 1, "addr"),
    "entry_size": ("device_traces", 0, 1, "size"), "entry_action": ("device_traces", 0, 1, "action"),
    "entry_frames": ("device_traces", 0, 1, "frames"), "entry_frame": ("device_traces", 0, 1, "frames", 0),
    "entry_frame_name": ("device_traces", 0, 1, "frames", 0, "name"),
    "entry_category": ("device_traces", 0, 1, "category"), "unmap_size": ("device_traces", 0, 5, "size"),
    "segment_device": ("segments", 0, "device"), "segment_address": ("segments", 0, "address"),
    "segment_total": ("segments", 0, "total_size"), "segment_expandable": ("segments", 0, "is_expandable"),
    "block_size": ("segments", 0, "blocks", 0, "size"), "block_state": ("segments", 0, "blocks", 0, "state"),
    "block_address": ("segments", 0, "blocks", 0, "address"), "block_history": ("segments", 0, "blocks", 0, "history"),
    "settings": ("allocator_settings",), "settings_value": ("allocator_settings", "max_split_size"),
    "annotation_time": ("external_annotations", 0, "time_us"), "annotation_name": ("external_annotations", 0, "name"),
    "annotation_stage": ("external_annotations", 0, "stage"),
    "annotation_device": ("external_annotations", 0, "device"),
    "device_traces": ("device_traces",), "trace": ("device_traces", 0), "segments": ("segments",),
}


def replaced(obj, path: tuple, value):
    """A deep copy of `obj` (plain data) with the item at `path` replaced by `value`."""
    copy = pickle.loads(pickle.dumps(obj))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


def snapshot_mutations() -> dict[str, bytes]:
    """One file per (field, hostile value): SNAPSHOT_FIELDS x (PICKLE_VALUES + RAW_VALUES), sampled."""
    files, base = {}, snapshot()
    for field_index, (field, path) in enumerate(SNAPSHOT_FIELDS.items()):
        values = list(PICKLE_VALUES.items()) + list(RAW_VALUES.items())
        # Every field gets the numeric and structural extremes; the rest rotate through the fields.
        raw = list(RAW_VALUES.items())[field_index % 4:][:2]
        chosen = values[:9] + values[14:19] + [values[9 + field_index % 5]] + raw
        for name, value in chosen:
            if name in RAW_VALUES:
                files[f"snap-{field}-{name}.pickle"] = pickle_with(replaced(base, path, PLACEHOLDER), value)
            else:
                files[f"snap-{field}-{name}.pickle"] = pickle_with(replaced(base, path, value))
    return files


def snapshot_structures() -> dict[str, bytes]:
    """Whole-snapshot attacks: sharing, nesting, devices, legacy blocks, frames."""
    base, entry = snapshot(), snapshot()["device_traces"][0][1]
    block = snapshot()["segments"][0]["blocks"][0]
    files = {
        "shared-entries-300k.pickle": pickle.dumps({"segments": [], "device_traces": [[entry] * 300_000]}, 4),
        "shared-traces-100k.pickle": pickle.dumps({"segments": [], "device_traces": [[entry] * 30] * 100_000}, 4),
        "shared-blocks-200k.pickle": pickle.dumps({"segments": [{**base["segments"][0], "blocks": [block] * 200_000}]}),
        "shared-frames-1m.pickle": pickle.dumps({"device_traces": [[{**entry, "frames": FRAMES * 500_000}]]}, 4),
        "frames-1m-distinct-lists.pickle": pickle.dumps(
            {"device_traces": [[{**entry, "frames": [FRAMES[0]] * 20_000} for _ in range(50)]]}, 4),
        "devices-200-traces.pickle": pickle.dumps({"segments": [], "device_traces": [[entry]] * 200}, 4),
        "devices-200-annotations.pickle": pickle.dumps(
            {"segments": [], "external_annotations": [{"name": "a", "device": d, "time_us": T0} for d in range(200)]}),
        "devices-200-segments.pickle": pickle.dumps({"segments": [
            {**base["segments"][0], "device": d, "blocks": []} for d in range(200)]}),
        "labels-5000.pickle": pickle.dumps({"device_traces": [[{**entry, "category": f"c{i}"} for i in range(5000)]]}),
        "annotations-5000-names.pickle": pickle.dumps({"segments": [], "external_annotations": [
            {"name": f"a{i}", "device": 0, "time_us": T0 + i} for i in range(5000)]}),
        "actions-5000-names.pickle": pickle.dumps(
            {"device_traces": [[{**entry, "action": f"x{i}"} for i in range(5000)]]}),
        "segment-past-2_64.pickle": pickle.dumps({"segments": [
            {**base["segments"][0], "address": 2**64 - MIB, "total_size": 2 * MIB, "blocks": []}]}),
        "blocks-past-2_64.pickle": pickle.dumps({"segments": [
            {**base["segments"][0], "address": 2**64 - MIB, "total_size": MIB,
             "blocks": [{"size": MIB}, {"size": 2**62}]}]}),
        "legacy-history-hostile.pickle": pickle.dumps({"segments": [{**base["segments"][0], "blocks": [
            {"size": MIB, "state": "active_allocated", "history": [{"addr": 2**70, "real_size": -5}]}]}]}),
        "top-list-of-garbage.pickle": pickle.dumps([{"blocks": 1}] * 10),
        "top-deep-list.pickle": b"\x80\x02" + deep_list_ops(200_000) + b".",
        "top-dag.pickle": b"\x80\x02" + shared_dag_ops(62, 0) + b".",
        "settings-deep-dict.pickle": pickle_with(replaced(base, ("allocator_settings",), PLACEHOLDER),
                                                 deep_dict_ops(50_000)),
        "settings-dag.pickle": pickle_with(replaced(base, ("allocator_settings",), PLACEHOLDER),
                                           shared_dag_ops(60, 1000)),
    }
    return files


def deep_dict_ops(depth: int) -> bytes:
    """Opcodes leaving {"k": {"k": … {} …}} nested `depth` deep."""
    return (b"}\x8c\x01k") * depth + b"}" + b"s" * depth


# --- hand-made pickles ----------------------------------------------------------------------

def handmade_pickles() -> dict[str, bytes]:
    p2, stop = b"\x80\x02", b"."
    files = {
        "memo-long-binput-2_26.pickle": p2 + b"N" + b"r" + struct.pack("<I", 2**26) + stop,
        "memo-long-binput-2_31.pickle": p2 + b"N" + b"r" + struct.pack("<I", 2**31 - 1) + stop,
        "memo-put-text-2_26.pickle": p2 + b"Np67108864\n" + stop,
        "memo-put-underscores.pickle": p2 + b"Np6_7108_864\n" + stop,
        "memo-put-negative.pickle": p2 + b"Np-5\n" + stop,
        "memo-put-60-digits.pickle": p2 + b"Np" + b"9" * 60 + b"\n" + stop,
        "memo-get-missing.pickle": p2 + b"j" + struct.pack("<I", 2**26) + stop,
        "memo-binput-255.pickle": p2 + b"Nq\xff" + stop,
        "long-text-10k-digits.pickle": b"L" + b"7" * 10_000 + b"L\n" + stop,
        "int-text-10k-digits.pickle": b"I" + b"7" * 10_000 + b"\n" + stop,
        "long4-negative-length.pickle": p2 + b"\x8b" + struct.pack("<i", -8) + stop,
        "long4-2gb-length.pickle": p2 + b"\x8b" + struct.pack("<i", 2**31 - 1) + b"\x01" * 16,
        "binunicode-4gb-length.pickle": p2 + b"X" + struct.pack("<I", 2**32 - 1) + b"ab",
        "binunicode-bad-utf8.pickle": p2 + b"X" + struct.pack("<I", 2) + b"\xff\xfe" + stop,
        "binbytes8-huge.pickle": b"\x80\x04\x8e" + struct.pack("<Q", 2**63) + b"x" + stop,
        "bytearray8-huge.pickle": b"\x80\x05\x96" + struct.pack("<Q", 2**40) + b"x" + stop,
        "frame-huge.pickle": b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"N" + stop,
        "binstring-negative.pickle": b"T" + struct.pack("<i", -1) + stop,
        "float-text-nan.pickle": b"Fnan\n" + stop,
        "float-text-inf.pickle": b"F1e999\n" + stop,
        "unhashable-dict-key.pickle": p2 + b"}]N" + b"s" + stop,
        "unhashable-set-item.pickle": b"\x80\x04\x8f(]\x90" + stop,
        "frozenset-unhashable.pickle": b"\x80\x04(]\x91" + stop,
        "setitems-odd.pickle": p2 + b"}(N" + b"u" + stop,
        "append-to-int.pickle": p2 + b"K\x01N" + b"a" + stop,
        "appends-to-dict.pickle": p2 + b"}(N" + b"e" + stop,
        "setitem-on-list.pickle": p2 + b"]NN" + b"s" + stop,
        "build-on-dict.pickle": p2 + b"}}" + b"b" + stop,
        "reduce-on-list.pickle": p2 + b"])" + b"R" + stop,
        "newobj-on-list.pickle": p2 + b"]))" + b"\x81" + stop,
        "newobj-ex.pickle": b"\x80\x04])}\x92" + stop,
        "obj-no-class.pickle": p2 + b"(o" + stop,
        "global-os-system.pickle": p2 + b"cos\nsystem\n" + stop,
        "stack-global.pickle": b"\x80\x04\x8c\x02os\x8c\x06system\x93" + stop,
        "inst-posix.pickle": b"(iposix\nsystem\n" + stop,
        "ext1.pickle": p2 + b"\x82\x01" + stop,
        "ext2.pickle": p2 + b"\x83\x01\x00" + stop,
        "ext4.pickle": p2 + b"\x84\x01\x00\x00\x00" + stop,
        "persid.pickle": b"Pfoo\n" + stop,
        "binpersid.pickle": p2 + b"N" + b"Q" + stop,
        "pop-empty.pickle": p2 + b"0" + stop,
        "pop-mark-empty.pickle": p2 + b"1" + stop,
        "dup-empty.pickle": p2 + b"2" + stop,
        "stop-empty.pickle": p2 + stop,
        "no-stop.pickle": p2 + b"N",
        "unknown-opcode.pickle": p2 + b"\xff" + stop,
        "proto-99.pickle": b"\x80\x63N" + stop,
        "two-stops.pickle": p2 + b"N.N.",
        "next-buffer.pickle": b"\x80\x05\x97" + stop,
        "readonly-buffer.pickle": b"\x80\x05\x98" + stop,
        "deep-marks.pickle": p2 + b"(" * 100_000 + stop,
        "deep-tuple.pickle": p2 + b")" + b"\x85" * 200_000 + stop,
        "deep-dict.pickle": p2 + deep_dict_ops(100_000) + stop,
        "many-empty-lists.pickle": p2 + b"(" + b"]" * 1_000_000 + b"l" + stop,
        "dag-62.pickle": p2 + shared_dag_ops(62, 0) + stop,
    }
    return files


# --- Chrome traces --------------------------------------------------------------------------

def chrome_trace() -> dict:
    span = {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 10.0, "dur": 100.0}
    pyspan = {"ph": "X", "cat": "python_function", "name": "/w/train.py(42): step", "pid": 1, "tid": 1,
              "ts": 5.0, "dur": 200.0}
    alloc = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20.0,
             "args": {"Addr": BASE, "Bytes": 4096, "Device Type": 1, "Device Id": 0}}
    free = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 30.0,
            "args": {"Addr": BASE, "Bytes": -4096, "Device Type": 1, "Device Id": 0}}
    oom = {"ph": "i", "name": "[OutOfMemory]", "pid": 1, "tid": 1, "ts": 40.0,
           "args": {"Bytes": 1 << 40, "Device Type": 1, "Device Id": 0}}
    return {"traceEvents": [pyspan, span, alloc, free, oom], "baseTimeNanoseconds": 1_700_000_000_000_000_000}


TRACE_FIELDS = {
    "ts": ("traceEvents", 2, "ts"), "bytes": ("traceEvents", 2, "args", "Bytes"),
    "addr": ("traceEvents", 2, "args", "Addr"), "device_type": ("traceEvents", 2, "args", "Device Type"),
    "device_id": ("traceEvents", 2, "args", "Device Id"), "pid": ("traceEvents", 2, "pid"),
    "tid": ("traceEvents", 2, "tid"), "args": ("traceEvents", 2, "args"), "name": ("traceEvents", 1, "name"),
    "cat": ("traceEvents", 1, "cat"), "span_ts": ("traceEvents", 1, "ts"), "span_dur": ("traceEvents", 1, "dur"),
    "oom_bytes": ("traceEvents", 4, "args", "Bytes"), "base": ("baseTimeNanoseconds",),
    "events": ("traceEvents",), "event": ("traceEvents", 2),
}
# JSON text of hostile values (Python's json reads NaN and Infinity).
JSON_VALUES = {
    "inf": "Infinity", "neg_inf": "-Infinity", "nan": "NaN", "1e308": "1e308", "1e309": "1e309",
    "1e30_int": str(10**30), "2_64": str(2**64), "int64_min": str(-2**63), "digits_5000": "7" * 5000,
    "neg": "-1", "half": "0.5", "str": '"x"', "list": "[[1]]", "dict": '{"a": {}}', "null": "null", "true": "true",
    "deep_100k": "[" * 100_000 + "]" * 100_000, "deep_900": "[" * 900 + "]" * 900,
}


def trace_mutations() -> dict[str, bytes]:
    files, base = {}, chrome_trace()
    for field, path in TRACE_FIELDS.items():
        text = json.dumps(replaced(base, path, PLACEHOLDER))
        for name, value in JSON_VALUES.items():
            files[f"trace-{field}-{name}.json"] = text.replace(json.dumps(PLACEHOLDER), value, 1).encode()
    return files


def trace_structures() -> dict[str, bytes]:
    base = chrome_trace()
    alloc = base["traceEvents"][2]
    nested = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": float(i), "dur": 1e6 - i}
              for i in range(10_000)]
    events = [{**alloc, "ts": 20_000.0 + i, "args": {**alloc["args"], "Addr": BASE + 4096 * i}} for i in range(10_000)]
    return {
        "trace-nested-10k-spans-10k-events.json": json.dumps({"traceEvents": nested + events}).encode(),
        "trace-devices-200.json": json.dumps({"traceEvents": [
            {**alloc, "args": {**alloc["args"], "Device Id": d}} for d in range(200)]}).encode(),
        "trace-device-types-5000.json": json.dumps({"traceEvents": [
            {**alloc, "args": {**alloc["args"], "Device Type": 100 + d}} for d in range(5000)]}).encode(),
        "trace-not-json.json": b"{not json",
        "trace-bad-utf8.json": b'{"traceEvents": ["\xff\xfe"]}',
        "trace-utf16.json": json.dumps(base).encode("utf-16"),
        "trace-list-top.json": b"{}" + b"[]",
        "trace-empty-object.json": b"{}",
        "trace-events-null.json": b'{"traceEvents": null}',
        "trace-deep-object.json": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "trace-digits-100k.json": b'{"traceEvents": [], "baseTimeNanoseconds": ' + b"9" * 100_000 + b"}",
        "trace-float-digits-1m.json": b'{"traceEvents": [], "x": 0.' + b"1" * 1_000_000 + b"}",
        "trace-duplicate-keys.json": b'{"traceEvents": [], "traceEvents": 5}',
    }


# --- gzip -----------------------------------------------------------------------------------

def gzip_files(good: bytes, hostile: bytes) -> dict[str, bytes]:
    """Bombs (about 1 MB that would be 1 GB), nested, truncated and trailing-garbage gzip."""
    zeros16 = gzip.compress(b"\0" * (16 * MIB), 9, mtime=0)
    return {
        "bomb-256mb-one-member.pickle.gz": _single_member_bomb(256 * MIB),
        "bomb-1gb-64-members.pickle.gz": zeros16 * 64,
        "bomb-json.json.gz": gzip.compress(b"{" + b" " * (256 * MIB), 9, mtime=0),
        "nested-gzip.pickle.gz": gzip.compress(gzip.compress(b"\0" * (64 * MIB), 9, mtime=0), 9, mtime=0),
        "truncated.pickle.gz": gzip.compress(good, mtime=0)[:-20],
        "trailing-garbage.pickle.gz": gzip.compress(good, mtime=0) + b"garbage",
        "bad-crc.pickle.gz": _bad_crc(gzip.compress(good, mtime=0)),
        "magic-only.pickle.gz": b"\x1f\x8b",
        "hostile-inside.pickle.gz": gzip.compress(hostile, mtime=0),
    }


def _single_member_bomb(size: int) -> bytes:
    stream = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk, parts = b"\0" * (16 * MIB), []
    for _ in range(size // len(chunk)):
        parts.append(stream.compress(chunk))
    parts.append(stream.flush())
    return b"".join(parts)


def _bad_crc(data: bytes) -> bytes:
    return data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]


# --- random mutations of real fixtures (seeded) ----------------------------------------------

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = ("handbuilt_snapshot_leak.pickle", "handbuilt_snapshot_legacy_history.pickle",
            "handbuilt_snapshot_expandable.pickle", "handbuilt_snapshot_oom.pickle",
            "handbuilt_profiler_trace_cuda.json")


def byte_mutations(count: int, seed: int = 19) -> dict[str, bytes]:
    """Fixtures with bytes overwritten, cut out, inserted or repeated (some then gzipped)."""
    rng, files = random.Random(seed), {}
    sources = {name: (DATA / name).read_bytes() for name in FIXTURES}
    for i in range(count):
        name = rng.choice(FIXTURES)
        data = bytearray(sources[name])
        for _ in range(rng.choice([1, 2, 4, 16])):
            at, what = rng.randrange(len(data)), rng.random()
            if what < 0.5:
                data[at] = rng.randrange(256)
            elif what < 0.7:
                del data[at:at + rng.randrange(1, 64)]
            elif what < 0.9:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            else:
                data[at:at] = data[rng.randrange(len(data)):][:rng.randrange(1, 256)]
        blob = gzip.compress(bytes(data), mtime=0) if rng.random() < 0.1 else bytes(data)
        files[f"rand-bytes-{i:03d}-{name}"] = blob
    return files


def tree_mutations(count: int, seed: int = 19) -> dict[str, bytes]:
    """Fixtures loaded, one to three of their values (anywhere in the tree) replaced by hostile
    values, written again (pickle protocol 2, 3 or 4; JSON)."""
    from memprof.sources.torch_import.safe_pickle import load_plain
    rng, files = random.Random(seed), {}
    trees = {name: (json.loads((DATA / name).read_text()) if name.endswith(".json") else load_plain(DATA / name))
             for name in FIXTURES}
    json_values = [v for k, v in JSON_VALUES.items() if k != "deep_100k"]
    for i in range(count):
        name = rng.choice(FIXTURES)
        is_json = name.endswith(".json")
        tree = pickle.loads(pickle.dumps(trees[name]))
        paths = [p for p in _paths(tree) if p]
        for _ in range(rng.choice([1, 1, 2, 3])):
            path = rng.choice(paths)
            try:
                _put(tree, path, PLACEHOLDER if is_json else rng.choice(list(PICKLE_VALUES.values())))
            except (KeyError, IndexError, TypeError):
                pass  # a path an earlier replacement removed
        if is_json:
            text = json.dumps(tree)
            while json.dumps(PLACEHOLDER) in text:
                text = text.replace(json.dumps(PLACEHOLDER), rng.choice(json_values), 1)
            files[f"rand-tree-{i:03d}-{name}"] = text.encode()
        else:
            files[f"rand-tree-{i:03d}-{name}"] = pickle.dumps(tree, protocol=rng.choice([2, 3, 4]))
    return files


def _paths(tree, prefix: tuple = ()):
    yield prefix
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,))


def _put(tree, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


# --- everything -----------------------------------------------------------------------------

def import_corpus(folder: Path) -> list[tuple[str, list[str]]]:
    """Write every hostile import file under `folder`; [(name, import arguments)]. Odd paths
    (a FIFO, /dev/zero, a directory, a symlink loop) are included as arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    good = pickle.dumps(snapshot())
    files = {**handmade_pickles(), **snapshot_mutations(), **snapshot_structures(), **trace_mutations(),
             **trace_structures(), **gzip_files(good, handmade_pickles()["global-os-system.pickle"]),
             **byte_mutations(150), **tree_mutations(150)}
    cases = []
    for name, data in sorted(files.items()):
        (folder / name).write_bytes(data)
        cases.append((name, [str(folder / name)]))
    fifo = folder / "fifo.pickle"
    os.mkfifo(fifo)
    loop = folder / "loop.pickle"
    os.symlink(loop, loop)
    cases += [("fifo", [str(fifo)]), ("dev-zero", ["/dev/zero"]), ("directory", [str(folder)]),
              ("symlink-loop", [str(loop)]), ("missing", [str(folder / "missing.pickle")]),
              ("good-then-hostile", [str(folder / "snap-entry_size-inf.pickle"), str(folder / "dag-62.pickle")])]
    return cases


# --- what memprof must make of each ---------------------------------------------------------

# Fields converted leniently by design, whatever they hold: names, labels and frames become
# text, an unknown action or block state is counted or ignored, settings are kept as bounded
# text, a trace's pid and tid may be names, and spans or events that cannot be read are skipped.
LENIENT_FIELDS = {
    "snap": {"annotation_name", "annotation_stage", "block_history", "block_state", "entry_action", "entry_category",
             "entry_frame", "entry_frame_name", "entry_frames", "segment_expandable", "settings", "settings_value"},
    "trace": {"cat", "device_type", "event", "name", "pid", "tid", "span_dur", "span_ts"},
}
# Values a strict field may still hold (None for an optional field, 2^63 for an address, …).
VALID_VALUES = {
    "snap-entry_time_us": {"none"}, "snap-annotation_time": {"none"}, "snap-block_address": {"2_63"},
    "snap-entry_addr": {"2_63"}, "snap-segment_address": {"2_63"}, "snap-device_traces": {"empty_list", "none"},
    "snap-segments": {"empty_list", "none"}, "snap-trace": {"empty_list"}, "trace-bytes": {"neg"},
    "trace-oom_bytes": {"neg"}, "trace-ts": {"half", "neg"}, "trace-events": {"list", "deep_900"},
}
# JSON that Python's json cannot read at all, wherever it is.
UNREADABLE_JSON = {"deep_100k", "digits_5000"}
# Whole files that are large or odd but honest: imported, within the limits.
LENIENT_FILES = {
    "actions-5000-names.pickle", "annotations-5000-names.pickle", "frames-1m-distinct-lists.pickle",
    "labels-5000.pickle", "settings-dag.pickle", "settings-deep-dict.pickle", "shared-frames-1m.pickle",
    "trace-nested-10k-spans-10k-events.json", "trace-device-types-5000.json", "trace-float-digits-1m.json",
}


def expected(name: str) -> str:
    """"imported" (exit 0, a complete recording), "refused" (exit 5 or 2, nothing written), or
    "either" (a random mutation: one or the other)."""
    if name.startswith("rand-"):
        return "either"
    if name in LENIENT_FILES:
        return "imported"
    for prefix in ("snap", "trace"):
        for field in LENIENT_FIELDS[prefix]:
            if name.startswith(f"{prefix}-{field}-"):
                value = name[len(prefix) + len(field) + 2:].rsplit(".", 1)[0]
                return "refused" if value in UNREADABLE_JSON else "imported"
    for key, values in VALID_VALUES.items():
        if name.startswith(key + "-") and name[len(key) + 1:].rsplit(".", 1)[0] in values:
            return "imported"
    return "refused"
