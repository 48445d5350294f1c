"""The target's files as the recorder reads them: its executables and libraries, by the paths
of its mappings. The target can replace what is at such a path (in a folder it owns) between
the mapping and the read; so a file is read only if it is a regular file, and told from its
replacement by device, inode and mtime.

What is read goes into a recording its owner (the user who ran sudo) reads, so the files
are opened with that owner's filesystem credentials where the session says so
(`read_target_files_with`): a link the target puts at a mapping's path, pointing at a file
only root may read (a library in /root, an execute-only binary), then opens nothing, and
no name from that file reaches the recording. Without it (memprof run as root itself, a
test) they are opened with the calling thread's credentials.

A process in a mount namespace of its own (a container, `unshare -m`) names its files by
its own paths; symbolize.reachable prefixes them with /proc/PID/root. Every path so
prefixed is walked *inside* that root (`locate`): the walk that begins at the magic link
would otherwise follow an absolute symbolic link in the process's tree (a container's
libc.so.6 -> /lib/...) into root's namespace, to another file, or to one the target
chose."""
from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from typing import TYPE_CHECKING, NamedTuple

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


# A path under /proc/PID/root: a file as process PID sees it, in its own mount namespace.
_IN_PROCESS_ROOT = re.compile(r"/proc/\d+/root(?=/|$)")

_SYS_OPENAT2 = 437  # the same number on every architecture (added after their tables merged)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_OPENAT2_TRIES = 4  # openat2 fails with EAGAIN when a rename races a ".." of the walk


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def split_process_root(path: str) -> tuple[str, str]:
    """(`/proc/PID/root`, the path inside it) for a path under a process's root; ("", path)
    for any other."""
    inside = _IN_PROCESS_ROOT.match(path)
    if inside is None:
        return "", path
    return inside.group(0), path[inside.end():] or "/"


def locate(path: str) -> int:
    """An O_PATH descriptor (it opens nothing: no device acts, no FIFO blocks) of what
    `path` leads to, with this thread's credentials for its folders. A path under
    /proc/PID/root is resolved as process PID resolves it: absolute links in its tree lead
    to its files, `..` stops at its root, and no magic link (/proc/self/...) is followed
    there. OSError when nothing is there, a folder may not be searched, or the process is
    gone (or the kernel predates openat2, 5.6: then no such path is walked at all)."""
    root, inside = split_process_root(path)
    if not root:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_in_root(root_fd, inside, path)
    finally:
        os.close(root_fd)


def _open_in_root(root_fd: int, inside: str, shown: str) -> int:
    """openat2(root_fd, inside, O_PATH, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS); OSError
    naming `shown` on failure."""
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    for _ in range(_OPENAT2_TRIES):
        fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(root_fd), ctypes.c_char_p(os.fsencode(inside)),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    raise OSError(err, os.strerror(err), shown)


def stat_of(path: str) -> os.stat_result:
    """os.stat of what `path` leads to, resolved as `locate` resolves it. OSError as locate."""
    located = locate(path)
    try:
        return os.fstat(located)
    finally:
        os.close(located)


def is_regular_file(path: str) -> bool:
    """Whether `path` leads to a regular file (resolved as `locate` resolves it)."""
    try:
        return stat.S_ISREG(stat_of(path).st_mode)
    except OSError:
        return False


class FileAt:
    """A file by what tells it from its replacement (device, inode, mtime, size), and the
    path it was found by, which is not part of its equality: a cache keyed on it serves
    every path that names the file (each process of a container names it under its own
    /proc/PID/root) while it is unchanged."""

    __slots__ = ("path", "identity", "stat")

    def __init__(self, path: str, st: os.stat_result):
        self.path = path
        self.identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        # Whole, for what is kept across runs, named as symbol_cache.file_key names it (with
        # the ctime, which the kernel sets on any change and no user can set back).
        self.stat = st

    def __eq__(self, other) -> bool:
        return isinstance(other, FileAt) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


def file_at(path: str) -> FileAt:
    """The file `path` leads to (resolved as `locate` resolves it). OSError as locate."""
    return FileAt(path, stat_of(path))


def file_identity(path: str) -> tuple | None:
    """What tells a file from its replacement at the same path (FileAt.identity); None if it
    cannot be stat'ed."""
    try:
        return file_at(path).identity
    except OSError:
        return None


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
    located = locate(path)
    try:
        if not stat.S_ISREG(os.fstat(located).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.open(f"/proc/self/fd/{located}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(located)


class Held(NamedTuple):
    """A file held for bcc: the path bcc is given, and the file's (device, inode)."""

    bcc_path: str
    identity: tuple[int, int]


class HeldFiles:
    """Files handed to bcc, each resolved once (`locate`) and held by an O_PATH descriptor
    (which opens nothing) for as long as this object lives, and named to bcc by that
    descriptor's /proc/self/fd path. bcc opens the files it probes itself, with a plain
    blocking open: by their own paths, a FIFO or a device put there after a check (the
    target's folders are its user's) would be opened as root, or hang the recorder; and a
    container's library would be looked for at its path in root's namespace, where it is
    another file or none. Through the descriptor, bcc and the kernel's uprobe reach the
    regular file that was checked, whatever the path holds by then. One descriptor per file
    (device, inode), so that bcc's probe names stay distinct and one file is probed once,
    whatever paths and namespaces name it."""

    def __init__(self):
        self._fds: dict[tuple[int, int], int] = {}

    def hold(self, path: str) -> Held | None:
        """The file at `path`, held: None when `path` leads to anything but a regular file,
        or nowhere."""
        try:
            located = locate(path)
        except OSError:
            return None
        st = os.fstat(located)
        identity = (st.st_dev, st.st_ino)
        if not stat.S_ISREG(st.st_mode):
            os.close(located)
            return None
        if identity in self._fds:
            os.close(located)  # held already, by another of its paths
        else:
            self._fds[identity] = located
        return Held(f"/proc/self/fd/{self._fds[identity]}", identity)

    def bcc_path(self, path: str) -> str | None:
        """The path to give bcc for the file at `path` (hold's), or None."""
        held = self.hold(path)
        return None if held is None else held.bcc_path

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
