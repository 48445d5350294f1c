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

import pandas as pd

from memprof.errors import MemprofError
from memprof.report.attribution import NO_STACK_FRAME
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


def pprof_profile(totals: pd.DataFrame, chains: dict[int, list[dict]], *, duration_ns: int,
                  time_nanos: int = 0) -> bytes:
    """The gzipped profile. `totals` is series.chain_totals; `chains` the frames of its
    stack ids, innermost first (leaks.chain_frames). `time_nanos` is the recording's start
    in ns since the epoch (0: unknown); `duration_nanos` its length."""
    builder = _Builder(profile_class()())
    profile = builder.profile
    for kind, unit in SAMPLE_TYPES:
        profile.sample_type.add(type=builder.string(kind), unit=builder.string(unit))
    profile.period_type.type, profile.period_type.unit = builder.string("space"), builder.string("bytes")
    profile.period = 1  # every allocation recorded (sampled sources' weights are applied already)
    profile.default_sample_type = builder.string("inuse_space")
    profile.time_nanos, profile.duration_nanos = int(time_nanos), max(int(duration_ns), 0)
    profile.comment.append(builder.string("memprof: layers nest; use -tagfocus layer=NAME, never add layers"))
    for row in totals.itertuples(index=False):
        builder.sample(row, chains)
    profile.string_table.extend(builder.strings)
    return gzip.compress(profile.SerializeToString(), mtime=0)


class _Builder:
    """Interns strings, mappings, functions and locations; ids start at 1 (0 means none)."""

    def __init__(self, profile):
        self.profile = profile
        self.strings: list[str] = [""]
        self._string_ids: dict[str, int] = {"": 0}
        self._mappings: dict[str, int] = {}
        self._functions: dict[tuple, int] = {}
        self._locations: dict[tuple, int] = {}

    def string(self, text: str | None) -> int:
        """The id of `text` in the string table. `go tool pprof -top` prints these names to a
        terminal, so they are stored visible (safe_text.visible: no control character)."""
        text = "" if text is None else visible(text)
        if text not in self._string_ids:
            self._string_ids[text] = len(self.strings)
            self.strings.append(text)
        return self._string_ids[text]

    def sample(self, row, chains: dict[int, list[dict]]) -> None:
        """One sample, leaf first: the chain's frames, then the layer as its root."""
        frames = [] if pd.isna(row.stack_id) else chains.get(int(row.stack_id), [])
        locations = [self.location(frame) for frame in frames] or [self.location({"function": NO_STACK_FRAME})]
        locations.append(self.location({"function": row.layer}))
        sample = self.profile.sample.add(location_id=locations, value=[int(getattr(row, c)) for c in _VALUE_COLUMNS])
        sample.label.add(key=self.string("layer"), str=self.string(row.layer))

    def location(self, frame: dict) -> int:
        module = frame.get("module") if frame.get("kind") != "python" else None  # a Python module is no mapping
        line = frame.get("line")
        key = (self.function(frame), self.mapping(module), line)
        if key not in self._locations:
            self._locations[key] = len(self._locations) + 1
            location = self.profile.location.add(id=self._locations[key], mapping_id=key[1])
            location.line.add(function_id=key[0], line=int(line) if line is not None else 0)
        return self._locations[key]

    def function(self, frame: dict) -> int:
        """By (name, kind, file or library): a Python function and a native one of one name
        stay apart. The name shown is the function's; its kind is the system name's prefix."""
        name, kind = frame.get("function") or "??", frame.get("kind")
        filename = frame.get("file") or frame.get("module")
        key = (name, kind, filename)
        if key not in self._functions:
            self._functions[key] = len(self._functions) + 1
            system = f"[{kind}] {name}" if kind else name
            self.profile.function.add(id=self._functions[key], name=self.string(name),
                                      system_name=self.string(system), filename=self.string(filename))
        return self._functions[key]

    def mapping(self, module: str | None) -> int:
        """One mapping per library (kernel and native frames); 0 for none (Python frames)."""
        if not module:
            return 0
        if module not in self._mappings:
            self._mappings[module] = len(self._mappings) + 1
            self.profile.mapping.add(id=self._mappings[module], filename=self.string(module),
                                     has_functions=True, has_filenames=True)
        return self._mappings[module]
