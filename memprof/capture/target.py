"""Starting the command to record, held at a gate until the probes follow it.

The child is forked by hand rather than through subprocess: subprocess.Popen returns only
once the child has exec'd, and we need its pid in the kernel's process filter *before* it
execs, so that not one of its allocations is missed."""
from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
from dataclasses import dataclass

from memprof import own_env, stdio
from memprof.errors import TargetError


@dataclass(frozen=True)
class RunAs:
    """The invoking user when memprof runs under sudo (the command runs as them)."""

    uid: int
    gid: int
    groups: list[int]
    home: str | None
    user: str | None

    @classmethod
    def from_sudo(cls, environ=os.environ) -> "RunAs | None":
        """The invoking user (SUDO_UID, SUDO_GID, SUDO_USER, read as memprof.privileges
        reads them) when memprof runs as root through sudo by another user; else None.
        PrivilegeDropError (exit 1, one line) when the variables name no user."""
        if os.geteuid() != 0:
            return None
        from memprof.privileges import PrivilegeDropError, SudoUser
        try:
            user = SudoUser.from_environ(environ)
        except PrivilegeDropError as e:
            raise PrivilegeDropError(e.message, "sudo sets SUDO_UID and SUDO_GID to the invoking user's ids; "
                                                "running as root yourself, unset them") from None
        if user is None:
            return None
        try:
            entry = pwd.getpwuid(user.uid)
            return cls(user.uid, user.gid, list(user.groups), entry.pw_dir, entry.pw_name)
        except KeyError:
            return cls(user.uid, user.gid, list(user.groups), None, None)


def resolve_executable(command: list[str]) -> str:
    """The path `command[0]` would exec, or TargetError with a reason."""
    if not command:
        raise TargetError("no command to record", "usage: memprof record -- CMD [ARGS…]")
    name = command[0]
    path = name if "/" in name else shutil.which(name)
    if path is None or not os.path.exists(path):
        raise TargetError(f"command not found: {name}", "check the spelling, or give a full path")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise TargetError(f"cannot execute {path}: permission denied or not a program", "chmod +x it, or run it through its interpreter")
    return path


class GatedChild:
    """A forked child that waits for `release()` before it execs the command."""

    def __init__(self, command: list[str], path: str, run_as: RunAs | None):
        gate_r, self._gate_w = os.pipe()
        self._err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(self._gate_w)  # else reading the gate to its end would wait on ourselves
            _child(command, path, run_as, gate_r, err_w)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid
        self.status: int | None = None
        # Signals go through a pidfd taken now, while the child cannot have been reaped: once
        # it is, its pid is free for anyone's next process, and a user who cycles pids could
        # have root's forwarded signal (sudo passes the user's on to memprof) kill another
        # user's process (docs/SECURITY.md). None where the kernel has no pidfds (< 5.3).
        self._pidfd = _pidfd_of(pid)

    def release(self, extra_env: dict[str, str] | None = None) -> None:
        """Let the child exec, with `extra_env` added to its environment (the agent's
        variables: known only now, once the recording exists); raise TargetError if the exec
        failed."""
        payload = json.dumps(extra_env or {}).encode()
        os.write(self._gate_w, b"g" + payload)
        os.close(self._gate_w)
        data = _read_all(self._err_r)
        os.close(self._err_r)
        if data:
            code = int(data.decode())
            self.wait()
            raise TargetError(f"cannot execute the command: {os.strerror(code)}", "check the command and its permissions")

    def abort(self) -> None:
        """Kill the child before it ever execs (nothing of the command has run)."""
        self.signal(signal.SIGKILL)
        os.close(self._gate_w)
        os.close(self._err_r)
        self.wait()

    def exit_fd(self) -> int | None:
        """A descriptor that polls readable once the child has exited (its pidfd), while it is
        not yet reaped; None after, or where the kernel has no pidfds. Not to be closed."""
        return self._pidfd if self.status is None else None

    def poll(self) -> int | None:
        """Exit status once reaped (128+N when killed by signal N), else None."""
        if self.status is None:
            pid, raw = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(raw)
        return self.status

    def _reaped(self, raw: int) -> None:
        self.status = os.waitstatus_to_exitcode(raw)
        if self.status < 0:
            self.status = 128 - self.status
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait(self) -> int:
        while self.poll() is None:
            try:
                _, raw = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.status = self.status if self.status is not None else 1
                break
            self._reaped(raw)
        return self.status

    def signal(self, signum: int) -> None:
        """Send `signum` to the child while it is ours: never once it was reaped (its pid may
        be another process's by then), and through its pidfd where the kernel has them."""
        if self.status is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            else:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


def _pidfd_of(pid: int) -> int | None:
    """A pidfd of our own unreaped child `pid`; None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 64)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _child(command, path, run_as, gate_r, err_w):  # pragma: no cover - runs in the child
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        env = own_env.for_commands(os.environ, run_as)  # the environment memprof was given, not its own tuning
        if run_as is not None:
            os.setgroups(run_as.groups)
            os.setgid(run_as.gid)
            os.setuid(run_as.uid)
        gate = _read_all(gate_r)
        if not gate.startswith(b"g"):
            os._exit(1)  # parent gone before releasing us: never run the command
        env.update(json.loads(gate[1:] or b"{}"))
        for fd in stdio.CLOSED:  # closed for memprof too: /dev/null there since (stdio.reserve)
            os.close(fd)
        os.execve(path, command, env)
    except OSError as e:
        os.write(err_w, str(e.errno or errno.EIO).encode())
    os._exit(127)
