"""bench/bpf_floor.py's stand-in programs: the churn bench compares memprof with them, so a
floor that recorded the wrong events, or too many, would make memprof look better or worse
than it is. The text is checked here; bcc compiles it in the bench (as root)."""
from __future__ import annotations

import re

import pytest

from tests.bench_modules import load_bench

PLAN = [("kmalloc", "mp_kmalloc"), ("kmem_cache_alloc", "mp_kmem_cache_alloc"),
        ("kfree", "mp_kfree"), ("kfree", "mp_kfree_nested"),
        ("mm_page_alloc", "mp_page_alloc"), ("mm_page_free", "mp_mm_page_free"),
        ("mm_page_free", "mp_mm_page_free_nested")]


@pytest.fixture(scope="module")
def floor():
    return load_bench("bpf_floor")


def bodies(text: str) -> dict[str, str]:
    return dict(re.findall(r"int (\w+)\(struct bpf_raw_tracepoint_args \*ctx\) \{ (.*?) \}", text))


def test_empty_programs_do_nothing_on_every_planned_tracepoint_and_memprofs_other_raw_ones(floor):
    programs = bodies(floor.program_text("empty", PLAN))
    assert floor.other_raw_tracepoints() == ["sched_process_exec", "sched_process_exit", "sched_process_fork",
                                             "sched_switch", "signal_deliver", "sys_enter"]
    assert set(programs) == {f"floor_{name}" for _, name in PLAN} | {
        f"raw_tracepoint__{tp}" for tp in floor.other_raw_tracepoints()}
    assert set(programs.values()) == {"return 0;"}
    assert "ringbuf" not in floor.program_text("empty", PLAN)


def test_each_allocation_and_free_is_recorded_once_with_its_address_and_size(floor):
    text = floor.program_text("record", PLAN)
    programs = bodies(text)
    # slab: (call_site, ptr, bytes_req, bytes_alloc, ...); pages: (page, order, ...)
    assert programs["floor_mp_kmalloc"] == "return record(ctx->args[1], ctx->args[3], ctx->args[0]);"
    assert programs["floor_mp_kfree"] == "return record(ctx->args[1], 0, ctx->args[0]);"
    assert programs["floor_mp_page_alloc"] == "return record(ctx->args[0], 4096, 0);"
    assert programs["floor_mp_mm_page_free"] == "return record(ctx->args[0], 4096, 0);"
    # the backups would record a free twice: they run after the main program on every event
    assert programs["floor_mp_kfree_nested"] == programs["floor_mp_mm_page_free_nested"] == "return 0;"
    assert programs["raw_tracepoint__sys_enter"] == "return 0;"
    assert f"BPF_RINGBUF_OUTPUT(events, {floor.RING_PAGES});" in text


def test_a_record_is_memprofs_event_size(floor):
    fields = re.search(r"struct rec \{(.*?)\};", floor._RECORD_HEAD).group(1)
    sizes = {"u64": 8, "u32": 4}
    total = sum(sizes[kind] * (int(count) if count else 1) * len(names.split(","))
                for kind, names, count in re.findall(r"(u64|u32) ([\w, ]+?)(?:\[(\d+)\])?;", fields))
    assert total == floor.EVENT_BYTES == 72  # memprof's struct mp_event (records.py checks its dtype)
