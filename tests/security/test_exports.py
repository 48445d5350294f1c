"""Issue 19, item 5: what report, export, diff, check and import write, run as root.

The attack: a user owns a recording (`run.memprof`, theirs after `sudo memprof record`), and
plants symbolic links where memprof writes by default (`run.memprof.pftrace`,
`run.memprof.export/`, `run.html`, …), pointing at root-only files. They then run (or wait
for an admin to run) `sudo memprof export` or `sudo memprof report … -o`. Root must write
nothing outside what the user could write: every canary stays byte for byte as it was, each
output that is written is a fresh regular file owned by the user, and a link memprof will not
replace (a directory's) is refused with one line and exit 1, never a traceback.

Run through sudo, these commands give root up for good before reading anything
(memprof.privileges); every file is written by memprof.safe_output, which replaces a link at
the final name and never writes through it, so root without sudo is safe too.
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.diff_factories import write_recording as write_diff_recording
from tests.export_factories import write_recording
from tests.factories import ev, events_frame

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="security tests create users and act as root")

DATA = Path(__file__).resolve().parents[1] / "data"
SINGLE_FILE = {"perfetto": ".pftrace", "chrome-trace": ".trace.json", "speedscope": ".speedscope.json",
               "pprof": ".pb.gz", "folded": ".folded"}


def _users_recording(user, name: str = "run.memprof") -> Path:
    """A finalized recording in the user's home, made by the test factories and handed to the
    user (as `sudo memprof record` leaves it)."""
    path = write_recording(user.home / name)
    _hand_to(user, path)
    return path


def _hand_to(user, path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        os.lchown(item, user.uid, user.gid)


def _plant(user, link: Path, target: Path) -> Path:
    """A symbolic link made by the user (so it is theirs, as an attacker's would be)."""
    result = user.run(["ln", "-s", str(target), str(link)])
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and link.lstat().st_uid == user.uid
    return link


def _root_env(user) -> dict:
    """The environment of root run without sudo (no SUDO_* variables)."""
    return {k: v for k, v in user.sudo_env().items() if not k.startswith("SUDO_")}


def assert_users_file(path: Path, user) -> None:
    """A regular file (not a link) that belongs to `user`."""
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode), f"{path} is not a regular file"
    assert (info.st_uid, info.st_gid) == (user.uid, user.gid), f"{path} is owned by {info.st_uid}:{info.st_gid}"


def assert_one_clear_line(result, *needles: str) -> None:
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.stderr.startswith("memprof: error: "), result.stderr
    for needle in needles:
        assert needle in " ".join(result.stderr.split()), result.stderr


