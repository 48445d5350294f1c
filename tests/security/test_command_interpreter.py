"""`sudo memprof record -- PYTHON …` asks the command's interpreter where its site-packages are
(to probe its torch before the command starts). That interpreter is a file the user chose,
often in their own virtual environment: root must never run it (docs/SECURITY.md). Played with
a real user whose "python" notes who ran it. (That the query imports nothing from the working
folder, which `python -c` puts first on its path: tests/unit/test_known_libraries.py.)"""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.ebpf

# A user's "python": notes the uid it runs as, then is the real interpreter.
NOTING_PYTHON = """#!/bin/sh
id -u >> {notes}
exec {python} "$@"
"""


def test_the_users_interpreter_runs_as_the_user_never_as_root(make_user, memprof_as_root):
    user = make_user()
    notes = user.home / "ran-as"
    script = NOTING_PYTHON.format(notes=notes, python=os.path.realpath(sys.executable))
    python = user.write(user.home / "python3", script)
    user.run(["chmod", "755", str(python)])
    user.write(notes, "")
    recording = user.home / "r.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", python, "-c", "pass", cwd=user.home)
    assert result.returncode == 0, result.stderr
    runs = notes.read_text().split()
    # the site-packages query, then the command itself: both as the user
    assert len(runs) == 2 and set(runs) == {str(user.uid)}, runs



def test_the_interpreter_a_users_script_names_runs_as_the_user_never_as_root(make_user, memprof_as_root):
    """A console script (torchrun's kind): memprof reads its #! line and asks the Python named
    there, which is as much the user's file as the script."""
    user = make_user()
    notes = user.home / "ran-as"
    python = user.write(user.home / "python3",
                        NOTING_PYTHON.format(notes=notes, python=os.path.realpath(sys.executable)))
    tool = user.write(user.home / "tool", f"#!{python}\nprint('tool ran')\n")
    user.run(["chmod", "755", str(python), str(tool)])
    user.write(notes, "")
    recording = user.home / "r.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", tool, cwd=user.home)
    assert result.returncode == 0, result.stderr
    assert "tool ran" in result.stdout
    runs = notes.read_text().split()
    # the site-packages query (new: it was skipped for a script), then the script itself
    assert len(runs) == 2 and set(runs) == {str(user.uid)}, runs
