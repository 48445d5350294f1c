"""Issue 20 point 12: notes have a severity (information, or something that changes the
results) and plain words; the normal stack-sampling note is information, not first and not
in the page's warning banner; the unseen-frees warning says what it means and whether to act."""
from __future__ import annotations

import json

from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.leaks import find_leaks
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.loss import Severity, recording_notes
from memprof.cli.main import cli
from memprof.model.meta import RecordingMeta, SourceStats
from memprof.analysis.views import About, LeaksView
from memprof.report.leaks import render
from tests.diff_factories import write_recording
from tests.factories import ev, events_frame, mark

S = 1_000_000_000


def sampled_meta() -> RecordingMeta:
    """A recording whose eBPF source shared stacks (one slab stack in 64) and lost 5 stacks."""
    stats = SourceStats(events=10, stack_sample_every=64,
                        detail={"page_stack_sample_every": 8, "user_stack_sample_every": 16, "stack_failures": 5})
    return RecordingMeta(memprof_version="0.1.0", pid=100, start_ns=0, sources={"ebpf": stats},
                         notes=["torch: 2 blocks had no alloc in the trace"])


def test_sampling_note_is_information_in_plain_words_and_comes_last():
    notes = recording_notes(sampled_meta())
    sampling = notes[-1]
    assert sampling.severity is Severity.INFO
    assert "normal" in sampling and "every allocation and its size are recorded" in sampling
    assert "took its own native stack" not in sampling  # the old jargon
    assert [n.severity for n in notes[:-1]] == [Severity.CAVEAT, Severity.CAVEAT]
    assert str(notes[0]) == "torch: 2 blocks had no alloc in the trace"  # notes are still text
    assert "path-name buffers" not in sampling


def test_the_sampling_note_says_path_name_buffers_are_counted_not_recorded():
    meta = sampled_meta()
    meta.sources["ebpf"].detail["path_name_buffers_not_recorded"] = 28_688
    sampling = recording_notes(meta)[-1]
    assert "every allocation and its size are recorded but the path-name buffers that system calls take and " \
           "give back before they return, which are counted" in sampling


def test_native_byte_sampling_is_an_information_note_that_says_how_to_turn_it_off():
    meta = sampled_meta()
    meta.sources["ebpf"].detail.update(families=["kmem", "native"], native_sample_bytes=65536)
    notes = recording_notes(meta)
    (native,) = [n for n in notes if "sampled by size" in n and "min(1, S/" in n]
    assert native.severity is Severity.INFO
    assert "min(1, S/64.0 KiB)" in native and "--native-sample-bytes 0" in native
    shared = next(n for n in notes if "normal" in n)
    assert "native_heap's are sampled by size" in shared


def test_no_native_sampling_note_without_the_native_family_or_sampling():
    for families, sample_bytes in ((["kmem"], 65536), (["kmem", "native"], 0)):
        meta = sampled_meta()
        meta.sources["ebpf"].detail.update(families=families, native_sample_bytes=sample_bytes)
        assert not [n for n in recording_notes(meta) if "sampled by size" in n]


def test_kernel_byte_sampling_is_a_caveat_that_says_how_to_turn_it_off_and_what_it_left_out():
    """Asked for by name (record --kernel-sample-bytes), it makes the kernel's leak counts
    estimates, where they are exact by default: a caveat, not information."""
    meta = sampled_meta()
    meta.sources["ebpf"].detail.update(kernel_sample_bytes=65536, sampled_kernel_left_out=0)
    notes = recording_notes(meta)
    (kernel,) = [n for n in notes if "kernel_slab and kernel_page are sampled by size" in n]
    assert kernel.severity is Severity.CAVEAT
    assert "min(1, S/64.0 KiB)" in kernel and "--kernel-sample-bytes 0" in kernel and "left out" not in kernel
    shared = next(n for n in notes if "normal" in n)
    assert "(the kernel's are sampled by size: see its note)" in shared
    meta.sources["ebpf"].detail.update(families=["kmem", "native"], native_sample_bytes=65536,
                                       sampled_kernel_left_out=1234)
    notes = recording_notes(meta)
    (kernel,) = [n for n in notes if "kernel_slab and kernel_page are sampled by size" in n]
    assert "1,234 sampled allocations were left out" in kernel and "totals are low" in kernel
    shared = next(n for n in notes if "normal" in n)
    assert "(native_heap's and the kernel's are sampled by size: see their notes)" in shared


def test_summary_json_gives_each_note_its_severity(tmp_path):
    path = write_recording(tmp_path / "r.memprof", events_frame([ev(S, "alloc", 0x10, 64, 1)]))
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["sources"] = {"ebpf": {"events": 1, "stack_sample_every": 64}}
    meta_path.write_text(json.dumps(meta))
    result = CliRunner().invoke(cli, ["report", str(path), "--format", "json"], catch_exceptions=False)
    [note] = json.loads(result.stdout)["notes"]
    assert note["severity"] == "info" and "normal" in note["text"]


def _render(result) -> str:
    console = Console(width=200, record=True, color_system=None)
    render(LeaksView(result, About("r")), console)
    return console.export_text()


def _unseen_free_text(second_stack: int) -> str:
    """The leaks table when stack 1's address is handed out again, while still live, to
    `second_stack`: one free never seen, on stack 1's chain."""
    rows = [(1 * S, "alloc", 0xA0, 100, 1), (2 * S, "alloc", 0xA0, 50, second_stack)]
    lifetimes = pair_lifetimes(events_frame(rows, layer="kernel_slab"))
    return _render(find_leaks(lifetimes, end_ns=10 * S, recording_end_ns=10 * S))


