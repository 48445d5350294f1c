"""`record` starts bcc's compile on a thread before the rest of memprof imports
(loading.start_compile), and the eBPF source takes its result (take_compiled): only when it
succeeded for the options as they are at start; otherwise compile_program compiles in the
foreground, which captures clang's words and explains a failure. bcc itself is stood in for:
these tests are about the hand-over, not the compiler."""
from __future__ import annotations

import threading

import pytest

from memprof.errors import SourceUnavailableError
from memprof.sources.ebpf import loading
from memprof.sources.ebpf.options import EbpfOptions

FLAGS = ["-I/bpf", "-DRINGBUF_PAGES=1"]


class FakeBPF:
    """bcc's BPF class: records its cflags; `fail` makes the compile raise as bcc does."""

    fail = False
    made: list["FakeBPF"] = []

    def __init__(self, text: str, cflags: list[str]):
        self.cflags = cflags
        self.cleaned = False
        self.thread = threading.current_thread().name
        FakeBPF.made.append(self)
        if FakeBPF.fail:
            raise Exception("Failed to compile BPF module <text>")

    def cleanup(self) -> None:
        self.cleaned = True


@pytest.fixture
def fake_bcc(monkeypatch):
    FakeBPF.fail, FakeBPF.made = False, []
    flags = list(FLAGS)
    monkeypatch.setattr(loading, "_bcc_inputs", lambda options, enabled: (FakeBPF, "text", list(flags)))
    monkeypatch.setattr(loading, "bpf_source_dir", lambda: "/bpf")
    monkeypatch.setattr(loading, "program_cflags", lambda options, enabled: list(flags[1:]))
    foreground = []
    monkeypatch.setattr(loading, "compile_program", lambda options, enabled: foreground.append(1) or "foreground")
    return flags, foreground


def enabled(family: str) -> bool:
    return True


def test_the_early_compile_runs_on_its_own_thread_with_warnings_off_and_is_taken(fake_bcc):
    _, foreground = fake_bcc
    compiling = loading.start_compile(EbpfOptions(), enabled)
    bpf = loading.take_compiled(compiling, EbpfOptions(), enabled)
    assert isinstance(bpf, FakeBPF) and not bpf.cleaned
    assert bpf.thread == "memprof-compile" and bpf.cflags == [*FLAGS, "-w"]
    assert foreground == []


def test_a_failed_early_compile_is_done_again_in_the_foreground(fake_bcc):
    _, foreground = fake_bcc
    FakeBPF.fail = True
    compiling = loading.start_compile(EbpfOptions(), enabled)
    assert loading.take_compiled(compiling, EbpfOptions(), enabled) == "foreground"
    assert foreground == [1]


def test_options_that_changed_since_the_start_get_their_own_program(fake_bcc):
    flags, foreground = fake_bcc
    compiling = loading.start_compile(EbpfOptions(), enabled)
    compiling.result.result()
    flags.append("-DNATIVE_SAMPLE_BYTES=0ULL")  # what the options ask for now
    assert loading.take_compiled(compiling, EbpfOptions(), enabled) == "foreground"
    assert FakeBPF.made[0].cleaned and foreground == [1]


def test_without_bcc_or_tracefs_nothing_starts_and_the_foreground_says_why(monkeypatch):
    def unavailable(options, enabled):
        raise SourceUnavailableError("tracefs is not mounted", "mount it")
    monkeypatch.setattr(loading, "_bcc_inputs", unavailable)
    assert loading.start_compile(EbpfOptions(), enabled) is None


def test_no_early_compile_is_a_foreground_compile(fake_bcc):
    _, foreground = fake_bcc
    assert loading.take_compiled(None, EbpfOptions(), enabled) == "foreground"
    assert foreground == [1]


def test_settle_waits_for_the_compile_whatever_its_outcome(fake_bcc):
    FakeBPF.fail = True
    compiling = loading.start_compile(EbpfOptions(), enabled)
    compiling.settle()
    assert compiling.result.done()
