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


def test_a_fifo_found_where_a_library_was_is_never_opened(tmp_path):
    """Not even for a moment: a writer waiting on the FIFO stays waiting (a read open, even
    a non-blocking one, would let it through; a device's open is where a driver acts)."""
    import threading
    fifo = tmp_path / "libc10.so"
    os.mkfifo(fifo)
    link = tmp_path / "libc10.so.link"
    link.symlink_to(fifo)
    writer_through = threading.Event()

    def writer():
        with open(fifo, "wb"):  # blocks until someone opens the FIFO for reading
            writer_through.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    _wait_until_in_openat(thread)
    for path in (fifo, link):
        with pytest.raises(OSError, match="not a regular file"):
            open_binary(str(path))
    assert not writer_through.wait(0.3), "the FIFO was opened for reading"
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the writer go
    thread.join(5)


def _wait_until_in_openat(thread) -> None:
    """Until `thread` waits in openat (x86-64 system call 257), so that an open of the
    FIFO for reading would let it through."""
    import time
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/self/task/{thread.native_id}/syscall") as f:
            if f.read().split()[0] == "257":
                return
        time.sleep(0.01)
    pytest.fail("the writer never reached its open")


def test_only_a_regular_file_is_handed_to_bcc_and_by_a_path_that_cannot_be_swapped(tmp_path):
    """bcc opens what it probes with a plain blocking open: it is given /proc/self/fd/N of a
    regular file held since the check, which a FIFO put at the path afterwards cannot
    replace."""
    from memprof.sources.symbols.files import HeldFiles
    regular = tmp_path / "lib.so"
    regular.write_bytes(b"\x7fELF")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "to-fifo").symlink_to(fifo)
    (tmp_path / "to-lib").symlink_to(regular)
    held = HeldFiles()
    assert [held.bcc_path(str(tmp_path / name)) is None for name in ("lib.so", "to-lib", "fifo", "to-fifo", "gone")] \
        == [False, False, True, True, True]
    assert held.bcc_path("/dev/null") is None and held.bcc_path(str(tmp_path)) is None
    path = held.bcc_path(str(regular))
    assert path == held.bcc_path(str(tmp_path / "to-lib"))  # one descriptor per real path
    regular.unlink()
    os.mkfifo(regular)  # swapped after the check
    with open(path, "rb") as f:  # what bcc opens: the file checked, not the FIFO (no blocking)
        assert f.read() == b"\x7fELF"
    held.close()


def test_a_library_replaced_by_a_fifo_is_noted_not_probed(tmp_path):
    """bcc opens the library it probes with a plain blocking open: a FIFO put at a mapped
    library's path would hang the root recorder there (an audit held it 11 minutes). It is
    skipped, said in meta.json, and reported."""
    from memprof.model import SourceStats
    from memprof.sources.ebpf.library_probes import ON_MAPPING, LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions

    fifo = tmp_path / "libc10.so"
    os.mkfifo(fifo)
    stats, bcc = SourceStats(), CallsBcc()
    LibraryProbes(bcc, EbpfOptions(), stats.detail).probe_library(str(fifo), "torch", ON_MAPPING)
    lib = stats.detail["uprobes"][str(fifo)]
    assert lib["not_a_regular_file"] and lib["probes"] == 0, lib
    assert bcc.calls == []  # (probe_library takes bcc's bare Exception for a missing symbol: not raised)
    from memprof.analysis.loss import _irregular_notes
    assert _irregular_notes("ebpf", stats.detail["uprobes"]) == [
        f"ebpf: {fifo} was not a regular file when memprof went to probe it (replaced since it was mapped, "
        "or its process gone?); "
        "its torch_cpu allocations are not recorded"]


class CallsBcc:
    """Stands in for bcc's BPF object: keeps what it was asked to attach or load, and
    attaches nothing."""
    KPROBE = 2

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def attach_uprobe(self, **kwargs):
        self.calls.append(("attach_uprobe", kwargs))

    def attach_uretprobe(self, **kwargs):
        self.calls.append(("attach_uretprobe", kwargs))

    def load_func(self, *args):
        self.calls.append(("load_func", {"args": args}))


