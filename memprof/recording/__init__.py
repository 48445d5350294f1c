"""The on-disk recording format (DESIGN.md §2, §3): a `NAME.memprof/` directory of meta.json
and chunked Parquet tables, written while capturing and read back, versioned."""
from memprof.recording.reader import (
    NOT_FINALIZED_NOTE, Recording, find_latest_recording, open_recording, read_meta,
)
from memprof.recording.writer import TABLES, RecordingWriter

__all__ = [
    "NOT_FINALIZED_NOTE", "Recording", "RecordingWriter", "TABLES", "find_latest_recording",
    "open_recording", "read_meta",
]
