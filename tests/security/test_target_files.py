"""The target's executables and libraries, which root reads for their symbols, are read as the
recording's owner (memprof/sources/symbols/files.py). Played with a real user whose program
runs in a mount namespace of its own (`unshare -Urm`, open to any user here) and maps a
library from a tmpfs it mounted over a folder of its home. /proc/PID/maps names the
library by its path in that namespace; in root's, the same path is whatever the user left
under the tmpfs: a link to a root-only ELF. Resolving the mapping's addresses by that path,
root read the root-only file's symbol names into the user's recording.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from memprof.asuser import Owner, UserThread
from memprof.sources.symbols import files
from memprof.sources.symbols.symbolize import UserSymbolizer

# Both names are 20 bytes, so the two libraries built from this source have the same layout:
# an address inside the user's function is inside the secret one in the other file.
LIBRARY_SOURCE = r"""
#include <unistd.h>
void NAME(int n) {
    for (int i = 0; i < n; i++) {
        int fds[2];
        long ret;
        /* pipe2 right here, so the kernel's allocation has this function on top of its user stack */
        __asm__ volatile ("syscall" : "=a"(ret) : "a"(293), "D"(fds), "S"(0) : "rcx", "r11", "memory");
        if (ret == 0) { close(fds[0]); close(fds[1]); }
    }
}
"""
USERS_NAME, SECRET_NAME = "users_own_function_1", "SECRET_root_only_fn1"

# The user's program: call into its library for a second, from inside the mount namespace.
PROGRAM = """
import ctypes, sys, time
mapped = ctypes.CDLL(sys.argv[1])
end = time.monotonic() + 1.0
while time.monotonic() < end:
    mapped.users_own_function_1(200)
    time.sleep(0.01)
"""


def build_library(source_dir: Path, name: str, out: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds this test's libraries")
    source = source_dir / f"{name}.c"
    source.write_text(LIBRARY_SOURCE.replace("NAME", name))
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


@pytest.fixture
def secret_library(tmp_path) -> Iterator[Path]:
    """A root-only ELF (0700, in a 0700 folder) whose one function is SECRET_NAME."""
    folder = Path(tempfile.mkdtemp(prefix="memprof-sec-secret-"))
    library = build_library(tmp_path, SECRET_NAME, folder / "libsecret.so")
    library.chmod(0o700)
    yield library
    shutil.rmtree(folder, ignore_errors=True)


def test_a_link_to_a_root_only_library_gives_the_owners_reader_nothing(make_user, secret_library, tmp_path):
    user = make_user()
    own = build_library(tmp_path, USERS_NAME, user.home / "libown.so")
    shutil.chown(own, user.uid, user.gid)
    link = user.home / "libswap.so"
    link.symlink_to(secret_library)
    assert UserSymbolizer().symbols_for(str(link)) is not None  # root alone would read it
    with UserThread(Owner(user.uid, user.gid), name="test-target-files") as as_owner:
        files.read_target_files_with(as_owner)
        try:
            assert UserSymbolizer().symbols_for(str(link)) is None
            with pytest.raises(PermissionError):
                files.open_binary(str(link))
            table = UserSymbolizer().symbols_for(str(own))  # the owner's own library reads as before
            assert table is not None and any(table.name(i) == USERS_NAME for i in range(len(table.values)))
        finally:
            files.read_target_files_with(None)


@pytest.mark.ebpf
def test_a_recording_never_holds_the_names_of_a_root_only_library_the_target_links_to(
        make_user, secret_library, memprof_as_root, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) plays the user's mount namespace")
    user = make_user()
    library = build_library(tmp_path, USERS_NAME, user.home / "libown.so")
    shutil.chown(library, user.uid, user.gid)
    hidden = user.home / "ns"
    assert user.run(["mkdir", str(hidden)]).returncode == 0
    # In root's namespace the library's path is a link to the secret; the user's namespace
    # mounts a tmpfs over the folder, with the real library at that name.
    assert user.run(["ln", "-s", str(secret_library), str(hidden / "libswap.so")]).returncode == 0
    program = user.write(user.home / "swap.py", PROGRAM)
    inside = (f'mount -t tmpfs none "$1" && cp "$2" "$1/libswap.so" && exec "$3" "$4" "$1/libswap.so"')
    recording = user.home / "swap.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", "unshare", "-Urm", "sh", "-c", inside,
                             "sh", hidden, library, sys.executable, program, cwd=user.home)
    assert result.returncode == 0, result.stderr
    from memprof.recording import open_recording
    frames = open_recording(recording).frames
    in_library = frames[frames["module"] == "libswap.so"]
    assert len(in_library), "no frame of the library was recorded: the test saw nothing"
    functions = set(in_library["function"])
    assert not any(SECRET_NAME in f for f in functions), functions
    assert functions == {"[unknown]"}, functions

