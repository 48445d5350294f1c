"""A process's names are bytes it chose: its comm (its executable's name, or prctl), its
executable's path. The root recorder reads them from /proc as text it can store and print,
whatever the bytes: a strict UTF-8 read once stopped `record`, leaving the command running."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from memprof.capture.may_record import effective_capabilities
from memprof.sources.agent_reader.attach import read_target
from memprof.sources.symbols.procs import pid_alive, process_uids, read_comm, read_exe

NAMED = "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'c\\xff\\xfeomm', 0, 0, 0); print(1, flush=True); time.sleep(30)"


@pytest.fixture
def renamed():
    """A process whose comm is b"c\\xff\\xfeomm" (prctl PR_SET_NAME)."""
    with subprocess.Popen([sys.executable, "-c", NAMED], stdout=subprocess.PIPE) as proc:
        proc.stdout.readline()
        yield proc
        proc.kill()


def test_a_comm_that_is_not_utf8_reads_escaped_and_the_process_is_seen(renamed):
    assert read_comm(renamed.pid) == "c\\xff\\xfeomm"
    assert pid_alive(renamed.pid)
    assert process_uids(renamed.pid) == (os.getuid(),) * 3
    assert read_target(renamed.pid).pid == renamed.pid
    assert effective_capabilities(f"/proc/{renamed.pid}/status") == effective_capabilities()


def test_an_executable_path_that_is_not_utf8_reads_escaped(tmp_path):
    program = os.fsencode(tmp_path) + b"/\xffsleep"
    shutil.copy("/bin/sleep", program)
    with subprocess.Popen([program, "30"]) as proc:
        try:
            assert read_exe(proc.pid) == f"{tmp_path}/\\xffsleep"
            assert read_comm(proc.pid) == "\\xffsleep"
        finally:
            proc.kill()


# -- what a process knows of itself (proc_text.py): when it began, its peak size --

def test_a_process_knows_when_it_began():
    script = ("import time; now = time.monotonic(); from memprof.proc_text import process_began_monotonic as b; "
              "print(now - b())")
    age = float(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    assert 0.0 < age < 2.0  # the interpreter's start, to the kernel's 10 ms tick


def test_a_process_knows_its_own_peak_size():
    """meta.json's recorder_peak_rss_bytes: VmHWM of the process that reads it. In a process of
    its own: this one's peak may be anything the tests before it reached."""
    script = ("from memprof.proc_text import own_peak_rss_bytes as peak; before = peak(); "
              "block = bytearray(64 << 20); block[::4096] = b'\\1' * len(block[::4096]); print(before, peak())")
    before, after = map(int, subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                            check=True).stdout.split())
    assert 5 << 20 < before and after - before >= 60 << 20
