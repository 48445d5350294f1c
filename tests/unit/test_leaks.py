"""find_leaks, end_of_target, chain_frames and their renderers: known answers."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from memprof.analysis.caches import KnownChains
from memprof.analysis.checkpoints import find_checkpoints
from memprof.analysis.leaks import LeakFinding, LeakResult, chain_frames, end_of_target, find_leaks
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.errors import UsageError
from memprof.analysis.views import About, LeaksView
from memprof.report import leaks as leak_reporter
from tests.factories import churn, concat_events, ev, events_frame, leak, mark, stacks_frames

S = 1_000_000_000  # one second in ns


def leaks_of(rows, *, end_ns, recording_end_ns=None, layer="kernel_slab", **kwargs) -> LeakResult:
    """Kernel layers by default: there, what the teardown does not free outlives the process."""
    lifetimes = pair_lifetimes(events_frame(rows, layer=layer))
    return find_leaks(lifetimes, end_ns=end_ns, recording_end_ns=recording_end_ns or end_ns, **kwargs)


def summary(result: LeakResult) -> list[tuple]:
    return [(f.layer, f.stack_id, f.live_bytes, f.live_count, f.released_at_exit) for f in result.findings]


def test_held_at_end_needs_min_age():
    result = leaks_of([
        (1 * S, "alloc", 0xA0, 100, 1),
        (int(9.6 * S), "alloc", 0xB0, 10, 2),  # 0.4 s old at the end: in flight, not leaked
        (int(9.5 * S), "alloc", 0xC0, 1, 3),  # exactly min_age old: held
    ], end_ns=10 * S)
    assert summary(result) == [("kernel_slab", 1, 100, 1, False), ("kernel_slab", 3, 1, 1, False)]
    assert result.min_age_ns == 500_000_000 and result.end_ns == 10 * S


def test_freed_at_or_before_end_is_not_held_and_later_allocations_are_excluded():
    result = leaks_of([
        (1 * S, "alloc", 0xA0, 100, 1), (5 * S, "free", 0xA0),
        (2 * S, "alloc", 0xB0, 100, 2), (10 * S, "free", 0xB0),  # freed exactly at end_ns
        (3 * S, "alloc", 0xC0, 100, 3),
        (11 * S, "alloc", 0xD0, 100, 4),  # after the end
    ], end_ns=10 * S, recording_end_ns=12 * S)
    assert summary(result) == [("kernel_slab", 3, 100, 1, False)]


def test_missed_free_before_end_is_not_a_leak_and_is_reported():
    result = leaks_of([(1 * S, "alloc", 0xA0, 100, 1), (2 * S, "alloc", 0xA0, 50, 2)], end_ns=10 * S)
    assert summary(result) == [("kernel_slab", 2, 50, 1, False)]
    assert result.missed_frees == {"kernel_slab": 1}
    assert result.unconfirmed_frees == {}


def test_released_at_exit_split():
    result = leaks_of([
        (1 * S, "alloc", 0xA0, 100, 7), (2 * S, "alloc", 0xB0, 100, 7),
        (3 * S, "alloc", 0xC0, 100, 7),
        (11 * S, "free", 0xA0), (11 * S, "free", 0xB0),  # freed by the teardown
        ev(4 * S, "alloc", 0xD0, 10, 8, layer="kernel_slab"),
    ], end_ns=10 * S, recording_end_ns=12 * S)
    assert summary(result) == [
        ("kernel_slab", 7, 200, 2, True),
        ("kernel_slab", 7, 100, 1, False),
        ("kernel_slab", 8, 10, 1, False),
    ]


def test_grouping_sorting_top_and_null_stacks():
    rows = [(1 * S, "alloc", 0x100 + i, 10, 1) for i in range(3)]  # 30 B in 3
    rows += [(2 * S, "alloc", 0x200 + i, 15, 2) for i in range(2)]  # 30 B in 2
    rows += [(3 * S, "alloc", 0x300, 30, 3)]  # 30 B in 1
    rows += [(4 * S, "alloc", 0x400 + i, 20, None) for i in range(3)]  # 60 B, no stack
    rows += [ev(5 * S, "alloc", 0x100, 1000, 1, layer="kernel_page")]  # same stack, another layer
    result = leaks_of(rows, end_ns=10 * S)
    assert summary(result) == [
        ("kernel_page", 1, 1000, 1, False),
        ("kernel_slab", None, 60, 3, False),
        ("kernel_slab", 1, 30, 3, False),
        ("kernel_slab", 2, 30, 2, False),
        ("kernel_slab", 3, 30, 1, False),
    ]
    assert summary(leaks_of(rows, end_ns=10 * S, top=2)) == summary(result)[:2]
    assert [f.layer for f in leaks_of(rows, end_ns=10 * S, layers=["kernel_page"]).findings] == ["kernel_page"]


def test_first_last_and_growth():
    result = leaks_of([(2 * S, "alloc", 0xA0, 1000, 1), (6 * S, "alloc", 0xB0, 1000, 1)], end_ns=12 * S)
    (finding,) = result.findings
    assert finding == LeakFinding(layer="kernel_slab", stack_id=1, live_bytes=2000, live_count=2,
                                  first_ns=2 * S, last_ns=6 * S, growth_bytes_per_s=200.0, released_at_exit=False)
    zero_span = leaks_of([(2 * S, "alloc", 0xA0, 1000, 1)], end_ns=2 * S, min_age_ns=0)
    assert zero_span.findings[0].growth_bytes_per_s == 0.0


def test_prime_leak_among_churn_is_found_exactly():
    size = 4096
    events = concat_events(
        churn(100_000, start_ns=0, every_ns=10_000, size=64, stack_id=1),
        leak(257, start_ns=5_000, every_ns=1_000_000, size=size, stack_id=2),
    )
    end_ns = 2 * S
    result = find_leaks(pair_lifetimes(events), end_ns=end_ns, recording_end_ns=end_ns)
    assert summary(result) == [("native_heap", 2, 257 * size, 257, False)]
    assert result.missed_frees == {}


def test_end_after_recording_is_a_usage_error():
    with pytest.raises(UsageError):
        leaks_of([(1 * S, "alloc", 0xA0, 1, 1)], end_ns=3 * S, recording_end_ns=2 * S)


def test_end_of_target_is_the_root_exit_mark():
    events = events_frame([
        (1 * S, "alloc", 0xA0, 1, 1), mark(3 * S, pid=200), mark(5 * S, pid=100), mark(7 * S, pid=100),
        ev(4 * S, "mark", pid=100, category="step"),
    ])
    assert end_of_target(events, 100, 9 * S) == 5 * S
    assert end_of_target(events, 300, 9 * S) == 9 * S
    assert end_of_target(events, None, 9 * S) == 9 * S
    assert end_of_target(events, 100, 4 * S) == 4 * S  # never past the recording's end


def test_chain_frames_innermost_first_with_none_for_unknowns():
    stacks, frames = stacks_frames({
        1: [("kernel", "alloc_pipe_info+0x3f", "vmlinux", None, None), ("native", "main", "kernel_leak", "leak.c", 12)],
        2: [("python", "step", "train", "train.py", 42)],
    })
    chains = chain_frames(stacks, frames, [1, None, 5])
    assert chains == {
        1: [{"kind": "kernel", "function": "alloc_pipe_info+0x3f", "module": "vmlinux", "file": None, "line": None},
            {"kind": "native", "function": "main", "module": "kernel_leak", "file": "leak.c", "line": 12}],
        5: [],
    }
    assert isinstance(chains[1][1]["line"], int)


# --- renderers ---------------------------------------------------------------------------

def _result_with_chain(depth: int = 3):
    rows = [(1 * S, "alloc", 0x100 + i, 4096, 1) for i in range(23)] + [(2 * S, "alloc", 0x900, 8, None)]
    result = leaks_of(rows, end_ns=10 * S, recording_end_ns=11 * S)
    chain = [("kernel", "alloc_pipe_info+0x3f", "vmlinux", None, None),
             ("native", "std::vector<int>::operator[abc]", "libfoo.so", None, None),
             ("python", "train[step]", "train", "train.py", 42)]
    chain += [("native", f"frame{i}", "libbar.so", None, None) for i in range(depth - 3)]
    stacks, frames = stacks_frames({1: chain})
    return result, chain_frames(stacks, frames, [f.stack_id for f in result.findings])


def test_json_keys_and_types():
    result, chains = _result_with_chain()
    result.unconfirmed_frees["kernel_slab"] = 12
    doc = leak_reporter.to_json(LeaksView(result, About("/tmp/run.memprof", lost_events=3), chains))
    assert set(doc) == {"recording", "lost_events", "notes", "findings", "not_leaks", "checkpoints", "missed_frees",
                        "unconfirmed_frees", "min_age_ns", "end_ns", "left_out", "model_state", "heap_recorded",
                        "unseen_tasks"}
    assert doc["unseen_tasks"] == []
    assert doc["not_leaks"] == [] and doc["checkpoints"] is None and doc["model_state"] == []
    assert doc["recording"] == "/tmp/run.memprof" and doc["lost_events"] == 3 and doc["notes"] == []
    assert doc["unconfirmed_frees"] == {"kernel_slab": 12} and doc["missed_frees"] == {}
    assert (doc["min_age_ns"], doc["end_ns"]) == (500_000_000, 10 * S)
    first, second = doc["findings"]
    assert set(first) == {"layer", "name", "younger_count", "younger_bytes", "kind", "reason", "explanation", "slope_bytes_per_step", "slope_bytes_per_s",
                          "confidence", "live_bytes", "live_count", "first_ns", "last_ns", "growth_bytes_per_s",
                          "released_at_exit", "released_before_end", "within_slope_bytes_per_step", "confirmed",
                          "chain_missed_frees", "may_be_freed_unseen", "python_frames", "stack", "module", "ranks",
                          "hosts"}
    assert first["may_be_freed_unseen"] is False  # no process went unseen
    assert first["module"] is None  # the recording has no module boundaries
    assert first["ranks"] == [] and first["hosts"] == []  # no distributed job
    assert (first["kind"], first["reason"], first["confidence"]) == ("held_at_end", "held", None)
    assert first["explanation"] == "held when the target began to exit, and still held after it"
    assert (first["layer"], first["live_bytes"], first["live_count"]) == ("kernel_slab", 23 * 4096, 23)
    assert type(first["growth_bytes_per_s"]) is float and type(first["released_at_exit"]) is bool
    assert all(type(first[k]) is int for k in ("live_bytes", "live_count", "first_ns", "last_ns"))
    assert first["stack"][0] == {"kind": "kernel", "function": "alloc_pipe_info+0x3f", "module": "vmlinux",
                                 "file": None, "line": None}
    assert first["stack"][2]["line"] == 42
    assert second["stack"] == []
    assert json.loads(json.dumps(doc)) == doc


def render(result, chains, **kwargs) -> str:
    console = Console(width=100, record=True, color_system=None)
    leak_reporter.render(LeaksView(result, About("/tmp/run.memprof", **kwargs), chains), console)
    return console.export_text()


def test_table_shows_findings_and_escapes_brackets():
    result, chains = _result_with_chain()
    text = render(result, chains)
    assert "92.0 KiB in 23 allocations" in text
    assert "outlived the process" in text
    assert "[k] alloc_pipe_info+0x3f" in text
    assert "[n] std::vector<int>::operator[abc] (libfoo.so)" in text
    assert "[py] train[step] (train.py:42)" in text
    assert "first seen +1.00s, last seen +1.00s" in text
    assert "(no stack recorded)" in text
    assert "skipped" not in text and "lost" not in text


PROCESS_API = {"pid": 1, "comm": "process_api", "threads": [97, 103], "switches": 9}


def test_kernel_memory_that_outlived_the_target_may_be_freed_unseen_where_a_process_went_unseen():
    rows = [(1 * S, "alloc", 0x100 + i, 4096, 1) for i in range(3)]            # held after the exit
    rows += [(1 * S, "alloc", 0x900 + i, 64, 2) for i in range(5)]
    rows += [(int(10.5 * S), "free", 0x900 + i, 0, None) for i in range(5)]    # freed by the exit: seen
    result = leaks_of(rows, end_ns=10 * S, recording_end_ns=11 * S)
    assert not any(result.may_be_freed_unseen(f) for f in result.findings)  # no process went unseen
    result.unseen_tasks = [PROCESS_API]
    outlived, released = sorted(result.findings, key=lambda f: f.released_at_exit)
    assert (outlived.stack_id, released.stack_id) == (1, 2)
    assert result.may_be_freed_unseen(outlived) and not result.may_be_freed_unseen(released)
    doc = leak_reporter.to_json(LeaksView(result, About("/tmp/run.memprof"), {}))
    assert doc["unseen_tasks"] == [PROCESS_API]
    assert [f["may_be_freed_unseen"] for f in doc["findings"]] == [True, False]  # biggest first
    text = " ".join(render(result, {}).split())
    assert text.count("may be freed unseen") == 1
    assert "may be freed unseen: no probe ran while process 1 (process_api) had a CPU (see the notes)" in text


def test_memory_that_is_not_a_leak_is_not_marked_may_be_freed_unseen():
    """A kernel cache that outlived the target is a not-leak whether or not its frees were
    seen: the mark would only be noise beside it (the leak beside it keeps its mark)."""
    rows = [(1 * S, "alloc", 0x100 + i, 4096, 1) for i in range(3)]   # a leak
    rows += [(1 * S, "alloc", 0x900 + i, 192, 2) for i in range(4)]   # dentries: a kernel cache
    result = leaks_of(rows, end_ns=10 * S, recording_end_ns=11 * S, known=KnownChains(cache=frozenset({2})))
    result.unseen_tasks = [PROCESS_API]
    (leak,), (cache,) = result.findings, result.not_leaks
    assert (leak.stack_id, cache.stack_id, cache.reason) == (1, 2, "kernel_cache")
    assert result.may_be_freed_unseen(leak) and not result.may_be_freed_unseen(cache)
    doc = leak_reporter.to_json(LeaksView(result, About("/tmp/run.memprof"), {}))
    assert [f["may_be_freed_unseen"] for f in doc["findings"]] == [True]
    assert [f["may_be_freed_unseen"] for f in doc["not_leaks"]] == [False]
    assert " ".join(render(result, {}).split()).count("may be freed unseen") == 1


@pytest.mark.parametrize("layer", ["torch_cpu", "native_heap"])
def test_user_space_memory_is_never_freed_unseen_so(layer):
    """A process's own frees run on its own time, which the probes see."""
    result = leaks_of([(1 * S, "alloc", 0x100, 4096, 1)], end_ns=10 * S, recording_end_ns=11 * S, layer=layer)
    result.unseen_tasks = [PROCESS_API]
    assert result.findings and not any(result.may_be_freed_unseen(f) for f in result.findings)


