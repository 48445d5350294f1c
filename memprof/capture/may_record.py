"""Who may record: root, or a process with CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)."""
from __future__ import annotations

import os

from memprof.errors import NoPrivilegeError
from memprof.proc_text import proc_text

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def effective_capabilities(status_path: str = "/proc/self/status") -> int:
    try:
        for line in proc_text(status_path).splitlines():  # its Name: is any bytes
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def can_record() -> bool:
    if os.geteuid() == 0:
        return True
    caps = effective_capabilities()
    has = lambda cap: bool(caps >> cap & 1)  # noqa: E731
    return has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))


def require_recording_privileges() -> None:
    if not can_record():
        raise NoPrivilegeError(
            "recording needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs",
            "run it with sudo: `sudo memprof record …`; `memprof doctor` checks every requirement",
        )
