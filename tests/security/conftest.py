"""Security tests: memprof as root on behalf of real, unprivileged users (docs/SECURITY.md).

Each test plays an attack the way a hostile local user would, with real users this file
creates (useradd) and removes, and asserts that nothing outside the recording was created,
modified, deleted, chowned or signalled, and that the recording itself is intact.

Fixtures:
  make_user()             -> User: a fresh unprivileged user with a home folder; removed
                             (with its processes and home) when the test ends
  canaries                -> Canaries: root-only files and a root-only tree that an attack
                             tries to reach; `.assert_untouched()` checks them byte for byte
  memprof_as_root(user, *args, cwd, timeout=60, env=None)
                          -> CompletedProcess of `python -m memprof ARGS` as root with
                             SUDO_UID/SUDO_GID/SUDO_USER naming `user`, as sudo would set them
Tests that load eBPF are skipped, with the reason, where this machine cannot record.
"""
from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import _missing_prerequisite

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="security tests create users and act as root")
needs_ebpf_reason = _missing_prerequisite()


@dataclass
class User:
    """A real local user made for one test."""

    name: str
    uid: int
    gid: int
    home: Path

    def sudo_env(self, base: dict | None = None) -> dict:
        """The environment `sudo` gives root for this user (sudo is not installed here)."""
        env = dict(os.environ if base is None else base)
        env.update(SUDO_UID=str(self.uid), SUDO_GID=str(self.gid), SUDO_USER=self.name)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def argv(self, argv: list) -> list[str]:
        """`argv` run as this user (setpriv: uid, gid and groups, no capabilities kept)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *map(str, argv)]

    def run(self, argv: list, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        kw.setdefault("cwd", self.home)
        return subprocess.run(self.argv(argv), **kw)

    def popen(self, argv: list, **kw) -> subprocess.Popen:
        kw.setdefault("cwd", self.home)
        return subprocess.Popen(self.argv(argv), **kw)

    def report_leaks(self, recording: Path, timeout: float = 300) -> dict:
        """`memprof report leaks --format json` of `recording`, run as this user (the
        recording must open for its owner): the parsed JSON; fails the test unless exit 0."""
        result = self.run([sys.executable, "-m", "memprof", "report", "leaks", str(recording), "--format", "json"],
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}, timeout=timeout)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def write(self, path: Path, text: str) -> Path:
        """A file created as this user (so the user owns it, as if they had written it)."""
        result = self.run(["sh", "-c", 'cat > "$1"', "sh", str(path)], input=text)
        assert result.returncode == 0, result.stderr
        return Path(path)


def _remove_user(name: str) -> None:
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


@pytest.fixture
def make_user():
    """Factory of fresh users; each is removed with its processes and home at the end."""
    if os.geteuid() != 0:
        pytest.skip("security tests create users: run them as root")
    base = Path(tempfile.mkdtemp(prefix="memprof-sec-home-"))
    os.chmod(base, 0o755)
    made: list[str] = []

    def make() -> User:
        name = f"mpsec{secrets.token_hex(3)}"
        subprocess.run(["useradd", "-m", "-b", str(base), "-s", "/bin/sh", "-U", name], check=True,
                       capture_output=True)
        made.append(name)
        entry = pwd.getpwnam(name)
        return User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))

    yield make
    for name in made:
        _remove_user(name)
    shutil.rmtree(base, ignore_errors=True)


@dataclass
class Canaries:
    """Root-only targets an attack points its links at. `root` is a root-only folder
    (0700) holding `script` (a root-only executable), `tree/` (a copy of a config folder
    with a secret), and `absent` (a name that must never come to exist)."""

    root: Path
    state: dict = field(default_factory=dict)

    @property
    def script(self) -> Path:
        return self.root / "script.sh"

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def absent(self) -> Path:
        return self.root / "absent"

    def snapshot(self) -> dict:
        found = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in [*dirnames, *filenames, ""]:
                path = os.path.join(dirpath, name) if name else dirpath
                info = os.lstat(path)
                content = Path(path).read_bytes() if stat.S_ISREG(info.st_mode) else None
                found[path] = (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), info.st_mtime_ns, content)
        return found

    def assert_untouched(self) -> None:
        assert self.snapshot() == self.state, "a root-only file or folder was created, changed, chowned or removed"
        assert not self.absent.exists()


@pytest.fixture
def canaries() -> Canaries:
    root = Path(tempfile.mkdtemp(prefix="memprof-sec-canary-"))
    os.chmod(root, 0o755)  # others may name paths in it (as in /etc), not write there
    (root / "script.sh").write_text("#!/bin/sh\necho root-only\n")
    os.chmod(root / "script.sh", 0o700)
    tree = root / "tree"
    (tree / "ssh").mkdir(parents=True)
    (tree / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (tree / "shadow").write_text("root:secret:1::::::\n")
    os.chmod(tree / "shadow", 0o600)
    (tree / "ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    os.chmod(tree / "ssh" / "id_ed25519", 0o600)
    c = Canaries(root)
    c.state = c.snapshot()
    yield c
    shutil.rmtree(root, ignore_errors=True)


def memprof_as_root(user: User, *args, cwd, timeout: float = 90, env: dict | None = None,
                    **popen_kw) -> subprocess.CompletedProcess:
    """`python -m memprof ARGS` as root, as `sudo -u root` by `user` would run it. memprof
    runs in its own session, so on timeout it and what it started are killed together."""
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    # -P: `python -m` would put the current folder (the user's) first on root's sys.path,
    # where the user could plant a module; the installed `memprof` command has no such entry.
    cmd = [sys.executable, "-P", "-m", "memprof", *map(str, args)]
    with subprocess.Popen(cmd, cwd=cwd, text=True, env=env or user.sudo_env(), start_new_session=True,
                          **popen_kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"memprof {' '.join(map(str, args))} ran past {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(name="memprof_as_root", scope="session")
def _memprof_as_root_fixture():
    return memprof_as_root


def pytest_collection_modifyitems(config, items):
    """Tests marked `ebpf` are skipped, with the reason, where this machine cannot record."""
    if not needs_ebpf_reason:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"this security test records with real eBPF: {needs_ebpf_reason}")
    for item in items:
        if here in item.path.parents and item.get_closest_marker("ebpf"):
            item.add_marker(skip)
