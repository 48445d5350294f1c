"""memprof.safe_output (files written without following a planted link) and
memprof.privileges (root given up for good through sudo), issue 19 item 5."""
from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from memprof.privileges import PrivilegeDropError, SudoUser, drop_root_if_sudo
from memprof.safe_output import UnsafeOutputError, output_directory, output_file, write_output

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to own links as another user)")


def _planted(link: Path, target: Path) -> Path:
    """A link as another user would plant it (owned by nobody when the test runs as root)."""
    link.symlink_to(target)
    if os.geteuid() == 0:
        os.lchown(link, NOBODY, NOBODY)
    return link


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_new_file_gets_its_content_and_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_output(tmp_path / "out.json", '{"a": 1}')
    finally:
        os.umask(old)
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}
    assert stat.S_IMODE((tmp_path / "out.json").stat().st_mode) == 0o644
    assert _leftovers(tmp_path) == []


def test_an_existing_file_is_replaced_whole(tmp_path):
    (tmp_path / "out").write_bytes(b"x" * 1000)
    write_output(tmp_path / "out", b"short")
    assert (tmp_path / "out").read_bytes() == b"short"


def test_a_planted_link_is_replaced_and_its_target_untouched(tmp_path):
    target = tmp_path / "secret"
    target.write_text("root only\n")
    link = _planted(tmp_path / "run.memprof.pftrace", target)
    write_output(link, b"trace")
    assert target.read_text() == "root only\n"
    assert not link.is_symlink() and link.read_bytes() == b"trace"


def test_a_dangling_link_is_replaced_and_nothing_is_created_where_it_pointed(tmp_path):
    link = _planted(tmp_path / "out.html", tmp_path / "absent")
    write_output(link, "page")
    assert not (tmp_path / "absent").exists()
    assert link.read_text() == "page"


def test_a_hard_link_keeps_its_other_name_unchanged(tmp_path):
    (tmp_path / "other").write_text("theirs")
    os.link(tmp_path / "other", tmp_path / "out")
    write_output(tmp_path / "out", "mine")
    assert (tmp_path / "other").read_text() == "theirs" and (tmp_path / "out").read_text() == "mine"


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary_one(tmp_path):
    (tmp_path / "out").write_text("before")
    with pytest.raises(RuntimeError):
        with output_file(tmp_path / "out") as f:
            f.write(b"half")
            raise RuntimeError("renderer failed")
    assert (tmp_path / "out").read_text() == "before"
    assert _leftovers(tmp_path) == []


def test_a_directory_at_the_name_is_an_error_and_leaves_nothing(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError):
        write_output(tmp_path / "out", b"x")
    with pytest.raises(IsADirectoryError):
        write_output(str(tmp_path) + "/", b"x")
    assert _leftovers(tmp_path) == [] and list((tmp_path / "out").iterdir()) == []


def test_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_output(tmp_path / "no" / "out", b"x")


def test_dev_null_is_written_in_place_not_replaced():
    write_output("/dev/null", b"discarded")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_fifo_with_a_reader_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    for _ in range(200):  # wait until the reader has the FIFO open
        try:
            write_output(fifo, b"through the pipe")
            break
        except OSError as e:
            assert e.errno == errno.ENXIO
            threading.Event().wait(0.01)
    reader.join(5)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(fifo.lstat().st_mode)


@as_root
def test_a_link_root_made_in_a_folder_only_root_writes_is_written_through(tmp_path):
    """As `/dev/stdout`: root's own link in a root-only folder is trusted (root is)."""
    folder = tmp_path / "rootonly"
    folder.mkdir(mode=0o755)
    target = tmp_path / "stdout-file"
    target.write_text("old content, longer than the new")
    (folder / "stdout").symlink_to(target)
    write_output(folder / "stdout", "new")
    assert (folder / "stdout").is_symlink() and target.read_text() == "new"


@as_root
def test_a_root_link_in_a_folder_others_can_write_is_replaced(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    target = tmp_path / "secret"
    target.write_text("root only")
    (folder / "out").symlink_to(target)
    write_output(folder / "out", "new")
    assert target.read_text() == "root only" and not (folder / "out").is_symlink()


def test_a_folder_reached_through_my_own_links_is_written(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "rel").symlink_to("real")
    (tmp_path / "abs").symlink_to(tmp_path / "rel")  # a chain: absolute, then relative
    write_output(tmp_path / "abs" / "out", "x")
    assert (tmp_path / "real" / "out").read_text() == "x"


@as_root
def test_a_folder_behind_another_users_link_is_refused(tmp_path):
    """A user swaps a folder of theirs for a link to a root-only one: root does not follow it."""
    (tmp_path / "etc").mkdir()
    _planted(tmp_path / "sub", tmp_path / "etc")
    with pytest.raises(UnsafeOutputError, match="sub is a symbolic link of user 65534"):
        write_output(tmp_path / "sub" / "run.memprof.pftrace", b"x")
    with pytest.raises(UnsafeOutputError):
        with output_directory(tmp_path / "sub" / "deeper" / "run.export"):
            pass
    assert list((tmp_path / "etc").iterdir()) == []


def test_a_link_loop_in_the_folder_is_an_error(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as caught:
        write_output(tmp_path / "a" / "out", b"x")
    assert caught.value.errno == errno.ELOOP


def test_an_output_directory_is_made_with_its_parents_and_files_go_in_by_descriptor(tmp_path):
    with output_directory(tmp_path / "a" / "b.export") as fd:
        write_output("events.csv", "x,y\n", dir_fd=fd)
    assert (tmp_path / "a" / "b.export" / "events.csv").read_text() == "x,y\n"


def test_an_output_directory_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    _planted(tmp_path / "run.export", tmp_path / "elsewhere")
    with pytest.raises(UnsafeOutputError, match="is a symbolic link"):
        with output_directory(tmp_path / "run.export"):
            pass
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_an_output_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run.export").write_text("")
    with pytest.raises(UnsafeOutputError, match="is not a directory"):
        with output_directory(tmp_path / "run.export"):
            pass


# --- memprof.privileges ---------------------------------------------------------------------

def test_sudo_user_from_the_environment():
    assert SudoUser.from_environ({}) is None
    assert SudoUser.from_environ({"SUDO_UID": "0", "SUDO_GID": "0"}) is None
    user = SudoUser.from_environ({"SUDO_UID": "4242", "SUDO_GID": "4343", "SUDO_USER": "nosuchuser-x"})
    assert (user.uid, user.gid) == (4242, 4343) and 4343 in user.groups
    with pytest.raises(PrivilegeDropError, match="SUDO_UID='x'"):
        SudoUser.from_environ({"SUDO_UID": "x", "SUDO_GID": "1"})


def test_nothing_changes_without_sudo():
    assert drop_root_if_sudo({}) is None


@as_root
def test_root_through_sudo_becomes_the_user_for_good():
    """In a child: after the drop every uid and gid is the user's, no capability is left,
    and setuid(0) fails."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it became, never return into pytest
        try:
            os.close(read)
            drop_root_if_sudo({"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"})
            try:
                os.setuid(0)
                regained = True
            except PermissionError:
                regained = False
            report = {"uids": os.getresuid(), "gids": os.getresgid(), "regained": regained,
                      "caps": [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")]}
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        report = json.loads(f.read())
    os.waitpid(pid, 0)
    assert report == {"uids": [NOBODY] * 3, "gids": [NOBODY] * 3, "regained": False, "caps": ["0000000000000000"]}
