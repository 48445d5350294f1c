"""`sudo memprof record -- CMD` passes the signals its user sends it on to the command (sudo
relays the user's own to memprof). The command's first process can exit while the recording
goes on for its children; its pid is then free, and a user who cycles pids can have another
user's process take it. Root must never signal that process (docs/SECURITY.md). Played with
two real users: the pid is handed to the victim's process through ns_last_pid, as cycling
through pid_max would."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ebpf

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """No process, not even a zombie, has `pid`: it was reaped, and is free."""
    return not Path(f"/proc/{pid}").exists()


def _victim_at(victim, pid: int) -> subprocess.Popen | None:
    """The victim user's `sleep`, started as pid `pid` (the kernel hands out ns_last_pid + 1
    next); None when another process took it first."""
    NS_LAST_PID.write_text(str(pid - 1))
    process = victim.popen(["sleep", "60"])
    if process.pid == pid:
        return process
    process.kill()
    process.wait()
    return None


def test_a_signal_sent_after_the_commands_first_process_exited_reaches_no_one_else(make_user, tmp_path):
    if not NS_LAST_PID.exists():
        pytest.skip("this kernel has no /proc/sys/kernel/ns_last_pid to hand out a chosen pid")
    user, victim = make_user(), make_user()
    pidfile = user.home / "first-pid"
    command = ["sh", "-c", f'echo $$ > {pidfile}; sleep 8 & exit 0']
    recorder = subprocess.Popen([sys.executable, "-P", "-m", "memprof", "record", "-q", "-o", user.home / "r.memprof",
                                 "--", *command], cwd=user.home, env=user.sudo_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    victims = []
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60, "the command's first process")
        first = int(pidfile.read_text())
        _wait_for(lambda: _gone(first), 10, "memprof to reap the command's first process")
        for _ in range(20):  # another process may take the pid between the write and the fork
            process = _victim_at(victim, first)
            if process is not None:
                victims.append(process)
                break
        else:
            pytest.skip(f"pid {first} was taken by other processes 20 times")
        os.kill(recorder.pid, signal.SIGUSR1)  # as sudo relays the user's `kill -USR1` of it
        time.sleep(0.5)
        assert victims[0].poll() is None, f"the victim's process (pid {first}) got {-victims[0].returncode}"
        assert recorder.poll() is None  # and the recording goes on for the command's sleep
    finally:
        for process in victims:
            process.kill()
            process.wait()
        out, err = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, err
