"""`sudo memprof record --pid` reaches only the invoking user's own processes (docs/SECURITY.md)."""
from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.ebpf


def test_sudo_user_cannot_attach_to_another_users_process(make_user, memprof_as_root):
    """A user allowed `sudo memprof` may not watch root's (or anyone else's) process: refused
    before any probe loads, nothing is created, the process is untouched."""
    user = make_user()
    victim = subprocess.Popen(["sleep", "30"])
    try:
        recording = user.home / "theirs.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", victim.pid, "--duration", "1",
                                 cwd=user.home)
        assert result.returncode == 1, result.stderr
        assert f"pid {victim.pid} runs as uid 0/0/0, not as you" in result.stderr
        assert "Traceback" not in result.stderr
        assert not recording.exists()
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_sudo_user_attaches_to_their_own_process(make_user, memprof_as_root):
    user = make_user()
    mine = user.popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        recording = user.home / "mine.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", mine.pid, "--duration", "1",
                                 cwd=user.home)
        assert result.returncode == 0, result.stderr
        assert (recording / "meta.json").stat().st_uid == user.uid
        assert mine.poll() is None
    finally:
        mine.kill()
        mine.wait()