def test_unseen_frees_of_other_chains_say_no_finding_is_affected_and_nothing_to_do():
    text = _unseen_free_text(second_stack=2)  # the finding is stack 2's: its frees were all seen
    assert "1 free was never seen (kernel_slab)" in text
    assert "None of the findings below is affected: nothing to do" in text
    assert "! 1 free" not in text  # information, not a warning


def test_unseen_frees_of_a_findings_chain_say_which_findings_and_what_to_do():
    text = _unseen_free_text(second_stack=1)  # the finding is stack 1's, whose free went unseen
    assert "! 1 free was never seen (kernel_slab)" in text
    assert "1 finding below is marked unconfirmed: its size is an upper bound" in text
    assert "not a fault of your program" in text


def _unseen_free_result(second_stack: int, *, unseen_tasks: list[dict]):
    """As _unseen_free_text, with stack 3's kernel allocation still held after the exit, in
    a recording where `unseen_tasks` went unseen."""
    rows = [(1 * S, "alloc", 0xA0, 100, 1), (2 * S, "alloc", 0xA0, 50, second_stack), (1 * S, "alloc", 0xB0, 70, 3)]
    result = find_leaks(pair_lifetimes(events_frame(rows, layer="kernel_slab")), end_ns=10 * S, recording_end_ns=11 * S)
    result.unseen_tasks = unseen_tasks
    return result


PROCESS_API = [{"pid": 1, "comm": "process_api", "threads": [97], "switches": 3}]


def test_unseen_frees_where_a_process_went_unseen_name_that_cause_and_the_findings_it_may_touch():
    text = " ".join(_render(_unseen_free_result(2, unseen_tasks=PROCESS_API)).split())
    assert ("the kernel frees some memory in bulk, or on the time of a process no probe ran under (see the notes), "
            "where its probes cannot see") in text
    assert "None of the findings below is affected" not in text and "marked unconfirmed" not in text  # all confirmed
    assert ("2 other findings are kernel memory that outlived the target where frees went unseen (marked 'may be "
            "freed unseen'): they may already be free. This is not a fault of your program") in text
    both = " ".join(_render(_unseen_free_result(1, unseen_tasks=PROCESS_API)).split())
    assert "1 finding below is marked unconfirmed: its size is an upper bound" in both
    assert "1 other finding is kernel memory that outlived the target" in both  # the unconfirmed one counted once


def test_without_an_unseen_process_the_missed_frees_keep_their_words():
    text = " ".join(_render(_unseen_free_result(2, unseen_tasks=[])).split())
    assert "in bulk where its probes cannot see" in text and "no probe ran under" not in text
    assert "None of the findings below is affected: nothing to do" in text


def test_html_puts_the_sampling_note_apart_from_the_warnings(tmp_path):
    rows = [ev(S, "alloc", 0x10, 64, 1), mark(5 * S, 100)]
    path = write_recording(tmp_path / "r.memprof", events_frame(rows), lost=3)
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["sources"]["ebpf"]["stack_sample_every"] = 64
    meta_path.write_text(json.dumps(meta))
    result = CliRunner().invoke(cli, ["report", "html", str(path), "--format", "json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert any("3 events were lost" in w for w in doc["warnings"])
    assert not any("stack" in w for w in doc["warnings"])
    assert any("normal" in n for n in doc["notes"])


def _late_meta(mapped_ns) -> RecordingMeta:
    """A recording that probed libcuda only once the target had mapped it, 2.5 s in."""
    lib = {"family": "cuda", "layer": "cuda_driver", "probes": 9, "missing": [], "placed": "when the target mapped it",
           "mapped_ns": mapped_ns, "placed_ns": 10 * S + 2_500_000_000}
    early = {"family": "torch", "layer": "torch_cpu", "probes": 2, "missing": [], "placed": "before the command started"}
    stats = SourceStats(events=10, detail={"uprobes": {"/opt/lib/libcuda.so.1": lib, "/venv/libc10.so": early}})
    return RecordingMeta(memprof_version="0.1.0", pid=100, start_ns=10 * S, sources={"ebpf": stats})


def test_a_library_probed_late_is_a_caveat_that_says_how_late_and_how_to_avoid_it():
    """Its allocations before the probes were placed are missing: a caveat with the window
    (mapped_ns to placed_ns), the time, and the remedy. A library probed before the start
    gets no such note."""
    [note] = recording_notes(_late_meta(mapped_ns=10 * S + 2_440_000_000))
    assert note.severity is Severity.CAVEAT
    assert note.startswith("ebpf: /opt/lib/libcuda.so.1 was found only once the target loaded it")
    assert "probed 60 ms after the target mapped it (+2.500s)" in note
    assert "cuda_driver allocations before that are not recorded" in note and "LD_LIBRARY_PATH" in note


def test_a_library_a_periodic_reread_found_says_so():
    [note] = recording_notes(_late_meta(mapped_ns=None))
    assert "probed when memprof's periodic re-read of the target's mappings found it (+2.500s)" in note


def test_a_library_probed_before_the_recording_began_gets_no_note():
    """record --pid: the libraries the target had mapped are probed while the recorder
    starts, before the recording's start: nothing of the recording is missing."""
    meta = _late_meta(mapped_ns=None)
    meta.start_ns = 20 * S
    assert recording_notes(meta) == []
