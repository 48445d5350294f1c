"""The target's files as the recorder reads them: its executables and libraries, by the paths
of its mappings, as root. The target can replace what is at such a path (in a folder it
owns) between the mapping and the read; so a file is read only if it is a regular file, and
told from its replacement by device, inode and mtime."""
from __future__ import annotations

import os
import stat


def file_identity(path: str) -> tuple | None:
    """What tells a file from its replacement at the same path; None if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def open_binary(path: str):
    """`path` opened for reading in binary, only if it is a regular file: the recorder reads
    the target's executables and libraries as root, by the paths of its mappings, and the
    target may have put a FIFO (whose open would block the recorder) or a device there since.
    OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
