"""After `record` returns, its BPF programs go away: the forked holder that makes the perf
events' last closes (memprof/sources/ebpf/probe_holder.py) lets go of everything within
seconds, and nothing of memprof's stays loaded in the kernel. Read from the kernel itself:
every loaded program's name (bpf(BPF_PROG_GET_NEXT_ID), BPF_PROG_GET_FD_BY_ID,
BPF_OBJ_GET_INFO_BY_FD)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from memprof.sources.ebpf.bpfinfo import loaded_program_ids, program_info

pytestmark = pytest.mark.integration

# memprof's programs: its own functions, and bcc's names for the RAW_TRACEPOINT_PROBE
# functions it auto-attaches (cut to 15 characters by the kernel), and TRACEPOINT_PROBE's,
# which memprof no longer has but an older memprof running beside would.
OURS = (b"mp_", b"tracepoint__", b"raw_tracepoint_")


def loaded_program_names() -> list[bytes]:
    """The names of every BPF program loaded in the kernel now."""
    infos = (program_info(prog_id) for prog_id in loaded_program_ids())
    return [info.name for info in infos if info is not None]


def ours_loaded() -> list[bytes]:
    return [name for name in loaded_program_names() if name.startswith(OURS)]


def wait_until_none_of_ours(seconds: float) -> list[bytes]:
    """memprof's programs still loaded after waiting up to `seconds` for none."""
    deadline = time.monotonic() + seconds
    while (left := ours_loaded()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_no_program_of_memprofs_stays_loaded_after_record_returns(tmp_path):
    assert wait_until_none_of_ours(10) == [], "programs of an earlier recording (or another memprof) still loaded"
    # A Python command, so that uprobes (Py_FinalizeEx) are among the process probes; it
    # sleeps so that the programs are seen loaded while it runs (the listing works).
    cmd = [sys.executable, "-m", "memprof", "record", "-q", "-o", tmp_path / "r.memprof", "--",
           sys.executable, "-c", "import time; time.sleep(4)"]
    with subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            deadline, seen = time.monotonic() + 60, set()
            while b"mp_kmalloc" not in seen and proc.poll() is None and time.monotonic() < deadline:
                seen.update(ours_loaded())
                time.sleep(0.05)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert b"mp_kmalloc" in seen and any(name.startswith(b"raw_tracepoint_") for name in seen), seen
    # The holder's closes wait out RCU grace periods, 60-110 ms each, serialized: ~0.5 s.
    assert wait_until_none_of_ours(10) == []