# --- export: the default outputs -----------------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(SINGLE_FILE))
def test_export_through_sudo_replaces_a_planted_link_and_the_file_is_the_users(fmt, make_user, canaries,
                                                                               memprof_as_root):
    user = make_user()
    recording = _users_recording(user)
    default = Path(str(recording) + SINGLE_FILE[fmt])
    _plant(user, default, canaries.script)

    result = memprof_as_root(user, "export", recording, "--format", fmt, cwd=user.home)

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert_users_file(default, user)
    assert default.stat().st_size > 0
    assert not [p for p in user.home.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_export_to_a_link_at_a_name_that_does_not_exist_creates_nothing_there(make_user, canaries, memprof_as_root):
    """A dangling link: following it would create a root-only file where the user chose."""
    user = make_user()
    recording = _users_recording(user)
    default = Path(str(recording) + ".pftrace")
    _plant(user, default, canaries.absent)

    result = memprof_as_root(user, "export", recording, "--format", "perfetto", cwd=user.home)

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert_users_file(default, user)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_directory_that_is_a_planted_link_is_refused(fmt, make_user, canaries, memprof_as_root):
    user = make_user()
    recording = _users_recording(user)
    default = Path(str(recording) + ".export")
    _plant(user, default, canaries.tree)

    result = memprof_as_root(user, "export", recording, "--format", fmt, cwd=user.home)

    assert result.returncode == 1, result.stderr
    assert_one_clear_line(result, f"{default} is a symbolic link")
    canaries.assert_untouched()
    assert default.is_symlink()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_directory_files_that_are_planted_links_are_replaced(fmt, make_user, canaries, memprof_as_root):
    user = make_user()
    recording = _users_recording(user)
    directory = Path(str(recording) + ".export")
    assert user.run(["mkdir", str(directory)]).returncode == 0
    events, findings = directory / f"events.{fmt}", directory / f"findings.{fmt}"
    _plant(user, events, canaries.tree / "shadow")
    _plant(user, findings, canaries.absent)

    result = memprof_as_root(user, "export", recording, "--format", fmt, cwd=user.home)

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert_users_file(events, user)
    assert_users_file(findings, user)


@pytest.mark.parametrize("fmt, where", [("perfetto", "root/new.pftrace"), ("csv", "tree/drop-in")],
                         ids=["file", "directory"])
def test_export_through_sudo_creates_nothing_where_the_user_cannot_write(make_user, canaries, memprof_as_root,
                                                                         fmt, where):
    """`-o` into a root-only folder: the user could not create a file (or an export folder)
    there, so memprof does not."""
    user = make_user()
    recording = _users_recording(user)
    folder, name = where.split("/")
    target = getattr(canaries, folder) / name

    result = memprof_as_root(user, "export", recording, "--format", fmt, "-o", target, cwd=user.home)

    assert result.returncode == 1
    assert_one_clear_line(result, "Permission denied")
    canaries.assert_untouched()
    assert not target.exists()


def test_root_without_sudo_replaces_a_planted_link_too(make_user, canaries, memprof_as_root):
    """No SUDO_*: memprof stays root, and still never writes through the user's link."""
    user = make_user()
    recording = _users_recording(user)
    default = Path(str(recording) + ".trace.json")
    _plant(user, default, canaries.tree / "passwd")

    result = memprof_as_root(user, "export", recording, "--format", "chrome-trace", cwd=user.home,
                             env=_root_env(user))

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert not default.is_symlink() and default.lstat().st_uid == 0


def test_root_without_sudo_does_not_follow_a_folder_the_user_swapped_for_a_link(make_user, canaries,
                                                                               memprof_as_root):
    """The user's folder on the -o path is a link to a root-only folder: root would create
    its files there (a systemd or cron drop-in folder). Refused, nothing created."""
    user = make_user()
    recording = _users_recording(user)
    _plant(user, user.home / "out", canaries.tree)

    for fmt, name in (("perfetto", "run.pftrace"), ("csv", "tables")):
        result = memprof_as_root(user, "export", recording, "--format", fmt, "-o", user.home / "out" / name,
                                 cwd=user.home, env=_root_env(user))
        assert result.returncode == 1, result.stderr
        assert_one_clear_line(result, "out is a symbolic link of user")
    canaries.assert_untouched()


# --- report … -o, and the html report's default ---------------------------------------------

def test_report_html_default_output_replaces_a_planted_link(make_user, canaries, memprof_as_root):
    user = make_user()
    recording = _users_recording(user)
    page = _plant(user, user.home / "run.html", canaries.script)

    result = memprof_as_root(user, "report", "html", recording, cwd=user.home)

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert_users_file(page, user)
    assert page.read_text().startswith("<!DOCTYPE html>") or "<html" in page.read_text()[:200]


@pytest.mark.parametrize("args", [["report", "html", "--format", "json"], ["report", "chains", "--flame"]])
def test_report_output_option_replaces_a_planted_link(args, make_user, canaries, memprof_as_root):
    user = make_user()
    recording = _users_recording(user)
    out = _plant(user, user.home / "out.txt", canaries.tree / "ssh" / "id_ed25519")

    result = memprof_as_root(user, *args, recording, "-o", out, cwd=user.home)

    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert_users_file(out, user)


# --- the commands become the user ---------------------------------------------------------------

def test_reading_commands_through_sudo_read_only_what_the_user_can(make_user, canaries, memprof_as_root):
    """A root-only recording is unreadable through sudo (the process is the user's), and
    readable by root run without sudo: so no command reads or writes as root for a user."""
    user = make_user()
    secret = write_recording(canaries.root / "secret.memprof")
    os.chmod(secret, 0o700)
    canaries.state = canaries.snapshot()

    as_user = memprof_as_root(user, "report", "leaks", secret, cwd=user.home)
    as_root = memprof_as_root(user, "report", "leaks", secret, cwd=user.home, env=_root_env(user))

    assert as_root.returncode == 0, as_root.stderr
    assert as_user.returncode != 0
    assert "Traceback" not in as_user.stderr and "internal error" not in as_user.stderr, as_user.stderr
    assert "is not readable" in as_user.stderr or "ermission denied" in as_user.stderr, as_user.stderr
    canaries.assert_untouched()


def test_diff_and_check_through_sudo_read_the_users_recordings(make_user, canaries, memprof_as_root):
    user = make_user()
    events = events_frame([ev(1_000, "alloc", 0x10, 4096, None, layer="native_heap", device="cpu")])
    a = write_diff_recording(user.home / "a.memprof", events)
    b = write_diff_recording(user.home / "b.memprof", events)
    _hand_to(user, a)
    _hand_to(user, b)

    diff = memprof_as_root(user, "diff", a, b, cwd=user.home)
    check = memprof_as_root(user, "check", a, "--max-peak", "1GiB", cwd=user.home)

    assert diff.returncode == 0, diff.stderr
    assert check.returncode == 0, check.stderr
    canaries.assert_untouched()


def test_import_through_sudo_writes_the_users_recording_and_not_through_a_link(make_user, canaries,
                                                                                memprof_as_root):
    user = make_user()
    snapshot = user.home / "snap.pickle"
    shutil.copyfile(DATA / "handbuilt_snapshot_leak.pickle", snapshot)
    os.chown(snapshot, user.uid, user.gid)
    _plant(user, user.home / "planted.memprof", canaries.tree)

    into_link = memprof_as_root(user, "import", snapshot, "-o", user.home / "planted.memprof", "--force",
                                cwd=user.home)
    fresh = memprof_as_root(user, "import", snapshot, cwd=user.home)

    assert into_link.returncode != 0
    assert "Traceback" not in into_link.stderr and "internal error" not in into_link.stderr, into_link.stderr
    assert fresh.returncode == 0, fresh.stderr
    canaries.assert_untouched()
    made = user.home / "snap.memprof"
    assert made.is_dir() and not made.is_symlink()
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in [made, *made.rglob("*")]} == {(user.uid, user.gid)}
