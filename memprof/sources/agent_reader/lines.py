"""The agent's JSON lines, checked: untrusted input to a root recorder.

The agent runs inside the profiled program, as its user, and any process of that user can
write into the agent folder. So every line is parsed here into plain, typed, bounded values
before anything else sees it: a line that is not one JSON object, a record with a missing or
wrongly typed field (a string for a number, a float for an int, true for a pid), NaN or
Infinity, a number out of its column's range, or nesting or text past the limits below,
raises BadLine, which the reader counts and skips. Nothing here raises anything else.

Each `*_fields` function takes one parsed record (a dict) and returns the values its row
needs; text longer than MAX_TEXT characters is cut (the row is kept).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from memprof.model.schema import ModelStateRole

MAX_TEXT = 1024            # characters of a label, an operator name, a frame's file or function
MAX_FRAMES = 256           # frames of one CUDA history entry's stack (innermost kept)
MAX_DEVICES = 64           # cuda:0 … cuda:63 (the `device` column holds a few dozen names a batch)
MAX_INFO_FIELDS = 32       # fields of one `info` record kept for meta.json
MAX_SETTINGS_CHARS = 16_384
MAX_SETTINGS_DEPTH = 6
MAX_EPOCH_US = 4 * 10**15  # year 2096: in nanoseconds still an int64 after any clock offset
MAX_VALUES = 16            # quantities of one `values` record (memprof.mark's keywords)
MAX_STATE_TENSORS = 1 << 20  # model-state tensors of one record (a large model has a few thousand)
MAX_SPANS = 1 << 20        # module calls of one `modules` record (the agent keeps at most 1 << 18)
MAX_MODULE_PATHS = 1 << 16  # module paths named by one `modules` record
MAX_MODULE_INDEX = 1 << 20  # a module path's number within its process
_INDEX = re.compile(r"[0-9]{1,7}")
# A JSON escape of a UTF-16 surrogate: a pair of them is one character, but json.loads takes
# a lone one too, which is no Unicode text (UTF-8 cannot hold it: the recording's writer refused
# it, and the root recorder stopped there).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_I32 = 2**31
_I64 = 2**63
_U64 = 2**64
_PROFILE_NAME = re.compile(r"[0-9]{1,10}\.profile\.[0-9]{1,10}\.json")
_DEVICE_NAME = re.compile(r"cpu|cuda:([0-9]{1,2})")
_VALUE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
STATE_ROLES = frozenset(role.value for role in ModelStateRole)
_TRACE_TEXT_KEYS = ("action", "category")
_TRACE_INT_KEYS = {"addr": (0, _U64), "size": (0, _I64)}  # with the two above: what torch_trace reads


class BadLine(ValueError):
    """An agent line that is not a record memprof can use: skipped and counted."""


def parse(line: bytes) -> Any:
    """The JSON value of one line, or BadLine (bad JSON or UTF-8, NaN or Infinity, a number
    of more digits than Python converts, nesting past the interpreter's limit, text holding
    a lone surrogate). A record is an object: `kind` says whether this one is."""
    try:
        value = json.loads(line, parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(line):  # rare: only an escape can make one
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadLine(f"not JSON: {type(e).__name__}") from None


def kind(record: Any) -> Any:
    """The `kind` of a record; BadLine when the value is not a JSON object."""
    if not isinstance(record, dict):
        raise BadLine(f"a JSON {type(record).__name__}, not an object")
    return record.get("kind")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number memprof takes")


def integer(record: dict, key: str, lo: int, hi: int, default: Any = BadLine) -> Any:
    """record[key] as an int in [lo, hi); `default` when it is absent or null (BadLine,
    the default default, makes the field required). bool is not an int here."""
    value = record.get(key)
    if value is None:
        if default is BadLine:
            raise BadLine(f"{key} is missing")
        return default
    if type(value) is not int or not lo <= value < hi:
        raise BadLine(f"{key} is {_short(value)}, not an integer in [{lo}, {hi})")
    return value


def text(record: dict, key: str, default: Any = None) -> Any:
    """record[key] as text of at most MAX_TEXT characters; `default` when absent or null."""
    value = record.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadLine(f"{key} is {_short(value)}, not text")
    return value[:MAX_TEXT]


def _short(value: Any) -> str:
    return f"a {type(value).__name__}" if not isinstance(value, (int, float)) or isinstance(value, bool) else "out of range"


def mark_fields(record: dict) -> tuple[int, int, int, str | None, int | None]:
    """(ts_ns, pid, tid, label, step) of a `step` or `mark` record; ts_ns is CLOCK_MONOTONIC ns."""
    return (integer(record, "ts_ns", 0, _I64), integer(record, "pid", 0, _I32, 0), integer(record, "tid", 0, _I32, 0),
            text(record, "label"), integer(record, "step", -_I32, _I32, None))


def step_source(record: dict) -> str | None:
    """What counts the steps of a `step` record's process: optimizer.step, profiler.step,
    mark, forward, or start/attach (step 0, and the step in progress on attach)."""
    source = text(record, "source")
    return source[:32] if source else None


def values_fields(record: dict) -> tuple[int, int, dict[str, float]]:
    """(ts_ns, pid, {name: value}) of a `values` record: names of identifier characters (at
    most 64), finite numbers only, at most MAX_VALUES of them."""
    values = record.get("values")
    if not isinstance(values, dict) or len(values) > MAX_VALUES:
        raise BadLine("values is not an object of a few numbers")
    clean = {}
    for name, value in values.items():
        if not isinstance(name, str) or not _VALUE_NAME.fullmatch(name):
            raise BadLine("a value's name is not an identifier")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or abs(value) >= _I64:
            raise BadLine(f"{name} is {_short(value)}, not a finite number")
        clean[name] = float(value)
    return integer(record, "ts_ns", 0, _I64), integer(record, "pid", 0, _I32, 0), clean


def model_state_fields(record: dict) -> tuple[int, int, int, list[tuple[str, str, int, int, str]]]:
    """(ts_ns, pid, tid, [(role, name, data_ptr, bytes, device)]) of a `model_state` record;
    role a ModelStateRole value, name text (cut at MAX_TEXT), device "cpu" or "cuda:N"."""
    tensors = record.get("tensors")
    if not isinstance(tensors, list) or len(tensors) > MAX_STATE_TENSORS:
        raise BadLine("tensors is not a list")
    rows = []
    for item in tensors:
        if not isinstance(item, list) or len(item) != 5:
            raise BadLine("a tensor is not [role, name, data_ptr, bytes, device]")
        role, name, ptr, size, device = item
        if role not in STATE_ROLES or not isinstance(name, str):
            raise BadLine("a tensor's role or name is not one memprof knows")
        fields = {"ptr": ptr, "size": size}
        rows.append((role, name[:MAX_TEXT], integer(fields, "ptr", 1, _U64), integer(fields, "size", 0, _I64),
                     device_name(device)))
    return (integer(record, "ts_ns", 0, _I64), integer(record, "pid", 0, _I32, 0), integer(record, "tid", 0, _I32, 0),
            rows)


def modules_fields(record: dict) -> tuple[int, int, int, dict[int, str], list[tuple[int, int, int]], int]:
    """(ts_ns, pid, tid, {index: path}, [(index, enter_ns, exit_ns)], dropped) of a `modules`
    record: at most MAX_MODULE_PATHS names (index an int's decimal text, the path text cut at
    MAX_TEXT) and MAX_SPANS spans, each three ints with exit_ns ≥ enter_ns (CLOCK_MONOTONIC
    ns), in the order they began (enter_ns never decreases); `dropped` ≥ 0 (calls the agent
    did not keep)."""
    paths, spans = record.get("paths", {}), record.get("spans")
    if not isinstance(paths, dict) or len(paths) > MAX_MODULE_PATHS:
        raise BadLine("paths is not an object of at most %d names" % MAX_MODULE_PATHS)
    if not isinstance(spans, list) or len(spans) > MAX_SPANS:
        raise BadLine("spans is not a list of at most %d spans" % MAX_SPANS)
    return (integer(record, "ts_ns", 0, _I64), integer(record, "pid", 0, _I32, 0), integer(record, "tid", 0, _I32, 0),
            _module_paths(paths), _spans(spans), integer(record, "dropped", 0, _I64, 0))


def _module_paths(paths: dict) -> dict[int, str]:
    clean = {}
    for key, path in paths.items():
        if not _INDEX.fullmatch(key) or int(key) >= MAX_MODULE_INDEX or not isinstance(path, str):
            raise BadLine("a module path's index or name is not one memprof takes")
        clean[int(key)] = path[:MAX_TEXT]
    return clean


def _spans(spans: list) -> list[tuple[int, int, int]]:
    clean, last_enter = [], 0
    for span in spans:
        if type(span) is not list or len(span) != 3 or not all(type(v) is int for v in span):
            raise BadLine("a span is not [index, enter_ns, exit_ns]")
        index, enter, exit_ = span
        if not (0 <= index < MAX_MODULE_INDEX and last_enter <= enter <= exit_ < _I64):
            raise BadLine("a span's index is out of range, or its times are not in order")
        clean.append((index, enter, exit_))
        last_enter = enter
    return clean


def tensor_fields(record: dict) -> dict:
    """A profiler-window tensor record's fields: epoch_ns (CLOCK_REALTIME ns), pid, tid,
    addr, size (bytes), device ("cpu" or "cuda:N"), role, op, step."""
    return {"epoch_ns": integer(record, "epoch_ns", 0, _I64), "pid": integer(record, "pid", 0, _I32, 0),
            "tid": integer(record, "tid", 0, _I32, 0), "addr": integer(record, "addr", 0, _U64, 0),
            "size": integer(record, "size", 0, _I64, 0), "device": device_name(record.get("device")),
            "role": (text(record, "role") or "unknown")[:64], "op": text(record, "op"),
            "step": integer(record, "step", -_I32, _I32, None)}


def device_name(value: Any) -> str:
    """"cpu" (also for null) or "cuda:N" with N < MAX_DEVICES."""
    if value is None:
        return "cpu"
    match = _DEVICE_NAME.fullmatch(value) if isinstance(value, str) else None
    if match is None or (match.group(1) is not None and int(match.group(1)) >= MAX_DEVICES):
        raise BadLine("device is not cpu or cuda:N")
    return value


def cuda_trace_fields(record: dict) -> tuple[int, int, dict]:
    """(device index, pid, entry) of a `cuda_trace` record. The entry is rebuilt from the
    fields torch_trace reads, each checked: a number where one is wanted, frames as
    {filename, line, name} with text and ints only."""
    entry = record.get("entry")
    if not isinstance(entry, dict):
        raise BadLine("entry is not an object")
    clean: dict[str, Any] = {key: text(entry, key) for key in _TRACE_TEXT_KEYS if entry.get(key) is not None}
    for key, (lo, hi) in _TRACE_INT_KEYS.items():
        if entry.get(key) is not None:
            clean[key] = integer(entry, key, lo, hi)
    time_us = entry.get("time_us")
    if time_us is not None:
        if type(time_us) not in (int, float) or not math.isfinite(time_us) or not 0 <= time_us < MAX_EPOCH_US:
            raise BadLine("time_us is not a number of microseconds")
        clean["time_us"] = time_us
    clean["frames"] = _frames(entry.get("frames"))
    return integer(record, "device", 0, MAX_DEVICES, 0), integer(record, "pid", 0, _I32, 0), clean


def _frames(frames: Any) -> list[dict]:
    if frames is None:
        return []
    if not isinstance(frames, list) or not all(isinstance(f, dict) for f in frames):
        raise BadLine("frames is not a list of objects")
    return [{"filename": text(f, "filename"), "line": integer(f, "line", 0, _I32, None), "name": text(f, "name")}
            for f in frames[:MAX_FRAMES]]


def info_fields(record: dict) -> tuple[int, dict]:
    """(pid, what the agent said of its process): the first MAX_INFO_FIELDS fields whose
    names are short text and whose values are plain (text cut, finite numbers, bools, null)."""
    pid = integer(record, "pid", 0, _I32, 0)
    kept = {}
    for key, value in record.items():
        if key in ("kind", "pid") or not isinstance(key, str) or len(key) > 64:
            continue
        if isinstance(value, str):
            kept[key] = value[:256]
        elif value is None or isinstance(value, bool) or (type(value) is int and -_I64 <= value < _I64):
            kept[key] = value
        elif type(value) is float and math.isfinite(value):
            kept[key] = value
        if len(kept) >= MAX_INFO_FIELDS:
            break
    return pid, kept


def settings_fields(record: dict) -> dict:
    """The allocator settings object, if small and shallow enough to keep in meta.json."""
    settings = record.get("settings")
    if not isinstance(settings, dict) or _depth(settings) > MAX_SETTINGS_DEPTH:
        raise BadLine("settings is not a small object")
    if len(json.dumps(settings, allow_nan=False)) > MAX_SETTINGS_CHARS:  # parse() let no NaN in
        raise BadLine("settings is too large")
    return settings


def _depth(value: Any, limit: int = MAX_SETTINGS_DEPTH + 1) -> int:
    """Nesting depth of lists and dicts, counted no further than `limit`."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(child, limit - 1) for child in children), default=0)


def profile_name(record: dict) -> str:
    """The file name of a profiler window's trace, inside the agent folder: PID.profile.STEP.json."""
    name = record.get("path")
    if not isinstance(name, str) or not _PROFILE_NAME.fullmatch(name):
        raise BadLine("path is not a profile file name of the agent folder")
    return name


def error_fields(record: dict) -> dict:
    """{pid, where, error} of a line of an agent's <pid>.errors.jsonl."""
    kind(record)
    return {"pid": integer(record, "pid", 0, _I32, None), "where": text(record, "where"),
            "error": text(record, "error")}
