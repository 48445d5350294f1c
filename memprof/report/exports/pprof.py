"""pprof's profile.proto (github.com/google/pprof/proto/profile.proto), gzipped, as `go tool
pprof`, Pyroscope and Grafana read it: one sample per (layer, chain) with the values of Go's
heap profiles — alloc_objects/alloc_space (every allocation of the recording) and
inuse_objects/inuse_space (live at the end) — in count/bytes.

Render only: every number comes from analysis.series.chain_totals. Each sample's outermost
location is its layer and it carries the label layer=NAME, so `pprof -tagfocus layer=…`
keeps one layer (layers nest: their bytes must not be added). Locations, functions and
mappings are deduplicated; the string table starts with "".

No protoc at build time: the message classes are made at run time from a
FileDescriptorProto written below, field for field as profile.proto (fields 1–14 of
Profile; the later experimental ones are left out).
"""
from __future__ import annotations

import functools
import gzip

import numpy as np
import pandas as pd

from memprof.errors import MemprofError
from memprof.report.labels import NO_STACK_FRAME
from memprof.report.safe_text import visible

SAMPLE_TYPES = (("alloc_objects", "count"), ("alloc_space", "bytes"),
                ("inuse_objects", "count"), ("inuse_space", "bytes"))
_VALUE_COLUMNS = ("alloc_count", "alloc_bytes", "inuse_count", "inuse_bytes")  # in SAMPLE_TYPES order

# (message, [(field, number, type, label, message type)]): profile.proto, as published.
_I64, _U64, _BOOL, _STR, _MSG = 3, 4, 8, 9, 11  # FieldDescriptorProto.Type
_ONE, _MANY = 1, 3  # LABEL_OPTIONAL, LABEL_REPEATED
_MESSAGES = {
    "Profile": [("sample_type", 1, _MSG, _MANY, "ValueType"), ("sample", 2, _MSG, _MANY, "Sample"),
                ("mapping", 3, _MSG, _MANY, "Mapping"), ("location", 4, _MSG, _MANY, "Location"),
                ("function", 5, _MSG, _MANY, "Function"), ("string_table", 6, _STR, _MANY, None),
                ("drop_frames", 7, _I64, _ONE, None), ("keep_frames", 8, _I64, _ONE, None),
                ("time_nanos", 9, _I64, _ONE, None), ("duration_nanos", 10, _I64, _ONE, None),
                ("period_type", 11, _MSG, _ONE, "ValueType"), ("period", 12, _I64, _ONE, None),
                ("comment", 13, _I64, _MANY, None), ("default_sample_type", 14, _I64, _ONE, None)],
    "ValueType": [("type", 1, _I64, _ONE, None), ("unit", 2, _I64, _ONE, None)],
    "Sample": [("location_id", 1, _U64, _MANY, None), ("value", 2, _I64, _MANY, None),
               ("label", 3, _MSG, _MANY, "Label")],
    "Label": [("key", 1, _I64, _ONE, None), ("str", 2, _I64, _ONE, None), ("num", 3, _I64, _ONE, None),
              ("num_unit", 4, _I64, _ONE, None)],
    "Mapping": [("id", 1, _U64, _ONE, None), ("memory_start", 2, _U64, _ONE, None),
                ("memory_limit", 3, _U64, _ONE, None), ("file_offset", 4, _U64, _ONE, None),
                ("filename", 5, _I64, _ONE, None), ("build_id", 6, _I64, _ONE, None),
                ("has_functions", 7, _BOOL, _ONE, None), ("has_filenames", 8, _BOOL, _ONE, None),
                ("has_line_numbers", 9, _BOOL, _ONE, None), ("has_inline_frames", 10, _BOOL, _ONE, None)],
    "Location": [("id", 1, _U64, _ONE, None), ("mapping_id", 2, _U64, _ONE, None), ("address", 3, _U64, _ONE, None),
                 ("line", 4, _MSG, _MANY, "Line"), ("is_folded", 5, _BOOL, _ONE, None)],
    "Line": [("function_id", 1, _U64, _ONE, None), ("line", 2, _I64, _ONE, None)],
    "Function": [("id", 1, _U64, _ONE, None), ("name", 2, _I64, _ONE, None), ("system_name", 3, _I64, _ONE, None),
                 ("filename", 4, _I64, _ONE, None), ("start_line", 5, _I64, _ONE, None)],
}
PACKAGE = "perftools.profiles"


