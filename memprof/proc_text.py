"""/proc files as text, whatever bytes the processes put in them. Imports nothing heavy:
the privilege checks at start-up read /proc/self/status through it."""
from __future__ import annotations

import os
import time


def proc_text(path: str) -> str:
    """A /proc file's text (OSError as open() raises). The names in it (a process's comm,
    which its executable's name or prctl sets; a file's path) are bytes the process chose,
    which need not be UTF-8: such bytes read as "\\xff" escapes, never as an error (a
    strict read stopped the root recorder, and left the command running)."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "backslashreplace")


def process_began_monotonic() -> float | None:
    """When this process began, on time.monotonic()'s clock, in seconds (to the kernel's clock
    tick, 10 ms here: /proc/self/stat's starttime); None where /proc does not say."""
    try:
        fields = proc_text("/proc/self/stat").rsplit(")", 1)[1].split()
        began_ticks = int(fields[19])  # starttime, field 22 of proc(5); fields[0] is field 3
    except (OSError, ValueError, IndexError):
        return None
    age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - began_ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age_s


def own_peak_rss_bytes() -> int | None:
    """This process's peak resident size (VmHWM: all its threads; not its children), in bytes;
    None where /proc does not say."""
    try:
        for line in proc_text("/proc/self/status").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # "VmHWM:   257820 kB"
    except (OSError, ValueError, IndexError):
        return None
    return None
