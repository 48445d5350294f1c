"""The target's executables and libraries, which root reads for their symbols (memprof/
sources/symbols/files.py, symbolize.py). Played with a real user whose program runs in a
mount namespace of its own (`unshare -Urm`, open to any user here) and maps a library from
a tmpfs it mounted over a folder of its home:

- /proc/PID/maps names the library by its path in that namespace; in root's, the same
  path is whatever the user left under the tmpfs: a link to a root-only ELF, whose symbol
  names root read into the user's recording. The file is now reached through
  /proc/PID/root, the process's own view (which also names a container's frames right);
- there, the process can mount another tmpfs over the library's folder, with a link at
  the library's name to an absolute path, which a walk begun at /proc/PID/root resolves in
  root's namespace: again the root-only ELF. The files are now opened with the recording
  owner's credentials, which may not read it.
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

# Names of 20 bytes, so that the libraries built from this source have one layout: an
# address inside the user's function N is inside the secret function N of the other file.
LIBRARY_SOURCE = r"""
#include <unistd.h>
static inline __attribute__((always_inline)) void pipes(int n) {
    for (int i = 0; i < n; i++) {
        int fds[2];
        long ret;
        /* pipe2 right here, so the kernel's allocation has this code on top of its user stack */
        __asm__ volatile ("syscall" : "=a"(ret) : "a"(293), "D"(fds), "S"(0) : "rcx", "r11", "memory");
        if (ret == 0) { close(fds[0]); close(fds[1]); }
    }
}
__attribute__((noinline)) void PREFIX1(int n) { pipes(n); }
__attribute__((noinline)) void PREFIX2(int n) { pipes(n); }
"""
USERS, SECRET = "users_own_function_", "SECRET_root_only_fn_"

# The user's program, inside its namespace, with its library at argv[1] (in a folder of a
# tmpfs it mounted). Half a second in its library's first function; then a tmpfs over the
# library's folder, a link at its name to the root-only ELF (argv[2]), and half a second
# in the second function, whose addresses memprof has not resolved yet.
PROGRAM = """
import ctypes, os, subprocess, sys, time
library, secret = sys.argv[1], sys.argv[2]
mapped = ctypes.CDLL(library)

def call(function, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        function(200)
        time.sleep(0.01)

call(mapped.users_own_function_1, 0.5)
subprocess.run(["mount", "-t", "tmpfs", "none", os.path.dirname(library)], check=True)
os.symlink(secret, library)
call(mapped.users_own_function_2, 0.5)
"""


def build_library(source_dir: Path, name: str, out: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds this test's libraries")
    source = source_dir / f"{name}.c"
    source.write_text(LIBRARY_SOURCE.replace("PREFIX", name))
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


@pytest.fixture
def secret_library(tmp_path) -> Iterator[Path]:
    """A root-only ELF (0700, in a 0700 folder) whose functions are SECRET's."""
    folder = Path(tempfile.mkdtemp(prefix="memprof-sec-secret-"))
    library = build_library(tmp_path, SECRET, folder / "libsecret.so")
    library.chmod(0o700)
    yield library
    shutil.rmtree(folder, ignore_errors=True)


def test_a_link_to_a_root_only_library_gives_the_owners_reader_nothing(make_user, secret_library, tmp_path):
    user = make_user()
    own = build_library(tmp_path, USERS, user.home / "libown.so")
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
            assert table is not None and any(table.name(i) == USERS + "1" for i in range(len(table.values)))
        finally:
            files.read_target_files_with(None)


@pytest.mark.ebpf
def test_a_recording_names_a_namespaced_targets_own_library_and_never_a_root_only_one(
        make_user, secret_library, memprof_as_root, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) plays the user's mount namespace")
    user = make_user()
    library = build_library(tmp_path, USERS, user.home / "libown.so")
    shutil.chown(library, user.uid, user.gid)
    hidden = user.home / "ns"
    assert user.run(["mkdir", str(hidden)]).returncode == 0
    # In root's namespace the library's path is a link to the secret; the user's namespace
    # mounts a tmpfs over the folder, with the real library at that name.
    assert user.run(["ln", "-s", str(secret_library), str(hidden / "libswap.so")]).returncode == 0
    program = user.write(user.home / "swap.py", PROGRAM)
    inside = ('mount -t tmpfs none "$1" && mkdir "$1/lib" && cp "$2" "$1/lib/libswap.so" '
              '&& exec "$3" "$4" "$1/lib/libswap.so" "$5"')
    recording = user.home / "swap.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", "unshare", "-Urm", "sh", "-c", inside,
                             "sh", hidden, library, sys.executable, program, secret_library, cwd=user.home)
    assert result.returncode == 0, result.stderr
    from memprof.recording import open_recording
    frames = open_recording(recording).frames
    functions = set(frames[frames["module"] == "libswap.so"]["function"])
    assert not any(SECRET in f for f in functions), functions
    # Read through /proc/PID/root: the process's own library names its first function's frames.
    assert USERS + "1" in functions, functions
    assert functions <= {USERS + "1", USERS + "2", "[unknown]"}, functions