@functools.lru_cache(maxsize=1)
def profile_class():
    """The `perftools.profiles.Profile` message class, built in a private descriptor pool (a
    program that also loads pprof's own generated module gets no clash)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise MemprofError("the pprof export needs the `protobuf` Python package",
                           "pip install protobuf (or export --format folded or speedscope)") from None
    proto = descriptor_pb2.FileDescriptorProto(name="memprof/pprof_profile.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            message.field.add(name=field, number=number, type=kind, label=label,
                              type_name=f".{PACKAGE}.{type_name}" if type_name else None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.Profile"))


def pprof_profile(totals: pd.DataFrame, chain_rows: pd.DataFrame, frames: pd.DataFrame, *, duration_ns: int,
                  time_nanos: int = 0) -> bytes:
    """The gzipped profile. `totals` is series.chain_totals; `chain_rows` the frames of its
    stack ids (chains.chain_frame_ids: stack_id, frame_id, innermost first); `frames` the
    recording's frames table. `time_nanos` is the recording's start in ns since the epoch
    (0: unknown); `duration_nanos` its length.

    Built per distinct frame and per sample, never per frame of each chain: a function,
    mapping and location is made once for each distinct frame used, and a sample's
    location ids are a slice of one array."""
    profile = profile_class()()
    strings = _Strings()
    for kind, unit in SAMPLE_TYPES:
        profile.sample_type.add(type=strings(kind), unit=strings(unit))
    profile.period_type.type, profile.period_type.unit = strings("space"), strings("bytes")
    profile.period = 1  # every allocation recorded (sampled sources' weights are applied already)
    profile.default_sample_type = strings("inuse_space")
    profile.time_nanos, profile.duration_nanos = int(time_nanos), max(int(duration_ns), 0)
    profile.comment.append(strings("memprof: layers nest; use -tagfocus layer=NAME, never add layers"))
    chain_ids = chain_rows["stack_id"].to_numpy(dtype=np.int64)
    stackless = ~np.isin(totals["stack_id"].to_numpy(dtype=np.int64, na_value=-1), chain_ids)
    roots = [NO_STACK_FRAME] * bool(stackless.any()) + list(dict.fromkeys(totals["layer"].tolist()))
    used = np.unique(chain_rows["frame_id"].to_numpy(dtype=np.int64))
    location_of = _locations(profile, strings, _frame_table(frames, used, roots))
    chain_locations = location_of[np.searchsorted(used, chain_rows["frame_id"].to_numpy(dtype=np.int64))]
    named = dict(zip(roots, location_of[len(used):].tolist()))
    _samples(profile, strings, totals, chain_ids, chain_locations, named)
    profile.string_table.extend(strings.table)
    # Level 6 (Go's gzip default, as pprof's own writer): level 9 took 4x the time for 1% less.
    return gzip.compress(profile.SerializeToString(), compresslevel=6, mtime=0)


class _Strings:
    """The string table: `strings(text)` is the id of `text`, added when new ("" is 0).
    `go tool pprof -top` prints these names to a terminal, so they are stored visible
    (safe_text.visible: no control character)."""

    def __init__(self):
        self.table: list[str] = [""]
        self._ids: dict[str, int] = {"": 0}

    def __call__(self, text: str | None) -> int:
        text = "" if text is None else visible(text)
        if text not in self._ids:
            self._ids[text] = len(self.table)
            self.table.append(text)
        return self._ids[text]


def _frame_table(frames: pd.DataFrame, frame_ids: np.ndarray, names: list[str]) -> pd.DataFrame:
    """One row per frame of `frame_ids` (unknown ids: all None), then one per name in `names`
    (the "[no stack]" frame and the layers, each a root frame of that name): name ("??" where
    the frame has none), kind, filename (its file, else its library), module (the library of
    a kernel or native frame: its mapping), line (-1: none). None where unknown."""
    known = frames.drop_duplicates("frame_id").set_index("frame_id").reindex(frame_ids)
    table = pd.DataFrame({key: _objects(known[key]) for key in ("kind", "function", "module", "file")})
    table["line"] = known["line"].to_numpy(dtype=np.int64, na_value=-1)
    table = pd.concat([table, pd.DataFrame({"function": names, "line": -1})], ignore_index=True)
    table = table.astype({key: object for key in ("kind", "function", "module", "file")})
    table = table.where(table.notna() & (table != ""), None)
    return pd.DataFrame({
        "name": table["function"].where(table["function"].notna(), "??"), "kind": table["kind"],
        "filename": table["file"].where(table["file"].notna(), table["module"]),
        "module": table["module"].where(table["kind"] != "python", None),  # a Python module is no mapping
        "line": table["line"]})


def _objects(column: pd.Series) -> np.ndarray:
    return column.astype(object).where(column.notna(), None).to_numpy(dtype=object)


def _locations(profile, strings: _Strings, table: pd.DataFrame) -> np.ndarray:
    """Functions by (name, kind, filename), mappings by library and locations by (function,
    mapping, line) added to `profile` once each, ids from 1 in order of first use; the
    location id of each row of `table` (_frame_table)."""
    function = table.groupby(["name", "kind", "filename"], sort=False, dropna=False).ngroup().to_numpy() + 1
    mapping = np.zeros(len(table), dtype=np.int64)
    has_module = table["module"].notna().to_numpy()
    mapping[has_module] = pd.factorize(table["module"][has_module])[0] + 1
    keys = pd.DataFrame({"function": function, "mapping": mapping, "line": table["line"]})
    location = keys.groupby(["function", "mapping", "line"], sort=False).ngroup().to_numpy() + 1
    name, kind, filename, module, line = (table[key].tolist() for key in ("name", "kind", "filename", "module", "line"))
    for row in np.unique(function, return_index=True)[1].tolist():
        profile.function.add(id=int(function[row]), name=strings(name[row]),
                             system_name=strings(f"[{kind[row]}] {name[row]}" if kind[row] else name[row]),
                             filename=strings(filename[row]))
    for row in np.unique(mapping, return_index=True)[1].tolist():
        if mapping[row]:
            profile.mapping.add(id=int(mapping[row]), filename=strings(module[row]), has_functions=True,
                                has_filenames=True)
    for row in np.unique(location, return_index=True)[1].tolist():
        entry = profile.location.add(id=int(location[row]), mapping_id=int(mapping[row]))
        entry.line.add(function_id=int(function[row]), line=max(line[row], 0))
    return location


def _samples(profile, strings: _Strings, totals: pd.DataFrame, chain_ids: np.ndarray,
             chain_locations: np.ndarray, named: dict[str, int]) -> None:
    """One sample per row of `totals`, leaf first: its chain's locations (rows of `chain_ids`,
    grouped by id) or the "[no stack]" location, then its layer's as the root."""
    firsts, starts = np.unique(chain_ids, return_index=True)
    ends = np.r_[starts[1:], len(chain_ids)]
    stack = totals["stack_id"].to_numpy(dtype=np.int64, na_value=-1)
    at = np.minimum(np.searchsorted(firsts, stack), max(len(firsts) - 1, 0))
    found = firsts[at] == stack if len(firsts) else np.zeros(len(stack), dtype=bool)
    values = totals[list(_VALUE_COLUMNS)].to_numpy(dtype=np.int64).tolist()
    key = strings("layer")
    for i, layer in enumerate(totals["layer"].tolist()):
        locations = chain_locations[starts[at[i]]:ends[at[i]]].tolist() if found[i] else [named[NO_STACK_FRAME]]
        locations.append(named[layer])
        sample = profile.sample.add(location_id=locations, value=values[i])
        sample.label.add(key=key, str=strings(layer))
