"""Hostile agent lines (what a profiled program, or any process of its user, can write into
agent/<pid>.jsonl for the root recorder to read): `agent_lines()` -> {name: bytes of one line,
without its newline}. Each is to be skipped and counted, never raised."""
from __future__ import annotations

import json

GOOD = {"kind": "step", "ts_ns": 1_000, "pid": 7, "tid": 7, "step": 1}
# JSON text of hostile values.
VALUES = {
    "nan": "NaN", "inf": "Infinity", "1e30": "1e30", "int_1e30": str(10**30), "digits_5000": "7" * 5000,
    "neg": "-1", "half": "0.5", "str": '"x"', "list": "[1]", "dict": '{"a": 1}', "null": "null", "true": "true",
    "deep_100k": "[" * 100_000 + "]" * 100_000, "int64_min": str(-2**63), "uint64_max": str(2**64 - 1),
}
RECORDS = {
    "step": GOOD,
    "mark": {"kind": "mark", "ts_ns": 1_000, "pid": 7, "tid": 7, "label": "batch 1"},
    "tensor": {"kind": "tensor", "epoch_ns": 1_700_000_000 * 10**9, "pid": 7, "tid": 7, "addr": 4096, "size": 64,
               "device": "cuda:0", "role": "activation", "op": "aten::empty", "step": 1},
    "cuda_trace": {"kind": "cuda_trace", "device": 0, "pid": 7, "entry": {
        "action": "alloc", "addr": 4096, "size": 64, "stream": 0, "time_us": 1_700_000_000_000_000,
        "frames": [{"filename": "/w/t.py", "line": 1, "name": "f"}]}},
    "info": {"kind": "info", "pid": 7, "torch": "2.4.0"},
    "values": {"kind": "values", "ts_ns": 1_000, "pid": 7, "tid": 7, "values": {"tokens": 512, "batch": 2}},
    "model_state": {"kind": "model_state", "ts_ns": 1_000, "pid": 7, "tid": 7,
                    "tensors": [["parameter", "h.0.mlp.c_fc.weight", 4096, 64, "cpu"]]},
}
# Fields of each record given hostile values (the ones a wrong value of breaks conversion).
FIELDS = {
    "step": ("ts_ns", "pid", "tid", "step"), "mark": ("ts_ns", "label"),
    "tensor": ("epoch_ns", "addr", "size", "device", "role", "op", "step"),
    "cuda_trace": ("device", "pid", "entry"), "info": ("pid",),
    "values": ("ts_ns", "pid", "values"), "model_state": ("ts_ns", "pid", "tid", "tensors"),
}
ENTRY_FIELDS = ("action", "addr", "size", "time_us", "frames")


def _with(record: dict, path: tuple, text: str) -> bytes:
    copy = json.loads(json.dumps(record))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@@V@@"
    return json.dumps(copy).replace('"@@V@@"', text, 1).encode()


def agent_lines() -> dict[str, bytes]:
    lines = {
        "not-json": b"{not json", "truncated": json.dumps(GOOD).encode()[:-3], "binary": b"\x00\xff\xfe" * 50,
        "bad-utf8": b'{"kind": "mark", "ts_ns": 1, "pid": 7, "tid": 7, "label": "\xff"}',
        "list": b"[1, 2]", "number": b"5", "string": b'"step"', "null": b"null", "empty-object": b"{}",
        "unknown-kind": b'{"kind": "explode"}', "kind-list": b'{"kind": ["step"]}', "kind-dict": b'{"kind": {}}',
        "step-no-ts": b'{"kind": "step", "pid": 7, "tid": 7}', "tensor-no-epoch": b'{"kind": "tensor"}',
        "cuda-no-entry": b'{"kind": "cuda_trace", "device": 0, "pid": 7}',
        "huge-line": json.dumps({"kind": "mark", "ts_ns": 1, "pid": 7, "tid": 7, "label": "x" * 2_000_000}).encode(),
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "settings-deep": b'{"kind": "allocator_settings", "settings": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "profile-path-traversal": b'{"kind": "profile", "path": "../../etc/shadow"}',
    }
    for kind, fields in FIELDS.items():
        for field in fields:
            for name, text in VALUES.items():
                lines[f"{kind}-{field}-{name}"] = _with(RECORDS[kind], (field,), text)
    for field in ENTRY_FIELDS:
        for name in ("nan", "inf", "int_1e30", "neg", "str", "list", "dict", "deep_100k"):
            lines[f"cuda_trace-entry.{field}-{name}"] = _with(RECORDS["cuda_trace"], ("entry", field), VALUES[name])
    return lines

