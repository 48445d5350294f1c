"""The README's usage block, run as written (issue 20: "a fresh clone's `make demo`, then the
README's commands as written, work end to end").

Every indented `memprof …` line under "## Using it" is run, in the README's order, in one
temporary folder, with the `memprof` that `make install` puts on the PATH (scripts/install.sh,
installed into a temporary folder first on PATH). The lines are not edited beyond what
follows; what they name is made first, so that they run as written:

- `sudo` is dropped: tests run as root (sudo is not installed here, and would run the same);
- `./train.sh` is a script in that folder that runs examples/bin/kernel_leak, the workload of
  `make demo` (257 pipes held amid churn);
- `--pid 4242`: 4242 becomes the pid of a `sleep` started just before, killed once the
  recording exists (its probes are attached then): the recording stops when the process
  exits, long before `--duration 60`;
- run.memprof, base.memprof and head.memprof: copies of the recording `record -- ./train.sh`
  made (the record lines come first in the README);
- snapshot.pickle and trace.json: tests/data's handbuilt_snapshot_leak.pickle and
  handbuilt_profiler_trace_cuda.json.

Each line must exit 0, or the status its comment documents ("exit 6"), and print no
traceback and no internal error. The outputs the lines name must exist.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
PLACEHOLDER_PID = "4242"


def usage_lines(readme: str) -> list[tuple[list[str], int]]:
    """(argv without sudo, expected exit status) of each indented `[sudo] memprof …` line of
    the README's "## Using it" section, in order; the status is 0 unless its comment says
    "exit N"."""
    section = readme.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for line in section.splitlines():
        if not re.match(r"    (sudo )?memprof ", line):
            continue
        command, _, comment = line.partition("#")
        argv = shlex.split(command)
        expected = re.search(r"\bexit (\d+)", comment)
        lines.append((argv[1:] if argv[0] == "sudo" else argv, int(expected.group(1)) if expected else 0))
    return lines


def test_usage_lines_are_found():
    """The extraction itself: it must not pass by finding nothing."""
    lines = usage_lines((REPO / "README.md").read_text())
    assert len(lines) >= 15
    assert lines[0] == (["memprof", "record", "--", "./train.sh"], 0)
    assert all(argv[0] == "memprof" for argv, _ in lines)
    assert ["record", "--pid"] == lines[1][0][1:3]
    assert lines[-3][1] == 6  # check: "CI gate: exit 6"


@pytest.fixture
def env(tmp_path) -> dict:
    """An environment whose PATH starts with a folder holding `make install`'s wrapper."""
    bindir = tmp_path / "bin"
    installed = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), str(bindir)], capture_output=True,
                               text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    path = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    assert shutil.which("memprof", path=path) == str(bindir / "memprof")
    return {**os.environ, "PATH": path}


@pytest.fixture
def folder(tmp_path, examples_bin) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    train = work / "train.sh"
    train.write_text(f"#!/bin/sh\nexec {shlex.quote(str(examples_bin / 'kernel_leak'))}\n")
    train.chmod(0o755)
    shutil.copy(DATA / "handbuilt_snapshot_leak.pickle", work / "snapshot.pickle")
    shutil.copy(DATA / "handbuilt_profiler_trace_cuda.json", work / "trace.json")
    return work


def test_readme_usage_block_runs_as_written(folder, env):
    started = time.monotonic()
    for argv, expected in usage_lines((REPO / "README.md").read_text()):
        if "record" not in argv and not (folder / "run.memprof").exists():
            _copy_first_recording(folder)
        result = _run_attached(argv, folder, env) if "--pid" in argv else _run(argv, folder, env)
        shown = " ".join(argv)
        assert result.returncode == expected, f"{shown}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr}"
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, f"{shown}\n{result.stderr}"
    for output in ("live.folded", "report.html", "run.memprof.pftrace", "snapshot.memprof/meta.json"):
        assert (folder / output).exists(), output  # live.folded may be empty: the demo frees all at exit
    assert (folder / "report.html").stat().st_size > 10_000 and (folder / "run.memprof.pftrace").stat().st_size > 1_000
    assert time.monotonic() - started < 300


def _run(argv: list[str], folder: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=180)


def _run_attached(argv: list[str], folder: Path, env: dict) -> subprocess.CompletedProcess:
    """`record --pid 4242 …` with 4242 a `sleep` of ours, killed once its recording exists."""
    target = subprocess.Popen(["sleep", "600"])
    try:
        argv = [str(target.pid) if word == PLACEHOLDER_PID else word for word in argv]
        recording = folder / f"memprof-sleep-{target.pid}.memprof"
        with subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as recorder:
            deadline = time.monotonic() + 120
            while not recording.exists() and recorder.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            target.send_signal(signal.SIGTERM)
            out, err = recorder.communicate(timeout=120)
        return subprocess.CompletedProcess(argv, recorder.returncode, out, err)
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()


def _copy_first_recording(folder: Path) -> None:
    """run.memprof, base.memprof and head.memprof: copies of what `record -- ./train.sh` wrote."""
    [made] = folder.glob("memprof-train.sh-*.memprof")
    for name in ("run.memprof", "base.memprof", "head.memprof"):
        shutil.copytree(made, folder / name)
    os.utime(folder / "head.memprof")
