"""Integration tests: real eBPF as root, real processes (DESIGN.md §6).

Every test here is skipped, with the reason, unless this machine can record: euid 0, bcc
importable, kmem tracepoints in tracefs. The known workloads (examples/bin/) are built once
per session if missing; the tests are skipped if that build fails.

Helpers (as fixtures, so test modules need not import this file):
  run_memprof(*args, cwd, timeout=60, **popen_kw) -> CompletedProcess (text)
  leaks_json(path, *args) -> the parsed JSON of `memprof report leaks PATH --format json ARGS`
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EXAMPLE_PROGRAMS = ("kernel_leak", "kernel_churn")


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return f"not root (euid {os.geteuid()}): recording loads eBPF programs; run pytest with sudo"
    try:
        import bcc  # noqa: F401
    except Exception as e:  # ImportError, or libbcc failing to load
        return f"bcc is not importable ({type(e).__name__}: {e}); apt-get install python3-bpfcc"
    from memprof.sources.ebpf.kmem import tracefs_root
    if tracefs_root() is None:
        return "no kmem tracepoints: tracefs with events/kmem is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
    return None


_MISSING = _missing_prerequisite()


def pytest_collection_modifyitems(config, items):
    """Without the prerequisites, every test here is skipped with the reason. (Not
    pytest.skip(allow_module_level=True) at import: pytest does not handle that in a conftest
    it loads at start-up, as for `pytest tests/integration`.)"""
    if not _MISSING:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"integration tests need real eBPF: {_MISSING}")
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def examples_bin() -> Path:
    """examples/bin/, built with `make -C examples` when a program is missing."""
    bin_dir = EXAMPLES / "bin"
    if not all((bin_dir / p).is_file() for p in EXAMPLE_PROGRAMS):
        try:
            made = subprocess.run(["make", "-C", str(EXAMPLES)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot build the example workloads (make -C examples): {e}")
        if made.returncode != 0 or not all((bin_dir / p).is_file() for p in EXAMPLE_PROGRAMS):
            pytest.skip(f"cannot build the example workloads (make -C examples, exit {made.returncode}): "
                        f"{(made.stderr or made.stdout).strip()[-500:]}")
    return bin_dir


def run_memprof(*args, cwd, timeout=60, **popen_kw) -> subprocess.CompletedProcess:
    """`python -m memprof ARGS` in `cwd`; text output captured. memprof runs in its own
    session, so on timeout it and the command it records are killed together."""
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    popen_kw.setdefault("start_new_session", True)
    cmd = [sys.executable, "-m", "memprof", *map(str, args)]
    with subprocess.Popen(cmd, cwd=cwd, text=True, **popen_kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            if popen_kw["start_new_session"]:
                os.killpg(proc.pid, signal.SIGKILL)  # memprof's own process group: it and its target
            else:
                proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"memprof {' '.join(cmd[3:])} ran past {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def record_and_act(args: list, cwd, act: Callable[[subprocess.Popen, str], None],
                   timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m memprof record ARGS` whose command prints one line first: once that line
    (passed to `act`, with memprof's process) is out, `act` signals or stops memprof; then
    memprof is waited for. On any failure memprof's session is killed, command and all."""
    cmd = [sys.executable, "-m", "memprof", "record", *map(str, args)]
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as memprof:
        try:
            act(memprof, memprof.stdout.readline())
            out, err = memprof.communicate(timeout=timeout)
        finally:
            if memprof.poll() is None:
                os.killpg(memprof.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, memprof.returncode, out, err)


def leaks_json(path, *args, timeout=180) -> dict:
    """Parsed JSON of `memprof report leaks PATH --format json ARGS` (which must exit 0)."""
    path = Path(path)
    result = run_memprof("report", "leaks", path, "--format", "json", *args, cwd=path.parent, timeout=timeout)
    assert result.returncode == 0, f"report leaks exited {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def start_when(target: subprocess.Popen, ready: Callable[[], bool], timeout_s: float = 60) -> threading.Thread:
    """Send `target` (started with stdin=PIPE, waiting for a line) its start line once
    `ready()` is true, e.g. once `record --pid` has created its recording, which it does after
    its probes are attached. An attach test then does not depend on how long the recorder
    takes to start: CI once saw it miss the first 10 of 29 pipes after a fixed 3 s wait.
    The caller joins the thread returned."""
    def wait_then_start():
        deadline = time.monotonic() + timeout_s
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            target.stdin.write("start\n")
            target.stdin.flush()
        except (BrokenPipeError, ValueError):  # the target is gone already: the test reports it
            pass

    thread = threading.Thread(target=wait_then_start, daemon=True)
    thread.start()
    return thread


@dataclass
class AttachedRun:
    """A target recorded by `record --pid` (record_attached)."""

    pid: int
    first_line: str                          # what the target printed before it waited
    result: subprocess.CompletedProcess      # memprof record --pid
    exit_status: int | None                  # the target's; None: it had to be killed
    output: str                              # what the target printed after its first line
    seconds: float                           # from its first line to memprof's exit


def record_attached(argv: list, recording: Path, ready: Callable[[Path, int], bool] | None = None,
                    timeout: float = 90) -> AttachedRun:
    """Start `argv`, which prints one line and then waits for a line on stdin before its work;
    `record --pid` it until it exits. The start line is sent once `ready(recording, pid)` is
    true (default: the recording exists, so the eBPF probes are attached)."""
    ready = ready or (lambda path, pid: path.exists())
    target = subprocess.Popen(list(map(str, argv)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first_line = target.stdout.readline().strip()
        started = time.monotonic()
        starter = start_when(target, lambda: ready(recording, target.pid))
        result = run_memprof("record", "-q", "-o", recording, "--pid", target.pid, cwd=recording.parent,
                             timeout=timeout)
        seconds = time.monotonic() - started
        starter.join(timeout=5)
        try:
            exit_status = target.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exit_status = None
        output = target.stdout.read() if exit_status is not None else ""
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        target.stdout.close()
        target.stdin.close()
    return AttachedRun(target.pid, first_line, result, exit_status, output, seconds)


@pytest.fixture(name="record_attached", scope="session")
def _record_attached_fixture():
    return record_attached


@pytest.fixture(name="run_memprof", scope="session")
def _run_memprof_fixture():
    return run_memprof


@pytest.fixture(name="record_and_act", scope="session")
def _record_and_act_fixture():
    return record_and_act


@pytest.fixture(name="leaks_json", scope="session")
def _leaks_json_fixture():
    return leaks_json
