"""`sudo .venv/bin/memprof …` where sudo keeps the user's HOME (env_keep+=HOME; older sudoers
did by default): the per-user site folder is then the user's ~/.local/lib/python3.X/
site-packages, and a .pth file there would run as root when Python starts, before memprof's
first line. The launcher `make setup` leaves, like `make install`'s wrapper, starts Python
isolated (-I). Played with a real user's .pth file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / ".venv" / "bin" / "memprof"


def test_a_pth_file_in_the_users_site_folder_does_not_run_as_root(make_user, tmp_path):
    user = make_user()
    marker = tmp_path / "pth-ran-as"
    site = user.home / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    user.run(["mkdir", "-p", str(site)])
    user.write(site / "zz_memprof_test.pth", f"import os; open({str(marker)!r}, 'a').write(str(os.getuid()))\n")
    env = user.sudo_env({"PATH": os.environ["PATH"], "HOME": str(user.home)})
    env.pop("PYTHONPATH")
    result = subprocess.run([LAUNCHER, "--version"], env=env, cwd=user.home, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"the user's .pth ran as uid {marker.read_text()}"
    # the same file runs where the folder is on (no -I): what the test would catch
    subprocess.run([REPO / ".venv" / "bin" / "python", "-c", "pass"], env=env, cwd=user.home, timeout=60)
    assert marker.read_text() == "0"