def test_a_target_still_running_has_nothing_outlive_it():
    result = leaks_of([(1 * S, "alloc", 0x100, 4096, 1)], end_ns=10 * S)  # recorded up to its end: no exit
    result.unseen_tasks = [PROCESS_API]
    assert result.findings and not any(result.may_be_freed_unseen(f) for f in result.findings)


def test_table_cuts_long_chains():
    result, chains = _result_with_chain(depth=20)
    text = render(result, chains)
    assert "frame8" in text and "frame9" not in text
    assert "… 8 more frames" in text


def test_table_keeps_the_python_frames_of_a_long_chain():
    chain = [("kernel", f"kframe{i}", "vmlinux", None, None) for i in range(15)]
    chain += [("python", f"pyfunc{i}", None, "train.py", 10 + i) for i in range(3)]
    stacks, frames = stacks_frames({1: chain})
    result, _ = _result_with_chain()
    text = render(result, chain_frames(stacks, frames, [f.stack_id for f in result.findings]))
    assert "kframe8" in text and "kframe9" not in text  # 12 frames: 9 innermost + 3 Python
    assert "… 6 more frames" in text
    assert all(f"pyfunc{i} (train.py:{10 + i})" in text for i in range(3))


def test_table_keeps_the_programs_own_line_under_a_deep_library_chain():
    """A GPT-2 cache's chain: the allocator, then 30 Python frames of transformers and torch
    (installed packages, the stdlib), then the script's one line that called `generate`.
    The line the user acts on is shown, with each gap counted."""
    site = "/venv/lib/python3.11/site-packages"
    chain = [("native", "c10::alloc_cpu", "libc10.so", None, None)]
    chain += [("python", f"lib{i}", None, f"{site}/transformers/m{i}.py", i) for i in range(30)]
    chain += [("python", "contextlib_wrapper", None, "/usr/lib/python3.11/contextlib.py", 79),
              ("python", "<module>", None, "/home/me/serve.py", 12)]
    stacks, frames = stacks_frames({1: chain})
    result, _ = _result_with_chain()
    text = render(result, chain_frames(stacks, frames, [f.stack_id for f in result.findings]))
    assert "<module> (/home/me/serve.py:12)" in text
    assert "lib9 (" in text and "lib10 (" not in text  # 11 innermost frames, then the program's line
    assert "… 21 more frames" in text and "contextlib_wrapper" not in text


