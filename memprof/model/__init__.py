"""The timeline's schema, enums and recording metadata (DESIGN.md §3). No I/O here."""
from memprof.model.schema import (
    Action, FrameKind, Layer, EVENT_COLUMNS, EVENTS_SCHEMA, FRAMES_SCHEMA, SAMPLES_SCHEMA, STACKS_SCHEMA,
)
from memprof.model.meta import ClockAnchor, RecordingMeta, SourceStats, FORMAT_VERSION

__all__ = [
    "Action", "FrameKind", "Layer", "EVENT_COLUMNS", "EVENTS_SCHEMA", "FRAMES_SCHEMA", "SAMPLES_SCHEMA",
    "STACKS_SCHEMA", "ClockAnchor", "RecordingMeta", "SourceStats", "FORMAT_VERSION",
]
