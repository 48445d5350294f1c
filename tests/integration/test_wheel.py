"""The wheel, installed into a fresh virtual environment, records: the BPF C sources ship as
package data and compile from the installed package, not from the checkout.

Slow (a wheel build in an isolated environment, then an install of the dependencies from
PyPI or pip's cache): a few minutes at worst. Skipped if PyPI cannot be reached and the
build or install fails for it. The wheel is built from a copy of the working tree's files, so
that no stale build/ output of the checkout gets into it, and none is left behind.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"  # has bcc (python3-bpfcc) in its site-packages


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/click/", timeout=15) as response:
            return response.status == 200
    except OSError:
        return False


def _run(cmd, *, cwd, env, timeout, what, needs_pypi=False) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} ran past {timeout}s: {e.stderr}")
    if result.returncode != 0 and needs_pypi and not _pypi_reachable():
        pytest.skip(f"cannot {what} and PyPI is unreachable: {result.stderr.strip()[-300:]}")
    return result


def _source_tree(dest: Path) -> Path:
    """A copy of the working tree's files (tracked, and untracked but not ignored): the build
    neither sees stale build/ or *.egg-info output nor leaves any in the checkout."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot list the working tree's files with git: {e}")
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # not deleted in the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_installed_wheel_records(tmp_path):
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} (the system Python with bcc) is missing")
    # Nothing of the checkout on the path: the installed package alone must do.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "build", "--wheel", "--outdir", dist], cwd=_source_tree(tmp_path / "src"),
                 env=env, timeout=600,
                 what="build the wheel", needs_pypi=True)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheels = list(dist.glob("memprof-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp_path / "venv"
    made = _run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv], cwd=tmp_path, env=env, timeout=120,
                what="create the virtual environment")
    assert made.returncode == 0, made.stderr
    installed = _run([venv / "bin" / "python", "-m", "pip", "install", wheels[0]], cwd=tmp_path, env=env,
                     timeout=600, what="pip install the wheel", needs_pypi=True)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]

    elsewhere = tmp_path / "elsewhere"  # outside the repository
    elsewhere.mkdir()
    doctor = _run([venv / "bin" / "memprof", "doctor"], cwd=elsewhere, env=env, timeout=60, what="run doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    located = _run([venv / "bin" / "python", "-c",
                    "import json, memprof; from memprof.sources.ebpf.loading import bpf_source_dir; "
                    "print(json.dumps([memprof.__file__, bpf_source_dir()]))"],
                   cwd=elsewhere, env=env, timeout=60, what="locate the package")
    assert located.returncode == 0, located.stderr
    package_file, bpf_dir = (Path(p).resolve() for p in json.loads(located.stdout))
    assert venv.resolve() in package_file.parents, package_file
    assert venv.resolve() in bpf_dir.parents, bpf_dir
    assert (bpf_dir / "kmem.bpf.c").is_file() and (bpf_dir / "memprof.h").is_file(), sorted(os.listdir(bpf_dir))

    recording = elsewhere / "true.memprof"
    recorded = _run([venv / "bin" / "memprof", "record", "-q", "-o", recording, "--", "true"], cwd=elsewhere,
                    env=env, timeout=120, what="record with the installed package")
    assert recorded.returncode == 0, recorded.stderr
    meta = json.loads((recording / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["exit_status"] == 0