def test_memprofs_agent_is_not_taken_for_the_programs_own_line():
    """`import torch` runs through the agent's hook (agent/boot/memprof_agent.py, under the
    recording): that frame is memprof's, and the script's import line is what is kept. A GPT-2
    server's import chains showed the agent's hook and hid the script behind a gap."""
    site = "/venv/lib/python3.11/site-packages"
    chain = [("kernel", f"k{i}", "vmlinux", None, None) for i in range(8)]
    chain += [("python", f"imp{i}", None, "<frozen importlib._bootstrap>", i) for i in range(6)]
    chain += [("python", "_TorchWatcher.find_spec.<locals>.exec_module", None,
               "/home/me/run.memprof/agent/boot/memprof_agent.py", 950)]
    chain += [("python", f"torch{i}", None, f"{site}/torch/__init__.py", i) for i in range(3)]
    chain += [("python", "<module>", None, "/home/me/serve.py", 4)]
    stacks, frames = stacks_frames({1: chain})
    result, _ = _result_with_chain()
    text = render(result, chain_frames(stacks, frames, [f.stack_id for f in result.findings]))
    assert "<module> (/home/me/serve.py:4)" in text
    assert "_TorchWatcher" not in text  # the agent's hook: memprof's frame, not the program's line


@pytest.mark.parametrize("heap_recorded, said", [(False, True), (True, False), (None, False)])
def test_no_leaks_says_the_c_heap_was_not_recorded_where_it_was_not(heap_recorded, said):
    """A pure-Python leak (80,000 dicts kept in a list) under the default sources: no layer
    holds it, and "No leaks" alone would read as "no leak anywhere"."""
    result, chains = _result_with_chain()
    result.findings, result.heap_recorded = [], heap_recorded
    text = render(result, chains)
    assert "No leaks:" in text
    assert ("Not recorded: the C library's heap" in text) is said
    assert ("--sources +native" in text) is said
    assert leak_reporter.to_json(LeaksView(result, About("/tmp/run.memprof"), chains))["heap_recorded"] is heap_recorded


