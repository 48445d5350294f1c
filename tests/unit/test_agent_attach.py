"""`record --pid`'s side of the attach protocol (memprof/sources/agent_reader/attach.py): which
folder and ready file are trusted, and when a process is signalled. Real /proc, real files;
the processes are this test's own (their uid is the test's)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from memprof.asuser import Owner, UserThread
from memprof.sources.agent_reader import attach as agent_attach
from memprof.sources.agent_reader.attach import NoAgent, Refused, Target


@pytest.fixture
def sleeper():
    """A process with no SIGUSR2 handler (the signal's default action kills it)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.1)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def waiter():
    """A Python process with a SIGUSR2 handler that prints when it is signalled."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGUSR2, lambda *a: print('signalled', flush=True))\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "up"
    yield process
    process.kill()
    process.wait()


def make_folder(tmp_path, target: Target, *, mode=0o700, ready=None, name="x") -> str:
    folder = tmp_path / f"memprof-agent-{target.pid}-{name}"
    folder.mkdir()
    os.chmod(folder, mode)
    ready = {"pid": target.pid, "start_time": target.start_time} if ready is None else ready
    (folder / "ready").write_text(json.dumps(ready))
    return str(folder)


def found(tmp_path, target: Target) -> str | None:
    fd = agent_attach._find_agent_folder(target, [str(tmp_path)])
    if fd is None:
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_read_target_sees_the_handler_and_the_start_time(sleeper, waiter):
    quiet, catching = agent_attach.read_target(sleeper.pid), agent_attach.read_target(waiter.pid)
    assert not quiet.handles_attach_signal and catching.handles_attach_signal
    assert quiet.owner == Owner(os.geteuid(), os.getegid(), tuple(os.getgroups()))
    with open(f"/proc/{waiter.pid}/stat") as f:
        assert catching.start_time == int(f.read().rpartition(")")[2].split()[19])


def test_a_private_folder_naming_the_process_is_found(tmp_path, waiter):
    target = agent_attach.read_target(waiter.pid)
    folder = make_folder(tmp_path, target)
    assert found(tmp_path, target) == folder


@pytest.mark.parametrize("case", ["group-writable", "world-writable", "stale start time", "other pid", "not json",
                                  "ready is a symlink", "ready is a fifo", "folder is a symlink"])
def test_folders_and_ready_files_that_cannot_be_trusted_are_passed_over(tmp_path, waiter, case):
    target = agent_attach.read_target(waiter.pid)
    if case == "group-writable":
        make_folder(tmp_path, target, mode=0o770)
    elif case == "world-writable":
        make_folder(tmp_path, target, mode=0o777)
    elif case == "stale start time":
        make_folder(tmp_path, target, ready={"pid": target.pid, "start_time": target.start_time - 1})
    elif case == "other pid":
        make_folder(tmp_path, target, ready={"pid": target.pid + 1, "start_time": target.start_time})
    elif case == "not json":
        folder = make_folder(tmp_path, target)
        open(os.path.join(folder, "ready"), "w").write("3.11.2")
    elif case in ("ready is a symlink", "ready is a fifo"):
        real = tmp_path / "real"
        real.write_text(json.dumps({"pid": target.pid, "start_time": target.start_time}))
        folder = make_folder(tmp_path, target)
        os.unlink(os.path.join(folder, "ready"))
        if case == "ready is a fifo":
            os.mkfifo(os.path.join(folder, "ready"))
        else:
            os.symlink(real, os.path.join(folder, "ready"))
    elif case == "folder is a symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        make_folder(elsewhere, target)
        os.symlink(elsewhere / f"memprof-agent-{target.pid}-x", tmp_path / f"memprof-agent-{target.pid}-y")
    assert found(tmp_path, target) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder of another uid")
def test_a_folder_of_another_uid_is_passed_over(tmp_path, waiter):
    target = agent_attach.read_target(waiter.pid)
    folder = make_folder(tmp_path, target)
    os.chown(folder, 12345, 12345)
    assert found(tmp_path, target) is None


def test_a_process_without_handler_is_never_signalled(sleeper):
    target = agent_attach.read_target(sleeper.pid)
    with pytest.raises(Refused, match="no SIGUSR2 handler"):
        agent_attach.signal_agent(sleeper.pid, agent_attach.open_process(sleeper.pid), target)
    time.sleep(0.1)
    assert sleeper.poll() is None


def test_a_process_with_handler_is_signalled_through_its_pidfd(waiter):
    target = agent_attach.read_target(waiter.pid)
    pidfd = agent_attach.open_process(waiter.pid)
    try:
        agent_attach.signal_agent(waiter.pid, pidfd, target)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    assert waiter.stdout.readline().strip() == "signalled"


def test_another_process_under_the_same_pid_is_not_signalled(waiter):
    target = agent_attach.read_target(waiter.pid)
    older = Target(target.pid, target.owner, target.start_time - 5, True)
    with pytest.raises(Refused, match="another process"):
        agent_attach.signal_agent(waiter.pid, None, older)


def test_only_the_recordings_user_or_root_may_have_an_agent_attached():
    target = Target(4242, Owner(1000, 1000), 1, True)
    assert agent_attach.may_attach(target, None) is None
    assert agent_attach.may_attach(target, Owner(0, 0)) is None
    assert agent_attach.may_attach(target, Owner(1000, 1000)) is None
    assert "runs as uid 1000, not as the recording's user (uid 1001)" in agent_attach.may_attach(target, Owner(1001, 1001))


def test_the_request_replaces_whatever_was_planted_at_its_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    folder = tmp_path / "agentdir"
    folder.mkdir(mode=0o700)
    os.symlink(victim, folder / "request.json")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with UserThread(None) as thread:
            agent_attach.send_request(thread, fd, {"dir": "/rec/agent"})
    finally:
        os.close(fd)
    assert victim.read_text() == "kept\n"
    assert not (folder / "request.json").is_symlink()
    assert json.loads((folder / "request.json").read_text()) == {"dir": "/rec/agent"}


def test_no_folder_means_no_agent(tmp_path, waiter, monkeypatch):
    target = agent_attach.read_target(waiter.pid)
    monkeypatch.setattr(agent_attach, "temp_folders", lambda pid: [str(tmp_path)])
    with UserThread(None) as thread, pytest.raises(NoAgent):
        agent_attach.find_agent_folder(thread, target)


def test_the_targets_tmpdir_is_searched_first(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={**os.environ, "TMPDIR": str(tmp_path), "TMP": "relative/ignored"})
    try:
        time.sleep(0.1)
        assert agent_attach.temp_folders(process.pid)[:2] == [str(tmp_path), "/tmp"]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
