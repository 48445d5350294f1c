"""A BPF program the kernel refuses gets a typed error with the remedy that fits, and is never
mistaken for a uprobe symbol the library lacks (bcc raises a bare Exception for both)."""
from __future__ import annotations

import os

import pytest

from memprof.errors import SourceUnavailableError
from memprof.sources.ebpf.bpfload import load_program

INTERRUPTED = "Failed to load BPF program b'mp_kmalloc': Resource temporarily unavailable"
REFUSED = "Failed to load BPF program b'mp_kmalloc': Permission denied"
NO_SYMBOL = "could not determine address of symbol b'malloc' in b'/lib/x86_64-linux-gnu/libc.so.6'"


class RefusingBpf:
    """bcc's BPF, as far as loading and attaching uprobes go, failing with `message`."""

    KPROBE = 2

    def __init__(self, message: str):
        self.message = message
        self.attempts = 0

    def load_func(self, name, kind):
        self.attempts += 1
        raise Exception(self.message)

    def attach_uprobe(self, **kwargs):
        raise Exception(self.message)

    attach_uretprobe = attach_uprobe


def test_an_interrupted_load_says_what_stops_memprof():
    with pytest.raises(SourceUnavailableError) as caught:
        load_program(RefusingBpf(INTERRUPTED), "mp_kmalloc", RefusingBpf.KPROBE)
    assert "kept interrupting" in str(caught.value) and "mp_kmalloc" in str(caught.value)
    assert "py-spy without --nonblocking" in caught.value.hint


def test_a_refused_program_points_to_doctor():
    with pytest.raises(SourceUnavailableError) as caught:
        load_program(RefusingBpf(REFUSED), "mp_kmalloc", RefusingBpf.KPROBE)
    assert "refused" in str(caught.value) and "Permission denied" in str(caught.value)
    assert "memprof doctor" in caught.value.hint


def test_other_bcc_errors_pass_through_unchanged():
    with pytest.raises(Exception, match="Unknown program") as caught:
        load_program(RefusingBpf("Unknown program b'nope'"), "nope", RefusingBpf.KPROBE)
    assert not isinstance(caught.value, SourceUnavailableError)


def _libc_source(message: str):
    from memprof.model import SourceStats
    from memprof.sources.ebpf.library_probes import LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions
    from memprof.sources.ebpf.uprobes import libc_paths
    stats = SourceStats()
    probes = LibraryProbes(RefusingBpf(message), EbpfOptions(families=("native",)), stats.detail)
    return _Probed(probes, stats), libc_paths()[0]


class _Probed:
    """LibraryProbes with the stats its detail lands in (as EbpfSource holds them)."""

    def __init__(self, probes, stats):
        self.probes, self.stats = probes, stats

    def probe_library(self, *args):
        self.probes.probe_library(*args)


def test_a_library_probed_at_start_up_fails_the_start_when_its_program_is_refused():
    from memprof.sources.ebpf.library_probes import BEFORE_START
    source, libc = _libc_source(INTERRUPTED)
    with pytest.raises(SourceUnavailableError, match="kept interrupting"):
        source.probe_library(libc, "native", BEFORE_START)


def test_a_library_mapped_mid_recording_notes_the_refusal_and_names_no_symbol_missing():
    from memprof.sources.ebpf.library_probes import ON_MAPPING
    source, libc = _libc_source(INTERRUPTED)
    source.probe_library(libc, "native", ON_MAPPING)
    (entry,) = source.stats.detail["uprobes"].values()
    assert entry["missing"] == [] and entry["probes"] == 0
    assert "malloc" in entry["refused"]
    assert all("Resource temporarily unavailable" in why for why in entry["refused"].values())


def test_a_symbol_the_library_lacks_is_still_reported_missing():
    from memprof.sources.ebpf.library_probes import ON_MAPPING
    source, libc = _libc_source(NO_SYMBOL)
    source.probe_library(libc, "native", ON_MAPPING)
    (entry,) = source.stats.detail["uprobes"].values()
    assert "malloc" in entry["missing"] and "refused" not in entry