def test_table_warns_about_loss_in_plain_words():
    result, chains = _result_with_chain()
    result.unconfirmed_frees["kernel_slab"] = 12
    result.missed_frees["kernel_slab"] = 2
    text = render(result, chains, lost_events=5, notes=["stacks sampled 1 in 4 [see meta]"])
    assert "5 events were lost while recording" in text
    assert "12 frees were skipped by the kernel while recording (kernel_slab); up to 12 of the allocations " \
           "below may have been freed." in " ".join(text.split())
    assert "2 frees were never seen" in text
    assert "note: stacks sampled 1 in 4 [see meta]" in text


def test_table_when_nothing_leaked():
    result = leaks_of([(1 * S, "alloc", 0xA0, 1, 1), (2 * S, "free", 0xA0)], end_ns=10 * S)
    text = render(result, {})
    assert "No leaks: nothing older than 500ms was live at the end." in text


def test_process_memory_live_at_its_exit_is_released_by_it():
    """User-space layers get no free when a process exits: the kernel takes the memory back
    whole. Live at a recorded exit = released at exit; without an exit, still live."""
    rows = [(1 * S, "alloc", 0xA0, 100, 1), (2 * S, "alloc", 0xB0, 50, 2)]
    exited = leaks_of(rows, end_ns=10 * S, recording_end_ns=11 * S, layer="torch_cpu")
    assert summary(exited) == [("torch_cpu", 1, 100, 1, True), ("torch_cpu", 2, 50, 1, True)]
    attached = leaks_of(rows, end_ns=10 * S, recording_end_ns=10 * S, layer="native_heap")
    assert [f.released_at_exit for f in attached.findings] == [False, False]


