"""When `record --sources +native` may put memprof's LD_PRELOAD interposer into a command
(memprof/preload): root chooses code that runs in the user's process, so it must be code no
third user can change, and the user must be able to load it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from memprof import preload

UID = 4321  # the command's user (any uid: nothing runs as it here)


@pytest.fixture
def library(tmp_path) -> Path:
    """A copy of the interposer (a stand-in file when it is not built) in a root-only folder."""
    folder = tmp_path / "lib"
    folder.mkdir(mode=0o755)
    path = folder / preload.LIBRARY_NAME
    if preload.library_path().is_file():
        shutil.copy(preload.library_path(), path)
    else:
        path.write_bytes(b"\x7fELF")
    os.chmod(path, 0o755)
    return path


def test_a_root_owned_library_in_root_owned_folders_is_given(library):
    if os.geteuid() != 0:
        pytest.skip("the ownership rule is root's: run as root")
    assert preload.why_not({}, UID, library, can_read=lambda path: True) is None


def test_not_built(tmp_path):
    why = preload.why_not({}, UID, tmp_path / preload.LIBRARY_NAME)
    assert why is not None and "not built" in why and "make setup" in why


def test_a_command_that_preloads_already_keeps_its_own(library):
    why = preload.why_not({"LD_PRELOAD": "/opt/jemalloc/libjemalloc.so"}, UID, library)
    assert why is not None and "LD_PRELOAD" in why


def test_a_library_others_may_write_is_refused(library):
    os.chmod(library, 0o775)
    why = preload.why_not({}, UID, library, can_read=lambda path: True)
    assert why is not None and "could be changed by another user" in why


def test_a_library_of_a_third_user_is_refused(library):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(library, UID + 1, UID + 1)
    why = preload.why_not({}, UID, library, can_read=lambda path: True)
    assert why is not None and f"owner uid {UID + 1}" in why


def test_a_folder_everyone_may_write_is_refused(library):
    if os.geteuid() != 0:
        pytest.skip("the ownership rule is root's: run as root")
    os.chmod(library.parent, 0o777)
    why = preload.why_not({}, UID, library, can_read=lambda path: True)
    assert why is not None and "another user could replace it" in why and "writable by every user" in why


def test_a_library_the_user_cannot_read_is_refused(library):
    if os.geteuid() != 0:
        pytest.skip("the ownership rule is root's: run as root")
    why = preload.why_not({}, UID, library, can_read=lambda path: False)
    assert why is not None and f"uid {UID}" in why and "cannot read" in why


def test_the_child_gets_the_library_and_its_sampling():
    env = preload.child_env(Path("/x/libmemprof_preload.so"), 65536)
    assert env == {"LD_PRELOAD": "/x/libmemprof_preload.so", "MEMPROF_NATIVE_SAMPLE_BYTES": "65536"}


def test_opens_reads_as_the_calling_thread(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    assert preload.opens(path)
    assert not preload.opens(tmp_path / "absent")


def test_the_options_own_reasons_for_uprobes_are_said_and_not_warned_about():
    from memprof.capture.session import _asked_for_uprobes
    from memprof.sources.ebpf.source import EbpfOptions
    assert _asked_for_uprobes(EbpfOptions(native_probes="uprobes")) == "--native-probes uprobes"
    assert "--allocator-prefix" in _asked_for_uprobes(EbpfOptions(allocator_prefix="je_"))
    assert _asked_for_uprobes(EbpfOptions()) is None