def _descriptors_of(path) -> list[int]:
    """This process's descriptors open on `path` (O_PATH ones included)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                found.append(int(name))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return found


def test_the_files_held_for_bcc_are_let_go_when_the_source_stops(tmp_path):
    """A library's O_PATH descriptor is held while its probes may be attached, and closed
    when the eBPF source stops: a process that records again (the API, a test run) does
    not gather them."""
    from memprof.model import SourceStats
    from memprof.sources.ebpf.library_probes import ON_MAPPING, LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions, EbpfSource
    lib = tmp_path / "libc10.so"
    lib.write_bytes(b"\x7fELF")  # malformed: found regular and held, its probes then missing
    source = EbpfSource()
    source._libraries = LibraryProbes(CallsBcc(), EbpfOptions(), SourceStats().detail)
    source._libraries.probe_library(str(lib), "torch", ON_MAPPING)
    assert len(_descriptors_of(lib)) == 1
    source.stop()
    assert _descriptors_of(lib) == []


def _claiming_section(tmp_path, claimed: int):
    """A copy of /bin/true named like an interpreter whose .dynsym header claims `claimed`
    bytes, the file extended (sparse) so that they lie within it: kilobytes on disk."""
    import shutil
    import struct

    from elftools.elf.elffile import ELFFile
    path = tmp_path / "python3big"
    shutil.copy("/bin/true", path)
    with open(path, "rb") as f:
        elf = ELFFile(f)
        header_at = elf["e_shoff"] + elf["e_shentsize"] * next(
            i for i, s in enumerate(elf.iter_sections()) if s.name == ".dynsym")
    with open(path, "r+b") as f:
        f.seek(header_at + 32)  # Elf64_Shdr.sh_size
        f.write(struct.pack("<Q", claimed))
        f.truncate(claimed + (1 << 20))
    return path


def test_a_section_that_claims_gigabytes_is_not_read(tmp_path):
    """A section header is the file's own say: a 2 GiB .dynsym in a sparse file took the
    root recorder to 2.3 GB here, read whole. Such a file is malformed to memprof now."""
    import resource

    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from memprof.sources.cpython.interp import PythonLayoutError, inspect_python
    from memprof.sources.symbols.files import section_bytes
    from memprof.sources.symbols.symbolize import UserSymbolizer
    path = _claiming_section(tmp_path, 24 * 89478485)  # a whole number of symbols, ~2 GiB
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(path, "rb") as f:
        with pytest.raises(ELFError, match="claims 2147483640 bytes"):
            section_bytes(ELFFile(f).get_section_by_name(".dynsym"))
    with pytest.raises(PythonLayoutError, match="claims"):
        inspect_python(str(path))
    assert UserSymbolizer().symbols_for(str(path)) is None
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mb < 200, f"peak grew {grown_mb:.0f} MB"


@pytest.fixture
def chrooted(tmp_path):
    """A process whose root is tmp_path/root (chroot, as root): its files are named to
    memprof under /proc/PID/root, as a container's are. Yields (pid, the root folder)."""
    import subprocess
    import sys
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.chroot(sys.argv[1]); "
                                "print('in', flush=True); time.sleep(60)", str(root)], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"in\n"
        yield process.pid, root
    finally:
        process.kill()
        process.wait()


def test_a_path_under_a_process_root_is_walked_inside_that_root(chrooted, tmp_path):
    """A container's absolute links lead to its own files: /proc/PID/root/lib/libc.so.6 ->
    /libc-real.so is the container's /libc-real.so, and a link to a file the container lacks
    (/etc/passwd here) or a `..` past its root leads nowhere, never to root's file of that
    name. A walk begun at the magic link itself would have followed both into root's tree."""
    from memprof.sources.symbols.files import locate, stat_of
    pid, root = chrooted
    (root / "libc-real.so").write_bytes(b"\x7fELF inside")
    (root / "lib" / "libc.so.6").symlink_to("/libc-real.so")
    (root / "lib" / "passwd").symlink_to("/etc/passwd")
    inside = f"/proc/{pid}/root"
    with open_binary(f"{inside}/lib/libc.so.6") as f:
        assert f.read() == b"\x7fELF inside"
    assert os.path.samestat(stat_of(f"{inside}/lib/libc.so.6"), os.stat(root / "libc-real.so"))
    for escaping in ("lib/passwd", "lib/" + "../" * 32 + "etc/passwd"):
        assert os.path.exists(f"{inside}/{escaping}")  # what the plain walk reaches: root's /etc/passwd
        with pytest.raises(FileNotFoundError):
            locate(f"{inside}/{escaping}")
    assert file_identity(f"{inside}/lib/passwd") is None