def test_a_chain_with_frees_gone_unseen_is_unconfirmed():
    """An address handed out again while live proves a free went unseen; the chain's
    remaining live allocations cannot be confirmed as held."""
    events = events_frame([
        (1 * S, "alloc", 0xA0, 64, 7), (2 * S, "alloc", 0xA0, 64, 7),  # 0xA0's first free unseen
        (1 * S, "alloc", 0xB0, 64, 8),
    ])
    result = find_leaks(pair_lifetimes(events), end_ns=5 * S, recording_end_ns=5 * S)
    by_stack = {f.stack_id: f for f in result.findings}
    assert by_stack[7].live_count == 1 and by_stack[7].chain_missed_frees == 1 and not by_stack[7].confirmed
    assert by_stack[8].confirmed


def test_chains_say_when_they_have_no_python_frames():
    result, chains = _result_with_chain()
    doc = leak_reporter.to_json(LeaksView(result, About("/tmp/run.memprof"), chains))
    assert [f["python_frames"] for f in doc["findings"]] == [True, False]
    assert "no Python frames" not in render(result, chains)
    native_only = {1: [frame for frame in chains[1] if frame["kind"] != "python"]}
    assert "no Python frames" not in render(result, native_only)  # libfoo.so: not an interpreter
    interpreted = {1: native_only[1] + [{"kind": "native", "function": "_PyEval_EvalFrameDefault",
                                         "module": "python3.11", "file": None, "line": None}]}
    # What it says agrees with what the recording knows of Python frames (issue 20 point 14:
    # "see memprof doctor" where doctor, and the recording, said frames were supported).
    said = {}
    for state in (True, False, None):
        result.python_frames = state
        said[state] = " ".join(render(result, interpreted).split())
    assert "(no Python frames: its thread ran no Python code then)" in said[True]
    assert "(no Python frames: not read for every interpreter in this recording; see the notes)" in said[False]
    assert "(no Python frames: its thread ran no Python code then, or its frames were not read)" in said[None]
    assert not any("doctor" in text for text in said.values())


