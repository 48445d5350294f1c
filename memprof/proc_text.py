"""/proc files as text, whatever bytes the processes put in them. Imports nothing heavy:
the privilege checks at start-up read /proc/self/status through it."""
from __future__ import annotations


def proc_text(path: str) -> str:
    """A /proc file's text (OSError as open() raises). The names in it (a process's comm,
    which its executable's name or prctl sets; a file's path) are bytes the process chose,
    which need not be UTF-8: such bytes read as "\\xff" escapes, never as an error (a
    strict read stopped the root recorder, and left the command running)."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "backslashreplace")