def test_one_file_named_by_several_paths_is_held_and_probed_once(chrooted):
    """A library is probed once, by (device, inode), whatever names it: a container process's
    /proc/PID/root path, root's own path of the same file, a link. Before, the key was the
    path's realpath, which differs for each (and which, for a /proc/PID/root path, followed
    the container's links in root's tree)."""
    from memprof.model import SourceStats
    from memprof.sources.ebpf.library_probes import ON_MAPPING, LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions
    pid, root = chrooted
    lib = root / "lib" / "libc10.so"
    lib.write_bytes(b"\x7fELF")  # malformed: held, its probes then missing
    (root / "libc10-link.so").symlink_to("/lib/libc10.so")
    stats = SourceStats()
    probes = LibraryProbes(CallsBcc(), EbpfOptions(), stats.detail)
    for path in (f"/proc/{pid}/root/libc10-link.so", str(lib), f"/proc/{pid}/root/lib/libc10.so"):
        probes.probe_library(path, "torch", ON_MAPPING)
    assert list(stats.detail["uprobes"]) == [f"/proc/{pid}/root/libc10-link.so"]
    assert probes.probed == {((os.stat(lib).st_dev, os.stat(lib).st_ino), "torch")}
    assert len(_descriptors_of(lib)) == 1
    probes.close_files()


def test_a_namespaced_interpreter_finds_the_libpython_of_its_own_root(chrooted):
    """A shared build's libpython is looked for where its process's loader looks (its RUNPATH,
    inside its root): the one there, else none, never root's file of that name."""
    import glob
    import shutil

    from memprof.sources.cpython.interp import runtime_file
    found = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12"))
    if not found:
        pytest.skip("needs pyenv's CPython 3.12, a shared build whose RUNPATH is absolute")
    pid, root = chrooted
    shutil.copy(found[-1], root / "python3.12")
    inside = f"/proc/{pid}/root"
    # Its RUNPATH, /root/.pyenv/versions/3.12.X/lib, holds the real libpython in root's tree only.
    assert runtime_file(f"{inside}/python3.12") == f"{inside}/python3.12"
    libpython = os.path.dirname(os.path.dirname(found[-1])) + "/lib/libpython3.12.so.1.0"
    own = root / libpython.lstrip("/")
    own.parent.mkdir(parents=True)
    own.write_bytes(b"\x7fELF")
    assert runtime_file(f"{inside}/python3.12") == f"{inside}{libpython}"


def test_a_process_chrooted_in_its_own_namespace_has_its_maps_taken_from_its_chroot(tmp_path):
    """The kernel names a process's files from its mount namespace's root, which is its
    /proc/PID/root only if it did not chroot inside that namespace (a container's pivot_root
    leaves them one). Chrooted there, its maps name /CHROOT/lib/x.so: that is /lib/x.so under
    its /proc/PID/root, and a file mapped from outside the chroot is reached by no path."""
    import shutil
    import subprocess
    import sys

    from memprof.sources.symbols.symbolize import Mapping, reachable
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")
    chroot = tmp_path / "chroot"
    chroot.mkdir()
    process = subprocess.Popen(["unshare", "-m", sys.executable, "-c", "import os, sys, time; os.chroot(sys.argv[1]); "
                                "print('in', flush=True); time.sleep(60)", str(chroot)], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"in\n"
        inside = Mapping(0x1000, 0x2000, 0, f"{chroot}/lib/x.so")
        outside = Mapping(0x3000, 0x4000, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6")
        assert reachable(process.pid, [inside, outside, Mapping(0x5000, 0x6000, 0, "[vdso]")]) == [
            Mapping(0x1000, 0x2000, 0, "/lib/x.so", root=f"/proc/{process.pid}/root"),
            Mapping(0x3000, 0x4000, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6", deleted=True,
                    root=f"/proc/{process.pid}/root"),
            Mapping(0x5000, 0x6000, 0, "[vdso]")]
    finally:
        process.kill()
        process.wait()