def test_times_before_the_recording_began_are_named_so():
    """`record --pid`: an allocation made before the probes were placed showed "first seen
    -168.2ms" (issue 20 point 14)."""
    result, chains = _result_with_chain()
    text = render(result, chains, start_ns=int(1.5 * S))
    assert "first seen before the recording began, last seen before the recording began" in text
    assert "-" not in text.split("first seen")[1].split("\n")[0]
    assert "first seen +500.0ms" in render(result, chains, start_ns=S // 2)


def test_growth_over_time_windows_is_labelled_per_window():
    """Without step marks (`record --pid` of a program without the agent) growth is judged
    over time windows: the finding said "grows per step" and then "per window" (issue 20
    point 14)."""
    rows = [(k * S // 4, "alloc", 0x1000 + k * 0x100, 1024, 7) for k in range(1, 40)]
    lifetimes = pair_lifetimes(events_frame(rows, layer="kernel_slab"))
    events = events_frame(rows, layer="kernel_slab")
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=10 * S, min_points=8)
    result = find_leaks(lifetimes, end_ns=10 * S, recording_end_ns=10 * S, checkpoints=checkpoints)
    assert [(f.kind, f.stack_id) for f in result.findings] == [("grows_per_step", 7)]
    text = render(result, {})
    assert "grows per window" in text and "per step" not in text
    assert "/window (" in text


@pytest.mark.parametrize("steps, every", [(200, 1), (40, 5)], ids=["thinned-to-128", "every-5th-step-marked"])
def test_growth_per_step_is_per_step_when_checkpoints_are_not_every_step(steps, every):
    """200 step marks are read at 128 checkpoints (MAX_CHECKPOINTS), and a program may mark
    every 5th step only: the slope is still 1,024 B per step, not per checkpoint (the 3·10^8-
    event bench found 1,145 = 1,024 × 142/127 before)."""
    rows = []
    for k in range(1, steps + 1):
        rows.append(dict(ts_ns=k * 10**7, action="mark", category="step", step=k * every, pid=100, tid=100))
        rows.append(ev(k * 10**7 + 10, "alloc", 0x10_0000 + k * 0x1000, 1024 * every, 7))
    events = events_frame(rows)
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=(steps + 1) * 10**7, min_points=8)
    result = find_leaks(pair_lifetimes(events), end_ns=(steps + 1) * 10**7, recording_end_ns=(steps + 2) * 10**7,
                        checkpoints=checkpoints)
    assert len(checkpoints.times_ns) == min(steps, 128)
    (finding,) = result.findings
    # Thinned checkpoints are 1 or 2 steps apart (rounded evenly): per step within 0.1 %.
    assert finding.kind == "grows_per_step" and finding.slope_bytes_per_step == pytest.approx(1024, rel=1e-3)
    assert finding.slope_bytes_per_s == pytest.approx(1024 * every / 0.01, rel=0.02)


def test_whether_the_heap_was_recorded_is_read_from_the_ebpf_sources_families():
    from memprof.analysis.overview import heap_recorded
    from memprof.model import RecordingMeta, SourceStats

    def meta(sources):
        return RecordingMeta(memprof_version="0.1.0", command=["python"], pid=1, start_ns=0, sources=sources)

    assert heap_recorded(meta({"ebpf": SourceStats(detail={"families": ["kmem", "torch", "cuda"]})})) is False
    assert heap_recorded(meta({"ebpf": SourceStats(detail={"families": ["kmem", "torch", "native"]})})) is True
    assert heap_recorded(meta({"ebpf": SourceStats(detail={})})) is None
    assert heap_recorded(meta({})) is None