class LoggingBpf(RefusingBpf):
    """Fails like bcc does: the verifier's log written to fd 2 first."""

    def load_func(self, name, kind):
        os.write(2, b"bpf: Failed to load program\n0: R1=ctx() R10=fp0\n")
        raise Exception(self.message)


@pytest.mark.parametrize("message, log_shown", [(REFUSED, True), (INTERRUPTED, False)], ids=["refused", "interrupted"])
def test_the_verifiers_log_is_shown_for_a_refusal_only(capfd, message, log_shown):
    with pytest.raises(SourceUnavailableError):
        load_program(LoggingBpf(message), "mp_kmalloc", RefusingBpf.KPROBE)
    assert ("R1=ctx()" in capfd.readouterr().err) is log_shown


def test_every_report_notes_a_library_whose_probes_were_refused():
    from memprof.analysis.loss import recording_notes
    from memprof.model import RecordingMeta, SourceStats
    from memprof.sources.ebpf.library_probes import ON_MAPPING
    source, libc = _libc_source(INTERRUPTED)
    source.probe_library(libc, "native", ON_MAPPING)
    notes = [n for n in recording_notes(RecordingMeta(sources={"ebpf": source.stats})) if "refused" in n]
    assert len(notes) == 1, notes
    assert f"in {libc}" in notes[0] and "malloc" in notes[0] and "native_heap allocations" in notes[0], notes[0]


# ---- programs verified before the start, for libraries that appear later ----

class RecordingBpf(RefusingBpf):
    """Loads every program, remembering the order; refuses those named in `refuse`."""

    def __init__(self, refuse=()):
        super().__init__(REFUSED)
        self.loaded: list[str] = []
        self.refuse = set(refuse)

    def load_func(self, name, kind):
        if name in self.refuse:
            os.write(2, b"0: R1=ctx() R10=fp0\n")
            raise Exception(f"Failed to load BPF program b'{name}': Permission denied")
        self.loaded.append(name)


def test_family_programs_are_every_program_a_library_of_the_family_may_need():
    from memprof.sources.ebpf.uprobes import CUDA, TORCH, family_programs
    assert family_programs(TORCH) == ("mp_c10_alloc_at_call", "mp_c10_alloc_cpu", "mp_torch_return", "mp_c10_free_cpu")
    assert family_programs(TORCH, "entry-return") == ("mp_c10_alloc_cpu", "mp_torch_return", "mp_c10_free_cpu")
    assert family_programs(CUDA) == (
        "mp_cu_mem_alloc", "mp_cuda_return", "mp_cu_mem_alloc_pitch", "mp_cu_mem_alloc_managed",
        "mp_cu_mem_alloc_async", "mp_cu_mem_alloc_host", "mp_cu_mem_host_alloc", "mp_cu_mem_create",
        "mp_cu_mem_free", "mp_cu_mem_free_host")


def test_families_with_no_library_yet_have_their_programs_verified_at_the_start():
    """torch was probed before the start (its programs load then); cuda had no library yet:
    its programs are loaded now, so that a libcuda dlopened later needs attach calls only."""
    from memprof.sources.ebpf.library_probes import LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions
    from memprof.sources.ebpf.uprobes import CUDA, family_programs
    bpf = RecordingBpf()
    probes = LibraryProbes(bpf, EbpfOptions(families=("torch", "cuda")), {})
    probes.probed.add(("/venv/torch/lib/libc10.so", "torch"))
    probes.verify_programs_of_late_families()
    assert bpf.loaded == list(family_programs(CUDA))


def test_a_program_refused_before_the_start_is_left_to_the_attach_that_needs_it(capfd):
    """Nothing is printed and nothing fails at the start: if libcuda appears, its attach
    meets the refusal and notes it (test_a_library_mapped_mid_recording_notes_the_refusal…)."""
    from memprof.sources.ebpf.library_probes import LibraryProbes
    from memprof.sources.ebpf.source import EbpfOptions
    bpf = RecordingBpf(refuse={"mp_cuda_return"})
    LibraryProbes(bpf, EbpfOptions(families=("cuda",)), {}).verify_programs_of_late_families()
    assert "mp_cuda_return" not in bpf.loaded and "mp_cu_mem_free" in bpf.loaded
    assert capfd.readouterr().err == ""
