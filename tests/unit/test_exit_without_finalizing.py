"""cli/main.py ends `record` without the interpreter's finalization: the exit status must be
sys.exit's, and what was printed must still come out (buffered stdout to a pipe included)."""
from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
from memprof.cli.main import _exit_without_finalizing
atexit.register(lambda: print("finalized", file=sys.stderr))
print("printed before", end="")
_exit_without_finalizing({code})
"""


@pytest.mark.parametrize("code, status, stderr", [(None, 0, ""), (0, 0, ""), (3, 3, ""), (130, 130, ""),
                                                  ("'no recording'", 1, "no recording\n")])
def test_the_status_is_sys_exits_output_is_flushed_and_nothing_finalizes(code, status, stderr):
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(code=code)], capture_output=True, text=True, timeout=60)
    assert result.returncode == status
    assert result.stdout == "printed before"
    assert result.stderr == stderr  # no "finalized": atexit never ran


def test_only_record_leaves_that_way():
    from memprof.cli.main import EXIT_WITHOUT_FINALIZING, _command_name
    assert EXIT_WITHOUT_FINALIZING == {"record"}
    assert _command_name(["-q", "record", "--", "report"]) == "record"
    assert _command_name(["report", "leaks"]) == "report"
