"""The processes no BPF program ran under (bpf/README.md "Missed frees", 4): which sched_switch
argument is the incoming task, how the kernel's counts become meta.json's `unseen_tasks`, and
the note every report then carries. The count itself runs in tests/integration/test_kernel.py."""
from __future__ import annotations

import ctypes

import pytest

from memprof.analysis.loss import Severity, recording_notes
from memprof.model.meta import RecordingMeta, SourceStats
from memprof.sources.ebpf import kmem
from memprof.sources.ebpf.kmem import read_unseen_tasks, unseen_switch_next_arg

SWITCH_6_18 = ["bool", "struct task_struct *", "struct task_struct *", "unsigned int"]


class FakeBtf:
    def __init__(self, params, pid_off=1264, tgid_off=1268):
        self.params, self.offsets = params, {"pid": pid_off, "tgid": tgid_off}

    def member_offset(self, struct, member):
        assert struct == "task_struct"
        return self.offsets[member]

    def raw_tracepoint_params(self, tp):
        assert tp == "sched_switch"
        return self.params


def test_the_incoming_task_is_sched_switchs_second_task_pointer():
    assert unseen_switch_next_arg(FakeBtf(SWITCH_6_18)) == 2
    assert unseen_switch_next_arg(FakeBtf(["struct task_struct *", "struct task_struct *"])) == 1  # before 4.15


def test_no_count_where_it_could_not_be_read_right():
    assert unseen_switch_next_arg(FakeBtf(SWITCH_6_18, tgid_off=1272)) is None  # not one word with pid
    assert unseen_switch_next_arg(FakeBtf(["bool", "struct task_struct *", "unsigned int"])) is None


class FakeTable(dict):
    def items(self):
        return [(ctypes.c_uint64(k), ctypes.c_uint64(v)) for k, v in super().items()]


class FakeBpf:
    def __init__(self, tables):
        self.tables = tables

    def __getitem__(self, name):
        return self.tables[name]  # KeyError where the program has no such map, as bcc's


def test_threads_are_counted_under_their_process_most_switches_first(monkeypatch):
    monkeypatch.setattr("memprof.sources.symbols.procs.read_comm", lambda pid: {1: "process_api"}.get(pid, ""))
    table = FakeTable({(1 << 32) | 103: 7, (1 << 32) | 97: 2, (4242 << 32) | 4250: 30})
    assert read_unseen_tasks(FakeBpf({"unseen_tasks": table})) == [
        {"pid": 4242, "comm": "", "threads": [4250], "switches": 30},  # gone by now: no name
        {"pid": 1, "comm": "process_api", "threads": [97, 103], "switches": 9}]
    assert read_unseen_tasks(FakeBpf({"unseen_tasks": FakeTable()})) == []  # counted, none found


def test_none_where_the_count_was_not_compiled():
    assert read_unseen_tasks(FakeBpf({})) is None


def meta_with(detail: dict) -> RecordingMeta:
    return RecordingMeta(memprof_version="0.1.0", pid=100, start_ns=0,
                         sources={"ebpf": SourceStats(events=10, detail=detail)})


def test_a_recording_with_unseen_tasks_says_which_and_what_it_may_have_cost():
    unseen = [{"pid": 1, "comm": "process_api", "threads": [97, 103], "switches": 9}]
    (note,) = [n for n in recording_notes(meta_with({"unseen_tasks": unseen})) if "no probe ran" in n]
    assert note.severity is Severity.CAVEAT
    assert note.startswith("ebpf: no probe ran while process 1 (process_api) had a CPU (9 times seen)")
    assert "RCU callbacks" in note and "released_at_exit false" in note


@pytest.mark.parametrize("detail", [{}, {"unseen_tasks": []}], ids=["not-counted", "none-found"])
def test_no_note_without_unseen_tasks(detail):
    assert not [n for n in recording_notes(meta_with(detail)) if "no probe ran" in n]


class AnyBtf:
    """Answers every question kmem_cflags asks (no kernel's BTF needed)."""

    def member_offset(self, struct, member):
        return 8

    def raw_tracepoint_params(self, tp):
        return ["unsigned long", "void *", "struct kmem_cache *", "gfp_t", "int"]


def test_the_count_is_compiled_with_the_kmem_family_where_the_kernel_allows(monkeypatch):
    monkeypatch.setattr("memprof.sources.ebpf.btf_answers.kernel_btf", AnyBtf)
    monkeypatch.setattr(kmem, "names_cache_is_its_own", lambda: False)
    monkeypatch.setattr(kmem, "unseen_switch_next_arg", lambda btf: 2)
    assert "-DUNSEEN_SWITCH_NEXT_ARG=2" in kmem.kmem_cflags(kmem.KmemOptions())
    monkeypatch.setattr(kmem, "unseen_switch_next_arg", lambda btf: None)
    assert not [f for f in kmem.kmem_cflags(kmem.KmemOptions()) if "UNSEEN" in f]
