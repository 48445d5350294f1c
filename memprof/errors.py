"""Typed errors with a remedy. The library raises these; only the CLI turns them into
messages and exit codes (DESIGN.md §5)."""
from __future__ import annotations


class ExitCode:
    """Exit statuses of the `memprof` command (DESIGN.md §5)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NO_PRIVILEGE = 3
    SOURCE_UNAVAILABLE = 4
    BAD_RECORDING = 5
    CHECK_FAILED = 6
    INTERRUPTED = 130


class MemprofError(Exception):
    """Base of every error memprof reports to a user.

    `message` says what went wrong in one line; `hint` says what to do about it.
    """

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(MemprofError):
    """A command-line value that cannot be used (bad size, unknown source, …)."""

    exit_code = ExitCode.USAGE


class FoldedRecordingError(UsageError):
    """A report that needs every event, asked of a recording too large to analyse whole in
    the memory allowed (memprof.bounded folded it). `what`: the report or view refused, in
    words ("`report html`")."""

    def __init__(self, message: str, hint: str | None = None, what: str = ""):
        super().__init__(message, hint)
        self.what = what


class NoPrivilegeError(MemprofError):
    """Recording needs root (or CAP_BPF + CAP_PERFMON)."""

    exit_code = ExitCode.NO_PRIVILEGE


class SourceUnavailableError(MemprofError):
    """A capture source cannot run here (no bcc, no tracepoint, no headers, …)."""

    exit_code = ExitCode.SOURCE_UNAVAILABLE


class BadRecordingError(MemprofError):
    """A path that is not a readable recording of a format version we know."""

    exit_code = ExitCode.BAD_RECORDING


class TargetError(MemprofError):
    """The process to record cannot be started or attached to."""

    exit_code = ExitCode.ERROR


class BadInputError(BadRecordingError):
    """A file given to `memprof import` (a CUDA memory snapshot) that is unreadable, not of a
    format we know, or damaged. Exit status 5, as for a bad recording."""


class UnsafeInputError(BadInputError):
    """An input file that would run code when loaded (a pickle naming a global or object):
    refused before anything in it runs."""
