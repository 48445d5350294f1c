"""The target's files as the root recorder reads them (memprof/sources/symbols/files.py): a
FIFO put where a library was is refused at once, never waited on."""
from __future__ import annotations

import os

import pytest

from memprof.sources.symbols.files import file_identity, open_binary
from memprof.sources.symbols.frameless import FramelessFrames


def test_a_fifo_in_a_librarys_place_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "libc.so.6"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        open_binary(str(fifo))  # a plain open() would block here until a writer came
    assert FramelessFrames().return_address_at_sp(str(fifo), 0x1000) is False


def test_a_regular_file_reads_as_before_and_its_replacement_is_told_apart(tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(b"\x7fELF")
    with open_binary(str(path)) as f:
        assert f.read() == b"\x7fELF"
    first = file_identity(str(path))
    path.unlink()
    path.write_bytes(b"\x7fELF again")
    assert file_identity(str(path)) not in (None, first)
    assert file_identity(str(tmp_path / "gone")) is None
