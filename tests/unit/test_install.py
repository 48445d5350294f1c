"""`make install` (scripts/install.sh): a `memprof` on root's PATH that runs the venv's
memprof, safe to run as root (issue 20, point 3; docs/SECURITY.md)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="make install runs as root (it chowns to root)")


def _install(script: Path, bindir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), str(bindir)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def wrapper() -> Path:
    """The wrapper, installed in a folder of its own that everyone may read (as /usr/local/bin)."""
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv: make setup first")
    top = Path(tempfile.mkdtemp(prefix="memprof-install-"))
    top.chmod(0o755)
    result = _install(INSTALL, top / "bin")
    assert result.returncode == 0, result.stderr
    yield top / "bin" / "memprof"
    shutil.rmtree(top)


def test_the_wrapper_is_roots_and_runs_the_venvs_memprof_isolated(wrapper):
    st = wrapper.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)
    text = wrapper.read_text()
    assert f"exec '{REPO.resolve()}/.venv/bin/python' -I -m memprof \"$@\"" in text
    result = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, timeout=60, cwd="/")
    assert (result.returncode, result.stdout.strip()) == (0, "memprof, version " + _version())


def test_no_environment_or_folder_of_the_caller_puts_code_into_roots_process(wrapper, tmp_path):
    """What a user under `sudo -E`, or root in a user's folder, might have: a PYTHONPATH and a
    current folder holding a sitecustomize and a `memprof` package. None of it runs."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil"
    (evil / "memprof").mkdir(parents=True)
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("sitecustomize.py", "usercustomize.py", "memprof/__init__.py", "memprof/__main__.py", "click.py"):
        (evil / name).write_text(payload)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(evil), "PYTHONSTARTUP": str(evil / "sitecustomize.py"),
           "PYTHONHOME": str(evil), "HOME": str(evil)}
    result = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, timeout=60, cwd=evil, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("memprof, version")
    assert not marker.exists(), marker.read_text()


def test_an_unprivileged_user_can_run_it(wrapper):
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", str(wrapper),
                             "--version"], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr


def test_install_refuses_a_checkout_others_can_write(tmp_path):
    """A file of the checkout that another user could change would be code root runs."""
    fake = tmp_path / "checkout"
    (fake / "scripts").mkdir(parents=True)
    shutil.copy(INSTALL, fake / "scripts" / "install.sh")
    for part in ("memprof", "cli", "bpf", ".venv/bin"):
        (fake / part).mkdir(parents=True)
    (fake / ".venv/bin/python").write_text("#!/bin/sh\n")
    (fake / ".venv/bin/python").chmod(0o755)
    writable = fake / "cli" / "main.py"
    writable.write_text("")
    writable.chmod(0o666)
    bindir = tmp_path / "bin"
    result = _install(fake / "scripts" / "install.sh", bindir)
    assert result.returncode == 1
    assert f"{fake}/cli/main.py is not root's alone" in result.stderr
    assert not (bindir / "memprof").exists()
    writable.chmod(0o644)
    os.chown(fake / "bpf", 65534, 65534)  # a folder of another user: they could add files
    result = _install(fake / "scripts" / "install.sh", bindir)
    assert result.returncode == 1 and f"{fake}/bpf is not root's alone" in result.stderr
    os.chown(fake / "bpf", 0, 0)
    assert _install(fake / "scripts" / "install.sh", bindir).returncode == 0
    assert (bindir / "memprof").read_text().count(f"'{fake}/.venv/bin/python' -I -m memprof") == 1


def _version() -> str:
    from memprof import __version__
    return __version__


def test_every_package_of_the_tree_is_in_setup_cfg():
    """A package left out of setup.cfg's explicit list is missing from the wheel: the
    installed memprof then fails where it imports it (the advice package did, in CI)."""
    import configparser
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    found = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "memprof").rglob("__init__.py")
             if "__pycache__" not in init.parts}
    found |= {"memprof.cli"} if (REPO / "cli" / "__init__.py").exists() else set()
    assert found - listed == set()
