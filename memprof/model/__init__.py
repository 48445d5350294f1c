"""The timeline's schema, enums and recording metadata (DESIGN.md §3). No I/O here.

The Arrow schemas are looked up in `schema` at their first use (its __getattr__), so that
importing this package imports neither pyarrow nor numpy (memprof/lazy_import.py)."""
from memprof.model import schema as _schema
from memprof.model.schema import Action, FrameKind, Layer, EVENT_COLUMNS
from memprof.model.meta import ClockAnchor, RecordingMeta, SourceStats, FORMAT_VERSION

__all__ = [
    "Action", "FrameKind", "Layer", "EVENT_COLUMNS", "EVENTS_SCHEMA", "FRAMES_SCHEMA", "SAMPLES_SCHEMA",
    "STACKS_SCHEMA", "ClockAnchor", "RecordingMeta", "SourceStats", "FORMAT_VERSION",
]


def __getattr__(name: str):
    if name in _schema.ARROW_SCHEMAS:
        return getattr(_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
