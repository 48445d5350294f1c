"""Loading memprof's BPF programs through bcc, with typed errors: bcc raises a bare
Exception whether the kernel refused a program or a uprobe's symbol is missing, and the
two need different remedies."""
from __future__ import annotations

import errno
import os
import sys
import tempfile

from memprof.errors import SourceUnavailableError

# bcc raises a bare Exception when the kernel refuses a program, naming the errno's text.
_LOAD_FAILED = "Failed to load BPF program"
# The verifier gives up with EAGAIN when a signal is pending for the loading thread (libbpf
# has already retried 5 times): something keeps stopping memprof while it starts.
_INTERRUPTED = os.strerror(errno.EAGAIN)


def is_load_failure(error: Exception) -> bool:
    """Whether bcc's `error` is the kernel refusing a program (not, say, a missing symbol)."""
    return str(error).startswith(_LOAD_FAILED)


def load_failure(error: Exception) -> SourceUnavailableError:
    """The typed error for a program the kernel would not load, with the remedy that fits."""
    if _INTERRUPTED in str(error):
        return SourceUnavailableError(
            f"the kernel kept interrupting the check of memprof's eBPF programs ({error})",
            "something stops memprof while it starts (a debugger, or py-spy without --nonblocking): "
            "start memprof without it, and attach that tool once the recording has begun")
    return SourceUnavailableError(f"the kernel refused memprof's eBPF programs ({error})", "run `memprof doctor`")


def load_program(bpf, name: str, kind: int, show_log: bool = True):
    """bcc's load_func; a program the kernel will not load raises SourceUnavailableError.
    When a load fails bcc prints the verifier's log to fd 2: it reaches the terminal for a
    refusal (it says why), not for an interrupted check (the part of a check cut short), and
    never with `show_log` False (a caller that leaves the refusal to a later load of the same
    program, which shows it)."""
    with captured_stderr() as log:
        try:
            return bpf.load_func(name, kind)
        except Exception as e:  # bcc raises bare Exception
            failure = e
    if not is_load_failure(failure):
        raise failure
    if show_log and _INTERRUPTED not in str(failure):
        sys.stderr.write(log.text())
    raise load_failure(failure) from failure


class captured_stderr:
    """bcc writes to fd 2 itself: clang's diagnostics (header warnings on every compile) and
    the verifier's log of a refused program. Keep them off the user's terminal; the caller
    decides what to show (`text()`)."""

    def __enter__(self):
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        with self._file:
            self._file.seek(0)
            self._text = self._file.read().decode(errors="replace")
        return False

    def text(self) -> str:
        """What was written to fd 2 inside the block (after it has ended)."""
        return self._text
