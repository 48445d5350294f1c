"""One Parquet part of a recording, as the recorder itself reads it back (its row count, for
`record --max-size`), and the error a damaged one gives. Kept apart from reader.py, which
imports pandas: the recorder never does (issue 24)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from memprof.errors import BadRecordingError

# What pyarrow raises for a damaged part: its own errors, I/O, and undecodable names in the footer.
PART_ERRORS = (pa.ArrowException, OSError, UnicodeDecodeError)
_ARROW_OPEN = "Could not open Parquet input source '{}': "  # pyarrow's prefix, the path again


def arrow_source(part: Path):
    """`part` as pyarrow opens it: its path; or, where the path is not UTF-8 text (a folder
    named with other bytes: Python holds them as lone surrogates, which pyarrow's file
    system refuses), the file opened here, closed once pyarrow lets go of it."""
    name = str(part)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return open(part, "rb")
    return name


def row_count(part: Path) -> int:
    """Rows of the part at `part`, from its footer. Raises BadRecordingError when damaged."""
    try:
        return pq.ParquetFile(arrow_source(part)).metadata.num_rows
    except PART_ERRORS as e:
        raise corrupt_part(part, e) from e


def corrupt_part(part: Path, error: Exception) -> BadRecordingError:
    why = first_line(error).replace(_ARROW_OPEN.format(part), "")
    return BadRecordingError(f"{part}: truncated or corrupt Parquet part ({why})",
                             "the recording was damaged after it was written; record again, "
                             "or move this part away to read the rest")


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
