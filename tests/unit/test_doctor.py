"""Issue 20, point 8: `memprof doctor` names the real cause (permission, not a missing
tracefs or kernel) and offers no fix for what is expected to be absent."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memprof import doctor
from memprof.sources.ebpf import kmem

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534


def _absent_tracepoints(monkeypatch):
    monkeypatch.setattr(kmem, "tracepoint_exists", lambda category, name: False)


def test_an_absent_node_tracepoint_is_expected_and_gets_no_fix(monkeypatch):
    _absent_tracepoints(monkeypatch)
    node = doctor._tracepoint_check("kmalloc_node")
    assert (node.ok, node.required, node.status, node.fix) == (False, False, "not needed", "")
    assert "merged into kmem:kmalloc" in node.detail
    batched = doctor._tracepoint_check("mm_page_free_batched")
    assert (batched.required, batched.fix) == (False, "")


def test_an_absent_needed_tracepoint_is_missing_with_a_fix(monkeypatch):
    _absent_tracepoints(monkeypatch)
    needed = doctor._tracepoint_check("kmalloc")
    assert (needed.ok, needed.required, needed.status) == (False, True, "MISSING")
    assert "CONFIG_TRACEPOINTS" in needed.fix


def test_mounted_tracefs_reads_the_mount_table(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n"
                      "nodev /sys/kernel/tracing tracefs rw,relatime 0 0\n"
                      "tracefs /elsewhere tracefs rw 0 0\n")
    assert doctor.mounted_tracefs(str(mounts)) == ["/sys/kernel/tracing"]
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert doctor.mounted_tracefs(str(mounts)) == []
    assert doctor.mounted_tracefs(str(tmp_path / "nothing")) == []


def test_tracefs_not_mounted_says_so_with_the_mount_fix(monkeypatch):
    monkeypatch.setattr(kmem, "tracefs_root", lambda: None)
    monkeypatch.setattr(doctor, "mounted_tracefs", lambda: [])
    check = doctor._tracefs_check()
    assert (check.ok, check.status, check.detail) == (False, "MISSING", "not mounted")
    assert check.fix.startswith("mount -t tracefs")


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/kernel/tracing/events/kmem")
                    or os.stat("/sys/kernel/tracing").st_mode & 0o005,
                    reason="needs root (to run doctor as nobody) and a tracefs that only root may read")
def test_unprivileged_doctor_blames_permission_not_the_kernel():
    """As a real unprivileged user, where tracefs is mounted but mode 0700 (the default)."""
    result = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         sys.executable, "-m", "memprof", "doctor"],
        capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": REPO,
                                                                    "COLUMNS": "250"})
    assert result.returncode == 4, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    assert "not mounted" not in result.stdout and "CONFIG_TRACEPOINTS" not in result.stdout
    assert "readable only by root" in rows["tracefs"] and "sudo memprof doctor" in rows["tracefs"]
    assert "unreadable" in rows["tracefs"]
    assert "unchecked" in rows["kmem tracepoints"]
    assert not [name for name in rows if name.startswith("tracepoint ")]


def test_interrupt_entries_say_whether_interrupts_of_user_code_are_told_apart(monkeypatch):
    monkeypatch.setattr(kmem, "read_interrupt_entry_text", lambda: (0xffffffff81000d40, 0xffffffff81000f70))
    found = doctor._interrupt_entry_check()
    assert (found.ok, found.required) == (True, False)
    assert "560 bytes of entry stubs at 0xffffffff81000d40" in found.detail
    monkeypatch.setattr(kmem, "read_interrupt_entry_text", lambda: (0, 0))
    missing = doctor._interrupt_entry_check()
    assert (missing.ok, missing.required, missing.status) == (False, False, "absent")
    assert "charged to it" in missing.detail and missing.fix


def test_the_nvidia_driver_check_says_whether_record_probes_libcuda(monkeypatch):
    from memprof import nvidia_driver
    monkeypatch.setattr(nvidia_driver, "present", lambda: False)
    none = doctor._nvidia_driver_check()
    assert (none.ok, none.required, none.status) == (False, False, "not loaded")
    assert none.detail == "none (/proc/driver/nvidia, /dev/nvidiactl, /dev/dxg): record's defaults leave cuda out"
    assert none.fix == "--sources +cuda probes libcuda anyway"
    monkeypatch.setattr(nvidia_driver, "present", lambda: True)
    loaded = doctor._nvidia_driver_check()
    assert (loaded.ok, loaded.status) == (True, "ok") and "probe libcuda" in loaded.detail
