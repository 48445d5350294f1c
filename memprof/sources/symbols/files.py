"""The target's files as the recorder reads them: its executables and libraries, by the paths
of its mappings. The target can replace what is at such a path (in a folder it owns) between
the mapping and the read; so a file is read only if it is a regular file, and told from its
replacement by device, inode and mtime.

What is read goes into a recording its owner (the user who ran sudo) reads, so the files
are opened with that owner's filesystem credentials where the session says so
(`read_target_files_with`): a link the target puts at a mapping's path, pointing at a file
only root may read (a library in /root, an execute-only binary), then opens nothing, and
no name from that file reaches the recording. Without it (memprof run as root itself, a
test) they are opened with the calling thread's credentials."""
from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memprof.asuser import UserThread

# The thread that opens the target's files (read_target_files_with); None: the caller opens them.
_opener: "UserThread | None" = None


def read_target_files_with(opener: "UserThread | None") -> None:
    """From now on, open the target's files (open_binary) on `opener`, an asuser.UserThread
    with the recording owner's filesystem credentials: the kernel then checks each path's
    folders and the file's read permission as it would for that user. None: on the calling
    thread, as it is. The session sets it for the length of a recording and puts None back."""
    global _opener
    _opener = opener


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
    target may have put a FIFO (whose open would block the recorder) or a device (whose open
    some drivers act on) there since. The path is resolved once, by an O_PATH open that opens
    nothing; only a regular file found so is then opened, through that descriptor. Both
    opens run on the thread read_target_files_with named, if any (a file the recording's
    owner may not read raises PermissionError). OSError otherwise."""
    opener = _opener
    fd = _open_regular(path) if opener is None else opener.run(_open_regular, path)
    return os.fdopen(fd, "rb")


def _open_regular(path: str) -> int:
    """An O_RDONLY descriptor of the regular file at `path` (open_binary), with this thread's
    credentials for the path's folders and for the file itself."""
    located = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(located).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.open(f"/proc/self/fd/{located}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(located)


class HeldFiles:
    """Files handed to bcc, each resolved once and held by an O_PATH descriptor (which opens
    nothing) for as long as this object lives, and named to bcc by that descriptor's
    /proc/self/fd path. bcc opens the files it probes itself, with a plain blocking open: by
    their own paths, a FIFO or a device put there after a check (the target's folders are
    its user's) would be opened as root, or hang the recorder. Through the descriptor, bcc
    and the kernel's uprobe reach the regular file that was checked, whatever the path
    holds by then. One descriptor per real path, so that bcc's probe names stay distinct."""

    def __init__(self):
        self._fds: dict[str, int] = {}

    def bcc_path(self, path: str) -> str | None:
        """The path to give bcc for the file at `path`: /proc/self/fd/N of a regular file;
        None when `path` leads to anything else, or nowhere."""
        real = os.path.realpath(path)
        if real not in self._fds:
            try:
                located = os.open(real, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return None
            if not stat.S_ISREG(os.fstat(located).st_mode):
                os.close(located)
                return None
            self._fds[real] = located
        return f"/proc/self/fd/{self._fds[real]}"

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# The most of one ELF section the recorder reads into memory. The biggest it meets are
# libtorch_cpu.so's string tables (.strtab 76 MB, .dynstr 5 MB); a section header is the
# file's own say, and a sparse file can claim gigabytes while holding kilobytes, which root
# would read, and hold, whole (an audit's 2 GiB .dynsym took the recorder to 4.8 GB).
MAX_SECTION_BYTES = 256 << 20


def section_bytes(section) -> bytes:
    """A pyelftools section's contents, once its size is checked: within MAX_SECTION_BYTES
    and within its file. ELFError otherwise, as for any malformed file (its symbols are then
    left unread, as they are for one that cannot be parsed)."""
    from elftools.common.exceptions import ELFError
    size, offset = section["sh_size"], section["sh_offset"]
    if section["sh_type"] != "SHT_NOBITS":
        if size > MAX_SECTION_BYTES:
            raise ELFError(f"section {section.name} claims {size} bytes (more than {MAX_SECTION_BYTES} is not read)")
        file_size = os.fstat(section.stream.fileno()).st_size
        if offset + size > file_size:
            raise ELFError(f"section {section.name} runs past the end of its file")
    return section.data()
