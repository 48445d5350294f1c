"""The agent's folder in a recording: made 0700 without following anything planted, and
refused where a folder on the way to it could be written by another user."""
from __future__ import annotations

import os
import stat

import pytest

from memprof.asuser import UserThread
from memprof.sources.agent_reader.folder import BOOT_FILES, boot_dir, make_boot_folder, unsafe_ancestor


@pytest.fixture
def files():
    with UserThread(None) as thread:
        yield thread


def test_the_boot_folder_is_private_and_holds_copies_of_the_boot_files(tmp_path, files):
    folder = tmp_path / "rec.memprof" / "agent"
    folder.parent.mkdir()
    make_boot_folder(files, folder)
    for path in (folder, folder / "boot"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700 and stat.S_ISDIR(os.lstat(path).st_mode)
    for name in BOOT_FILES:
        copy = folder / "boot" / name
        assert stat.S_ISREG(os.lstat(copy).st_mode) and copy.read_bytes() == (boot_dir() / name).read_bytes()


@pytest.mark.parametrize("planted", ["agent", "agent/boot", "agent/boot/sitecustomize.py"])
def test_a_symlink_planted_in_the_folders_place_is_not_followed(tmp_path, files, planted):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "sitecustomize.py").write_text("kept\n")
    folder = tmp_path / "rec.memprof" / "agent"
    (tmp_path / "rec.memprof" / planted).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "rec.memprof" / planted).symlink_to(victim / "sitecustomize.py" if planted.endswith(".py") else victim)
    with pytest.raises(FileExistsError):
        make_boot_folder(files, folder)
    assert os.listdir(victim) == ["sitecustomize.py"] and (victim / "sitecustomize.py").read_text() == "kept\n"


def test_private_folders_and_sticky_shared_ones_are_safe(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "rec.memprof").mkdir()
    assert unsafe_ancestor(shared / "rec.memprof", os.geteuid()) is None


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_folder_others_may_write_into_is_named(tmp_path, mode):
    shared = tmp_path / "shared"
    (shared / "rec.memprof").mkdir(parents=True)
    os.chmod(shared, mode)
    if mode == 0o775:
        os.chown(shared, -1, 12345)  # a group that is not the user's own
    why = unsafe_ancestor(shared / "rec.memprof", os.geteuid())
    assert why is not None and why.startswith(str(shared.resolve()))


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another uid")
def test_a_folder_of_another_user_on_the_way_is_named(tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "rec.memprof").mkdir(parents=True)
    os.chown(theirs, 12345, 12345)
    assert unsafe_ancestor(theirs / "rec.memprof", 0) == f"{theirs.resolve()} belongs to uid 12345"


def test_the_real_path_is_checked_through_symlinks(tmp_path):
    shared = tmp_path / "shared"
    (shared / "rec.memprof").mkdir(parents=True)
    os.chmod(shared, 0o777)
    (tmp_path / "link").symlink_to(shared)
    assert unsafe_ancestor(tmp_path / "link" / "rec.memprof", os.geteuid()).startswith(str(shared.resolve()))
