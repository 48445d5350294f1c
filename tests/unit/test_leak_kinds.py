"""Leak kinds with known answers: grows per step (Theil–Sen, Mann–Kendall), held at the end,
and what is not a leak (plateau, sawtooth, cached segments, kernel caches)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from memprof.analysis.caches import (KnownChains, address_space_stacks, kernel_cache_stacks, known_chains,
                                     memprof_stacks, slab_page_stacks, startup_stacks, thread_stacks)
from memprof.analysis.checkpoints import find_checkpoints, first_step_end_ns, live_by_group
from memprof.analysis.leaks import cut, find_leaks
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.trend import classify, mann_kendall_confidence, theil_sen
from tests.factories import events_frame, ev, mark, stacks_frames

S = 1_000_000_000
KiB, MiB = 1024, 1024 * 1024
PID = 100


def step_marks(n_steps: int) -> list[dict]:
    """Step k begins at k seconds (k = 1..n_steps)."""
    return [dict(ts_ns=k * S, action="mark", category="step", step=k, pid=PID, tid=PID) for k in range(1, n_steps + 1)]


def judged(rows, *, end_ns, recording_end_ns=None, layer="torch_cpu", exit_at=None, **kwargs):
    """find_leaks with the checkpoints and the set-up end the CLI would use (step marks,
    else windows; the first step's end)."""
    if exit_at is not None:
        rows = rows + [dict(ts_ns=exit_at, action="mark", category="exit", pid=PID, tid=PID)]
    events = events_frame(rows, layer=layer).sort_values(["ts_ns", "seq"], kind="stable", ignore_index=True)
    recording_end = recording_end_ns or end_ns
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=end_ns, min_points=8)
    return find_leaks(pair_lifetimes(events), end_ns=end_ns, recording_end_ns=recording_end,
                      checkpoints=checkpoints, setup_end_ns=first_step_end_ns(events), **kwargs)


def slow_leak_in_churn(n_steps=50, leak_bytes=KiB, churn_bytes=MiB, churn_per_step=100, churn_stack=1, leak_stack=2):
    """Each step: 100 MiB allocated and freed within the step (churn), and 1 KiB kept."""
    rows = step_marks(n_steps)
    for k in range(1, n_steps + 1):
        base = k * S
        for i in range(churn_per_step):
            addr = 0x7000_0000 + i * 0x10_0000
            rows.append(ev(base + 1000 + i * 2000, "alloc", addr, churn_bytes, churn_stack))
            rows.append(ev(base + 2000 + i * 2000, "free", addr))
        rows.append(ev(base + S // 2, "alloc", 0x5000_0000 + k * 0x1000, leak_bytes, leak_stack))
    return rows


def test_theil_sen_ignores_outliers_and_mann_kendall_matches_the_formula():
    series = np.array([[0, 10, 20, 30, 1000, 50, 60, 70]], dtype=float)
    assert theil_sen(series)[0] == pytest.approx(10.0)
    rising = np.arange(8, dtype=float)[None, :]
    z = (28 - 1) / math.sqrt(8 * 7 * 21 / 18)  # S = 28 pairs all rising, no ties
    assert mann_kendall_confidence(rising)[0] == pytest.approx(1 - 0.5 * math.erfc(z / math.sqrt(2)))
    assert mann_kendall_confidence(np.zeros((1, 8)))[0] == 0.0  # all ties: no evidence


def test_mann_kendall_variance_counts_ties_per_row():
    from memprof.analysis.trend import _mk_variance
    rows = np.array([[1, 1, 2, 2, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7], [9] * 8], dtype=float)
    # n = 8: 8·7·21 = 1176; ties of 2 and 3 take 2·1·9 + 3·2·11 = 84; all 8 equal take 8·7·21.
    assert _mk_variance(rows).tolist() == [(1176 - 84) / 18, 1176 / 18, 0.0]


def test_shapes_of_known_series():
    grows = np.arange(20) * 1024.0
    plateau = np.minimum(np.arange(20), 6) * 1024.0 * 1024
    sawtooth = (np.arange(20) % 5) * 1024.0 * 1024
    trends = classify(np.vstack([grows, plateau, sawtooth, np.full(20, 5.0)]))
    assert [t.shape for t in trends] == ["grows", "plateau", "sawtooth", "flat"]
    assert trends[0].slope == 1024.0 and trends[0].rises == 19
    assert trends[1].plateau_from == 6 and trends[2].resets == 3


def test_live_by_group_counts_each_checkpoint_inside_the_lifetime():
    times = np.array([10, 20, 30, 40])
    never = np.iinfo(np.int64).max
    live = live_by_group(np.array([0, 0, 1]), 2, np.array([10, 15, 5]), np.array([30, never, 20]),
                         np.array([1.0, 2.0, 4.0]), times)
    assert live.tolist() == [[1, 3, 2, 2], [4, 0, 0, 0]]  # freed at 30: not live at 30


def test_a_slow_leak_hidden_in_heavy_churn_is_found_with_its_slope():
    result = judged(slow_leak_in_churn(), end_ns=51 * S)
    assert [(f.kind, f.stack_id) for f in result.findings] == [("grows_per_step", 2)]
    leak = result.findings[0]
    assert leak.slope_bytes_per_step == KiB and leak.slope_bytes_per_s == pytest.approx(KiB)
    assert leak.confidence > 0.999 and leak.points == 50 and leak.rises == 49
    assert leak.live_bytes == 50 * KiB and leak.live_count == 50
    assert result.checkpoints.by_step and result.not_leaks == []


def test_a_slow_leak_in_the_churning_chain_itself_is_found():
    result = judged(slow_leak_in_churn(leak_stack=1), end_ns=51 * S)
    assert [(f.kind, f.stack_id, f.live_bytes) for f in result.findings] == [("grows_per_step", 1, 50 * KiB)]


def test_growth_counts_young_allocations_of_a_growing_chain():
    rows = slow_leak_in_churn(churn_per_step=0)
    rows.append(ev(int(50.9 * S), "alloc", 0x6000_0000, 3 * KiB, 2))  # 0.1 s old at the end
    result = judged(rows, end_ns=51 * S)
    assert result.findings[0].live_bytes == 53 * KiB


def test_a_cache_that_fills_then_plateaus_is_not_a_leak_in_a_running_job():
    rows = step_marks(40) + [ev(k * S + S // 2, "alloc", 0x9000_0000 + k * MiB, MiB, 3) for k in range(1, 11)]
    result = judged(rows, end_ns=41 * S)
    assert result.findings == []
    [cache] = result.not_leaks
    assert (cache.kind, cache.reason, cache.live_bytes, cache.plateau_from) == ("not_a_leak", "plateau", 10 * MiB, 10)


def test_the_same_plateau_held_when_a_command_exits_is_held_at_the_end():
    rows = step_marks(40) + [ev(k * S + S // 2, "alloc", 0x9000_0000 + k * MiB, MiB, 3) for k in range(1, 11)]
    result = judged(rows, end_ns=41 * S, recording_end_ns=42 * S, exit_at=41 * S)
    assert [(f.kind, f.reason, f.live_bytes) for f in result.findings] == [("held_at_end", "held", 10 * MiB)]


def test_a_burst_then_held_is_a_leak_over_time_windows():
    """Without steps, allocations made over a few windows and then held (a leak at start-up,
    as in CI's SIGKILL test) stay held at the end: only steps tell a cache filling apart."""
    rows = [ev(S // 10 + k * S // 10, "alloc", 0x9000_0000 + k * 0x1000, KiB, 3) for k in range(37)]  # 4 windows
    result = judged(rows, end_ns=32 * S)
    assert not result.checkpoints.by_step
    assert [(f.kind, f.live_count) for f in result.findings] == [("held_at_end", 37)] and result.not_leaks == []


def test_a_sawtooth_buffer_is_not_a_leak_whether_or_not_held_at_the_end():
    rows = step_marks(40)
    for k in range(1, 41):  # one more MiB each step, all released every 5th step
        rows.append(ev(k * S + S // 2, "alloc", 0xA000_0000 + k * MiB, MiB, 4))
        if k % 5 == 0:
            rows += [ev(k * S + S // 2 + 10 + j, "free", 0xA000_0000 + j * MiB) for j in range(k - 4, k + 1)]
    rows.append(ev(int(41.5 * S), "alloc", 0xB000_0000, MiB, 4))  # one live at the end
    result = judged(rows, end_ns=43 * S)
    assert result.findings == []
    assert [(f.reason, f.resets) for f in result.not_leaks] == [("sawtooth", 7)]


def many_sawtooths(chains=12) -> list[dict]:
    """`chains` sawtooth chains (stacks 10, 11, …), each one more buffer a step, all released
    every 5th step and at the last: sizes repeat every four chains, so peaks tie."""
    rows = step_marks(40)
    for c in range(chains):
        size, base = (c % 4 + 1) * MiB, 0xA000_0000 + c * 0x1000_0000
        for k in range(1, 41):
            rows.append(ev(k * S + S // 2 + c, "alloc", base + k * size, size, 10 + c))
            if k % 5 == 0:
                rows += [ev(k * S + S // 2 + 100 + c * 10 + j, "free", base + j * size) for j in range(k - 4, k + 1)]
    return rows


@pytest.mark.parametrize("top", [1, 3, 5, 11])
def test_the_sawtooths_shown_under_top_are_those_a_cut_of_all_shows(top):
    """Only the `top` biggest sawtooth findings are built: the same, in the same order, as
    cutting the uncut result, and the total still counts every one."""
    rows = many_sawtooths()
    shown, everything = judged(rows, end_ns=43 * S, top=top), judged(rows, end_ns=43 * S, top=None)
    assert len(everything.not_leaks) == 12 and {f.reason for f in everything.not_leaks} == {"sawtooth"}
    assert shown.not_leaks == cut(everything, top).not_leaks
    assert [f.stack_id for f in shown.not_leaks] == [13, 17, 21, 12, 16, 20, 11, 15, 19, 10, 14][:top]
    assert shown.not_leaks_total == everything.not_leaks_total == 12


def test_a_sawtooth_that_held_nothing_at_the_end_was_released_before_it_and_says_so():
    """Shown by its highest checkpoint, a chain that held nothing at the end was released
    before it: `report leaks` read "outlived the process" for such chains (a DDP run's
    gradient buffers, torch.compile's workspaces) before 2026-12-07."""
    from rich.console import Console

    from memprof.analysis.views import About, LeaksView
    from memprof.report import leaks as leak_reporter
    result = judged(many_sawtooths(chains=1), end_ns=43 * S, recording_end_ns=44 * S, exit_at=43 * S)
    (saw,) = result.not_leaks
    assert (saw.reason, saw.released_at_exit, saw.released_before_end) == ("sawtooth", False, True)
    console = Console(width=200, record=True, color_system=None)
    leak_reporter.render(LeaksView(result, About("/tmp/run.memprof"), {}), console)
    text = console.export_text()
    assert "4.0 MiB in 4 allocations  ·  released before the end" in text
    assert "outlived" not in text


def test_windows_stand_in_for_steps_when_there_are_no_step_marks():
    rows = [ev(k * S // 10, "alloc", 0x5000_0000 + k * 0x1000, KiB, 2) for k in range(1, 100)]
    result = judged(rows, end_ns=10 * S)
    assert not result.checkpoints.by_step and len(result.checkpoints.times_ns) == 32
    [leak] = result.findings
    assert leak.kind == "grows_per_step"
    assert leak.slope_bytes_per_s == pytest.approx(10 * KiB, rel=0.05)


def test_too_few_checkpoints_judge_held_at_the_end_only():
    rows = step_marks(3) + [ev(k * S + 1, "alloc", 0x5000 + k, KiB, 2) for k in range(1, 4)]
    events = events_frame(rows, layer="torch_cpu")
    assert find_checkpoints(events, start_ns=0, end_ns=3 * S + 2, min_points=8, window_ns=S) is None
    result = find_leaks(pair_lifetimes(events), end_ns=5 * S, recording_end_ns=5 * S, checkpoints=None)
    assert [(f.kind, f.points) for f in result.findings] == [("held_at_end", 0)] and result.checkpoints is None


def test_held_at_end_still_needs_min_age_next_to_a_trend():
    rows = slow_leak_in_churn(n_steps=20, churn_per_step=0)
    rows.append(ev(int(20.8 * S), "alloc", 0xC000_0000, 5 * KiB, 9))  # 0.2 s old at the end
    result = judged(rows, end_ns=21 * S, min_age_ns=S // 2)
    assert [f.stack_id for f in result.findings] == [2]


def test_sampled_weights_scale_the_slope():
    rows = step_marks(20) + [ev(k * S + 7, "alloc", 0x5000_0000 + k * 0x1000, KiB, 2, weight=4.0) for k in range(1, 21)]
    result = judged(rows, end_ns=21 * S)
    assert result.findings[0].slope_bytes_per_step == 4 * KiB and result.findings[0].live_count == 80


def test_cached_segments_are_not_leaks_and_segments_holding_blocks_are():
    rows = [
        ev(1 * S, "alloc", 0x10_0000_0000, 2 * MiB, 5, layer="cuda_segment", device="cuda:0"),
        ev(1 * S, "alloc", 0x10_0000_0000 + 4096, 4096, 6, layer="cuda_block", device="cuda:0"),  # live
        ev(2 * S, "alloc", 0x20_0000_0000, 20 * MiB, 7, layer="cuda_segment", device="cuda:0"),
        ev(2 * S, "alloc", 0x20_0000_0000, MiB, 6, layer="cuda_block", device="cuda:0"),
        ev(3 * S, "free", 0x20_0000_0000, layer="cuda_block", device="cuda:0"),  # its only block freed
    ]
    result = judged(rows, end_ns=5 * S)
    assert [(f.layer, f.stack_id, f.kind) for f in result.findings] == [
        ("cuda_segment", 5, "held_at_end"), ("cuda_block", 6, "held_at_end")]
    assert [(f.layer, f.reason, f.live_bytes) for f in result.not_leaks] == [("cuda_segment", "cached_segment", 20 * MiB)]


def test_kernel_caches_that_outlive_the_process_are_not_leaks():
    stacks, frames = stacks_frames({
        1: [("kernel", "kmem_cache_alloc_lru+0x1c", "vmlinux", None, None), ("kernel", "__d_alloc", "vmlinux", None, None)],
        2: [("kernel", "kmalloc_trace", "vmlinux", None, None), ("kernel", "alloc_pipe_info", "vmlinux", None, None)],
        3: [("kernel", "sock_alloc_inode", "vmlinux", None, None)],
        4: [("kernel", "kmem_cache_alloc_lru", "vmlinux", None, None), ("kernel", "alloc_inode", "vmlinux", None, None),
            ("kernel", "new_inode_pseudo", "vmlinux", None, None), ("kernel", "create_pipe_files", "vmlinux", None, None)],
        5: [("kernel", "__alloc_frozen_pages_noprof", "vmlinux", None, None), ("kernel", "allocate_slab", "vmlinux", None, None)],
        6: [("kernel", "alloc_pages_noprof", "vmlinux", None, None), ("kernel", "pte_alloc_one+0x1a", "vmlinux", None, None)],
        # 6.18's extent-status entries and an inode's lock context (torch.compile's cache
        # files, flocked, `record --pid`: 15 findings of 40-56 B before 2026-12-07)
        7: [("kernel", "kmem_cache_alloc_noprof", "vmlinux", None, None), ("kernel", "__es_insert_extent+0x2b", "vmlinux", None, None),
            ("kernel", "ext4_es_insert_extent", "vmlinux", None, None)],
        8: [("kernel", "kmem_cache_alloc_noprof", "vmlinux", None, None), ("kernel", "locks_get_lock_context", "vmlinux", None, None),
            ("kernel", "flock_lock_inode", "vmlinux", None, None)],
    })
    caches = kernel_cache_stacks(stacks, frames)
    assert caches == frozenset({1, 7, 8})  # a pipe's inode (4) lives as long as the pipe
    assert slab_page_stacks(stacks, frames) == frozenset({5})
    assert address_space_stacks(stacks, frames) == frozenset({6})
    rows = [ev(1 * S, "alloc", 0xA0, 192, 1), ev(1 * S, "alloc", 0xB0, 1024, 2), ev(1 * S, "alloc", 0xC0, 640, 3)]
    result = judged(rows, end_ns=3 * S, recording_end_ns=4 * S, exit_at=3 * S, layer="kernel_slab",
                    known=KnownChains(cache=caches))
    assert [f.stack_id for f in result.findings] == [2, 3]
    assert [(f.stack_id, f.reason) for f in result.not_leaks] == [(1, "kernel_cache")]


def test_the_slab_allocators_pages_are_never_leaks_even_when_they_grow():
    """Pages through allocate_slab, released at exit or not, growing or not: the objects in
    them are what could leak (kernel_slab)."""
    rows = step_marks(20) + [ev(k * S + 7, "alloc", 0x5000_0000 + k * 0x1000, 4096, 5) for k in range(1, 21)]
    result = judged(rows, end_ns=21 * S, layer="kernel_page", known=KnownChains(slab_pages=frozenset({5})))
    assert result.findings == []
    assert [(f.reason, f.live_bytes) for f in result.not_leaks] == [("slab_pages", 20 * 4096)]


def test_the_slab_allocators_bookkeeping_of_a_page_is_not_a_leak_but_the_object_it_was_for_is():
    """CI (stop 58) failed the leak gate on a torch program that keeps nothing: 192 B of
    kernel_slab, kmalloc-ed by alloc_slab_obj_exts as allocate_slab took a fresh page for the
    file an open() needed. That vector lives as long as the page, not the file; the file
    itself (its own chain, without allocate_slab) stays a finding when it is held."""
    stacks, frames = stacks_frames({
        # the chain CI printed, innermost first
        7: [("kernel", name, "vmlinux", None, None) for name in (
            "__kmalloc_node_noprof", "alloc_slab_obj_exts", "allocate_slab", "___slab_alloc", "__slab_alloc.isra.0",
            "kmem_cache_alloc_noprof", "alloc_empty_file", "path_openat", "do_filp_open", "do_sys_openat2")],
        # the vector made later, as a page first holds an accounted object (no allocate_slab)
        8: [("kernel", name, "vmlinux", None, None) for name in (
            "__kmalloc_node_noprof", "alloc_slab_obj_exts", "__memcg_slab_post_alloc_hook", "kmem_cache_alloc_noprof")],
        9: [("kernel", name, "vmlinux", None, None) for name in (
            "kmem_cache_alloc_noprof", "alloc_empty_file", "path_openat", "do_filp_open", "do_sys_openat2")],
        # 6.18: a per-CPU sheaf for a cache's objects, kmalloc-ed as the allocator refills one
        10: [("kernel", name, "vmlinux", None, None) for name in (
            "__kmalloc_noprof", "alloc_empty_sheaf", "__pcs_replace_empty_main", "kmem_cache_alloc_noprof")],
    })
    known = KnownChains(slab_pages=slab_page_stacks(stacks, frames))
    assert known.slab_pages == frozenset({7, 8, 10})
    rows = [ev(1 * S, "alloc", 0xA0, 192, 7), ev(1 * S, "alloc", 0xB0, 64, 8), ev(1 * S, "alloc", 0xC0, 256, 9)]
    result = judged(rows, end_ns=3 * S, layer="kernel_slab", known=known)
    assert [(f.stack_id, f.reason, f.live_bytes) for f in result.findings] == [(9, "held", 256)]
    assert sorted((f.stack_id, f.reason, f.live_bytes) for f in result.not_leaks) == [
        (7, "slab_pages", 192), (8, "slab_pages", 64)]


def test_the_address_space_is_never_a_leak_even_when_it_grows():
    """A training loop that touches more memory grows its page tables: 3 rises in 40 steps,
    Mann–Kendall sure of it (CI met this in train.py). What they map shows elsewhere."""
    rows = step_marks(40) + [ev(k * S + 7, "alloc", 0x6000_0000 + k * 0x1000, 4096, 6) for k in (5, 17, 30)]
    plain = judged(rows, end_ns=41 * S, layer="kernel_page")
    assert [f.kind for f in plain.findings] == ["grows_per_step"]  # without knowing the chain
    result = judged(rows, end_ns=41 * S, layer="kernel_page",
                    known=KnownChains(address_space=frozenset({6})))
    assert result.findings == [] and [(f.reason, f.live_count) for f in result.not_leaks] == [("address_space", 3)]


def _kernel(*functions):
    return [("kernel", f, "vmlinux", None, None) for f in functions]


def test_munmaps_tree_nodes_and_memprofs_own_allocations_are_not_the_targets_leaks():
    """Chains from a recording of train.py (the control), innermost first. munmap's maple-tree
    nodes are freed where no kmem tracepoint sees it (6.18's RCU sheaves); the BPF
    allocator's refill ran inside memprof's own program. Both were the control's biggest
    "leaks" (468 KiB of 618 KiB held, in one recording). A pipe's buffer array stays a leak."""
    stacks, frames = stacks_frames({
        1: _kernel("kmem_cache_alloc_noprof", "mas_store_gfp", "do_vmi_align_munmap", "do_vmi_munmap", "__vm_munmap"),
        2: _kernel("__kmalloc_node_noprof", "alloc_bulk", "bpf_mem_refill", "irq_work_run_list", "irq_work_run",
                   "unit_alloc", "bpf_mem_cache_alloc_flags", "bpf_selem_alloc", "bpf_local_storage_update",
                   "bpf_task_storage_get_recur", "bpf_prog_026145661646e073_mp_kmem_cache_alloc", "bpf_trace_run5",
                   "kmem_cache_alloc_noprof"),
        3: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info", "create_pipe_files", "do_pipe2"),
        4: _kernel("kmem_cache_alloc_noprof", "mm_alloc", "alloc_bprm", "do_execveat_common.isra.0"),
        5: _kernel("kmem_cache_alloc_noprof", "bpf_prog_026145661646e073_other_tool", "bpf_trace_run5"),
    })
    assert address_space_stacks(stacks, frames) == frozenset({1, 4})
    assert memprof_stacks(stacks, frames) == frozenset({2})  # another tool's program (5) is not memprof's
    rows = [ev(1 * S, "alloc", 0xA0 + k * 0x100, 256, stack) for k, stack in enumerate((1, 2, 3, 4, 5))]
    result = judged(rows, end_ns=3 * S, recording_end_ns=4 * S, exit_at=3 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert sorted(f.stack_id for f in result.findings) == [3, 5]
    assert sorted((f.stack_id, f.reason) for f in result.not_leaks) == [(1, "address_space"), (2, "memprof_own"),
                                                                       (4, "address_space")]


def test_the_heaps_area_growing_under_brk_is_the_address_space():
    """CI saw these as held (and outliving the process): maple-tree nodes the kernel made as
    glibc's brk moved the heap's end, under a Python forward; one kept only its call site."""
    stacks, frames = stacks_frames({
        1: _kernel("mas_new_ma_node.isra.0") + [("native", "brk", "libc.so.6", None, None),
                                                 ("native", "__sbrk", "libc.so.6", None, None),
                                                 ("python", "NewGELUActivation.forward", None, "activations.py", 66)],
        2: _kernel("kmem_cache_alloc_noprof", "vm_area_alloc", "do_brk_flags", "__do_sys_brk"),
        3: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info", "create_pipe_files", "do_pipe2")
        + [("native", "__pipe", "libc.so.6", None, None)],
    })
    assert address_space_stacks(stacks, frames) == frozenset({1, 2})


def test_a_filesystems_cached_metadata_blocks_are_a_kernel_cache():
    """Directory blocks ext4 read through the block device's page cache, and their buffer
    heads (a cold-cache run of train.py: 840 KiB of them outlived it, reported as leaks)."""
    stacks, frames = stacks_frames({
        1: _kernel("__alloc_frozen_pages_noprof", "alloc_pages_mpol", "folio_alloc_noprof", "__filemap_get_folio",
                   "__getblk_slow", "ext4_getblk", "ext4_bread"),
        2: _kernel("kmem_cache_alloc_noprof", "alloc_buffer_head", "folio_alloc_buffers", "__getblk_slow"),
    })
    assert kernel_cache_stacks(stacks, frames) == frozenset({1, 2})


def test_a_command_that_exits_without_step_marks_is_judged_at_its_end_only(tmp_path):
    """Windows stand in for steps only for a target still running when the recording stopped."""
    from memprof.api import analyse
    from tests.diff_factories import write_recording
    rows = [ev(k * S // 10, "alloc", 0x5000_0000 + k * 0x1000, KiB, 2) for k in range(1, 100)]
    exited = rows + [dict(ts_ns=10 * S, action="mark", category="exit", pid=PID, tid=PID)]
    for name, events, kind in (("exited", exited, "held_at_end"), ("running", rows, "grows_per_step")):
        result = analyse(write_recording(tmp_path / f"{name}.memprof", events_frame(events, layer="torch_cpu"),
                                         end_ns=11 * S)).leak_result()
        assert [f.kind for f in result.findings] == [kind], name
        assert (result.checkpoints is None) == (name == "exited")


# ---- issue 20 point 2: what a program keeps by design is not its leak ----

AGENT = "/tmp/run.memprof/agent/boot/memprof_agent.py"


def _python(function, file, line=1):
    return ("python", function, None, file, line)


def _native(function, module):
    return ("native", function, module, None, None)


def test_memprofs_agent_and_uprobes_are_memprof_own_but_an_import_through_its_hook_is_the_targets():
    """memprof's agent thread (`_start_flusher`, once a user's leak), the json it imports and
    the kernel's state for memprof's uprobes are memprof's; torch's import, which runs
    through the agent's hook, and the sitecustomize the agent shadows are the target's."""
    stacks, frames = stacks_frames({
        1: _kernel("kmem_cache_alloc_node_noprof", "dup_task_struct", "copy_process", "kernel_clone") + [
            _python("Thread.start", "/usr/lib/python3.11/threading.py"), _python("_start_flusher", AGENT, 91),
            _python("_write", AGENT, 85), _python("install", AGENT, 347),
            _python("_TorchWatcher.find_spec.<locals>.exec_module", AGENT, 400), _python("<module>", "train.py")],
        2: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file", "path_openat") + [
            _python("<module>", "/venv/torch/__init__.py", 445),
            _python("_find_and_load", "<frozen importlib._bootstrap>"),
            _python("_TorchWatcher.find_spec.<locals>.exec_module", AGENT, 399), _python("<module>", "train.py")],
        3: _kernel("__kmalloc_cache_noprof", "alloc_utask", "uprobe_notify_resume", "asm_exc_int3"),
        4: [_native("pipe2", "libc.so.6"), _python("<module>", "/etc/python3.11/sitecustomize.py"),
            _python("_run_shadowed_sitecustomize", "/tmp/run.memprof/agent/boot/sitecustomize.py")],
        5: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file") + [
            _python("<module>", "/usr/lib/python3.11/json/decoder.py"),
            _python("_find_and_load", "<frozen importlib._bootstrap>"),
            _python("<module>", AGENT, 25), _python("_start", "/tmp/run.memprof/agent/boot/sitecustomize.py", 45)],
    })
    assert memprof_stacks(stacks, frames) == frozenset({1, 3, 5})
    rows = [ev(k * S, "alloc", 0xA0 + k * 0x100, 256, k) for k in (1, 2, 3, 4, 5)]
    result = judged(rows, end_ns=7 * S, recording_end_ns=8 * S, exit_at=7 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert [f.stack_id for f in result.findings] == [4]
    assert sorted((f.stack_id, f.reason) for f in result.not_leaks) == [
        (1, "memprof_own"), (2, "startup"), (3, "memprof_own"), (5, "memprof_own")]


def test_a_running_threads_kernel_objects_are_not_a_leak_unless_threads_pile_up():
    stacks, frames = stacks_frames({
        1: _kernel("kmem_cache_alloc_node_noprof", "dup_task_struct", "copy_process", "kernel_clone"),
        2: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info", "create_pipe_files", "do_pipe2"),
    })
    assert thread_stacks(stacks, frames) == frozenset({1})
    known = known_chains(stacks, frames)
    one_thread = step_marks(20) + [ev(3 * S + 7, "alloc", 0xA000, 5888, 1), ev(3 * S + 9, "alloc", 0xB000, 1024, 2)]
    result = judged(one_thread, end_ns=21 * S, recording_end_ns=22 * S, exit_at=21 * S, layer="kernel_slab",
                    known=known)
    assert [(f.stack_id, f.kind) for f in result.findings] == [(2, "held_at_end")]
    assert [(f.stack_id, f.reason) for f in result.not_leaks] == [(1, "threads")]
    a_thread_a_step = step_marks(20) + [ev(k * S + 7, "alloc", 0xA000 + k * 0x2000, 5888, 1) for k in range(1, 21)]
    result = judged(a_thread_a_step, end_ns=21 * S, recording_end_ns=22 * S, exit_at=21 * S, layer="kernel_slab",
                    known=known)
    assert [(f.stack_id, f.kind, f.live_count) for f in result.findings] == [(1, "grows_per_step", 20)]


def test_what_a_python_program_makes_once_at_start_up_is_not_a_leak_unless_it_grows():
    """A training script: exec (0.1 s), the interpreter starting (0.2 s, no Python code yet),
    an import that loads an extension (0.3 s: its first Python frame), set-up before the
    first step ends (0.5 s), then 20 steps (step k ends at k s), one pipe kept per step.
    What start-up made and kept until exit is not a leak; a chain that also allocated after
    it, the pipe that piles up, and the model's weights (user space, the program's data) are
    findings."""
    open_file = _kernel("kmem_cache_alloc_noprof", "alloc_empty_file", "path_openat", "do_sys_openat2")
    stacks, frames = stacks_frames({
        1: open_file + [_native("[unknown]", "ld-linux-x86-64.so.2"),
                        _python("ExtensionFileLoader.create_module", "<frozen importlib._bootstrap_external>"),
                        _python("_find_and_load", "<frozen importlib._bootstrap>"), _python("<module>", "train.py")],
        2: _kernel("__kmalloc_noprof", "lsm_blob_alloc", "prepare_exec_creds", "bprm_execve",
                   "do_execveat_common.isra.0"),
        3: open_file + [_native("setlocale", "libc.so.6")],
        4: open_file + [_native("open64", "libc.so.6"), _python("kaiming_uniform_", "torch/nn/init.py"),
                        _python("main", "train.py")],
        5: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info", "create_pipe_files") + [_python("step", "train.py")],
        6: open_file + [_native("open64", "libc.so.6"), _python("load", "data.py"), _python("main", "train.py")],
    })
    assert startup_stacks(stacks, frames) == frozenset({1, 2})
    rows = step_marks(20) + [ev(S // 10, "alloc", 0x100, 16, 2), ev(S // 5, "alloc", 0x200, 192, 3),
                             ev(3 * S // 10, "alloc", 0x300, 192, 1), ev(S // 2, "alloc", 0x400, 96, 4),
                             ev(S // 2, "alloc", 0x500, 192, 6), ev(6 * S + 5, "alloc", 0x600, 192, 6)]
    rows += [ev(k * S + 7, "alloc", 0x1_0000 + k * 0x1000, 1024, 5) for k in range(1, 21)]
    result = judged(rows, end_ns=21 * S, recording_end_ns=22 * S, exit_at=21 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert [(f.stack_id, f.kind, f.live_count) for f in result.findings] == [
        (5, "grows_per_step", 20), (6, "held_at_end", 2)]
    assert sorted((f.stack_id, f.reason) for f in result.not_leaks) == [
        (1, "startup"), (2, "startup"), (3, "startup"), (4, "startup")]
    weights = step_marks(20) + [ev(3 * S // 10, "alloc", 0x300, 64, 4), ev(S // 2, "alloc", 0x9000, MiB, 4)]
    result = judged(weights, end_ns=21 * S, recording_end_ns=22 * S, exit_at=21 * S, layer="torch_cpu",
                    known=known_chains(stacks, frames))
    assert [(f.stack_id, f.kind, f.live_bytes) for f in result.findings] == [(4, "held_at_end", MiB + 64)]


def test_the_interpreter_starting_is_start_up_until_its_main_thread_first_runs_python():
    """No step marks (`python -c`): the locale file libc opens before any Python code ran is
    start-up; the same kind of chain after the first Python frame is a finding."""
    stacks, frames = stacks_frames({
        1: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file") + [_native("setlocale", "libc.so.6")],
        2: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file") + [_python("<module>", "<string>")],
        3: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file") + [_native("open64", "libc.so.6")],
    })
    rows = [ev(S // 5, "alloc", 0x100, 192, 1), ev(S // 5 + 5, "alloc", 0x200, 192, 3, tid=PID + 1),
            ev(S // 2, "alloc", 0x300, 192, 2), ev(2 * S, "alloc", 0x400, 192, 3)]
    result = judged(rows, end_ns=5 * S, recording_end_ns=6 * S, exit_at=5 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert not result.checkpoints.by_step  # windows: no set-up end
    assert sorted((f.stack_id, f.live_count) for f in result.findings) == [(2, 1), (3, 2)]
    assert [(f.stack_id, f.reason) for f in result.not_leaks] == [(1, "startup")]


def test_the_interpreters_own_heap_before_its_first_python_code_is_start_up_unless_attached_to():
    """`record --sources +native -- python idle.py` (no step marks): CPython's own heap,
    malloc'd as the interpreter starts (0.03 s, no Python frame yet, an unnamed frame in
    python3.11), is start-up in every layer, not only the kernel's: before 2026-12-07 it
    was a native_heap finding of 1.4 MiB in every Python program, and `check
    --fail-on-leak` failed a program that leaked nothing. What the program allocates once
    its Python code runs (0.1 s) stays a finding, and so does everything of a process
    attached to (`record --pid`: the first Python frame seen there is not its interpreter
    starting)."""
    stacks, frames = stacks_frames({
        1: [_native("[unknown]", "python3.11")],
        2: [_native("malloc", "libc.so.6"), _python("<module>", "idle.py")],
    })
    rows = [ev(3 * S // 100, "alloc", 0x100, 256 * KiB, 1), ev(S // 10, "alloc", 0x200, 64, 2)]
    options = dict(end_ns=5 * S, recording_end_ns=6 * S, exit_at=5 * S, layer="native_heap",
                   known=known_chains(stacks, frames))
    result = judged(rows, **options)
    assert [(f.stack_id, f.live_bytes) for f in result.findings] == [(2, 64)]
    assert [(f.stack_id, f.reason, f.live_bytes) for f in result.not_leaks] == [(1, "startup", 256 * KiB)]
    attached = judged(rows, attached_pids=frozenset({PID}), **options)
    assert [(f.stack_id, f.live_bytes) for f in attached.findings] == [(1, 256 * KiB), (2, 64)]
    assert attached.not_leaks == []


def test_the_interpreter_is_starting_until_the_programs_own_python_code_runs():
    """`record --sources +native --native-sample-bytes 0 -- python idle.py`: CPython's C
    code allocates with no Python frame before, between and after the frozen code it runs
    as it starts (getpath, the import system's own module bodies) and the imports of its
    encodings and site. All of it is the interpreter starting, up to the program's first own
    Python code; the same chain after that is a finding (10 findings before 2026-12-07)."""
    importing = [_python("_find_and_load", "<frozen importlib._bootstrap>"), _python("<module>", "<frozen site>")]
    stacks, frames = stacks_frames({
        1: [_native("_PyMem_RawWcsdup", "python3.11")],
        2: [_native("[unknown]", "python3.11"), _python("<module>", "<frozen getpath>")],
        3: [_native("PyType_GenericAlloc", "python3.11"), _python("<module>", "<frozen importlib._bootstrap>")],
        4: [_native("PyMem_Malloc", "python3.11")] + importing,
        5: [_native("malloc", "libc.so.6"), _python("<module>", "idle.py")],
    })
    known = known_chains(stacks, frames)
    assert known.python == frozenset({4, 5}) and known.startup == frozenset({2, 3, 4})
    rows = [ev(10, "alloc", 0x100, 64, 1), ev(20, "alloc", 0x200, 64, 2), ev(30, "alloc", 0x300, 64, 3),
            ev(40, "alloc", 0x400, 64, 1), ev(50, "alloc", 0x500, 64, 4), ev(60, "alloc", 0x600, 64, 1),
            ev(S // 10, "alloc", 0x700, 64, 5)]
    options = dict(end_ns=5 * S, recording_end_ns=6 * S, exit_at=5 * S, layer="native_heap", known=known, min_age_ns=0)
    result = judged(rows, **options)
    assert [(f.stack_id, f.live_count) for f in result.findings] == [(5, 1)]
    assert sorted((f.stack_id, f.reason, f.live_count) for f in result.not_leaks) == [
        (1, "startup", 3), (2, "startup", 1), (3, "startup", 1), (4, "startup", 1)]
    later = judged(rows + [ev(S // 5, "alloc", 0x800, 64, 1)], **options)  # the same C chain, once the program ran
    assert sorted((f.stack_id, f.live_count) for f in later.findings) == [(1, 4), (5, 1)]


def test_a_short_jobs_set_up_is_start_up_however_few_its_steps(tmp_path):
    """torch.multiprocessing.spawn of one rank that takes 5 steps (too few for a trend): the
    launcher (pid 99, no steps of its own) keeps a pipe per child it spawns (0.3 s), the rank
    opens its sockets as its process group starts (0.6 s), both before the job's first step
    ends (1 s), and the rank keeps another pipe at 3.5 s. Only that last pipe is a finding:
    before 2026-12-05 the set-up's end came from step checkpoints alone, so a job of fewer
    than 8 steps reported all three (a BERT DDP run: 27 findings, none a leak)."""
    from memprof.api import analyse
    from tests.diff_factories import write_recording
    launcher = 99
    chains = {
        1: [("kernel", "__kmalloc_cache_noprof", None, None, None), ("kernel", "alloc_pipe_info", None, None, None),
            _python("Popen._launch", "/usr/lib/python3.11/multiprocessing/popen_spawn_posix.py", 40)],
        2: [("kernel", "kmem_cache_alloc_lru_noprof", None, None, None), ("kernel", "sock_alloc_inode", None, None, None),
            _python("init_process_group", "torch/distributed/distributed_c10d.py")],
        3: [("kernel", "__kmalloc_cache_noprof", None, None, None), ("kernel", "alloc_pipe_info", None, None, None),
            _python("run", "ddp.py", 15)],
        4: [_python("<module>", "ddp.py")],
    }
    rows = [ev(S // 10, "alloc", 0x10, 64, 4, pid=launcher, tid=launcher),
            ev(S // 5, "alloc", 0x20, 64, 4),
            ev(3 * S // 10, "alloc", 0x100, 1024, 1, pid=launcher, tid=launcher),
            ev(6 * S // 10, "alloc", 0x200, 832, 2),
            ev(7 * S // 2, "alloc", 0x300, 1024, 3)]
    rows = [dict(row, layer="kernel_slab") for row in rows]
    rows += [dict(ts_ns=k * S, action="mark", category="step", step=k, pid=PID, tid=PID) for k in range(1, 6)]
    rows += [mark(6 * S, PID), mark(6 * S + 1, launcher)]
    events = events_frame(rows).sort_values(["ts_ns"], kind="stable", ignore_index=True)
    result = analyse(write_recording(tmp_path / "ddp.memprof", events, chains, pid=launcher,
                                     end_ns=7 * S)).leak_result()
    assert result.checkpoints is None  # 5 steps: no trend, as before
    assert [(f.stack_id, f.kind, f.live_bytes) for f in result.findings] == [(3, "held_at_end", 1024)]
    assert sorted((f.stack_id, f.reason) for f in result.not_leaks if f.layer == "kernel_slab") == [
        (1, "startup"), (2, "startup"), (4, "startup")]


def test_a_worker_that_leaks_while_the_main_thread_waits_is_not_start_up():
    """The main thread joins a worker (no allocation) until the end; the worker keeps a pipe
    a second: Python code ran from the worker's first allocation on."""
    stacks, frames = stacks_frames({
        1: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info") + [_python("work", "server.py")],
        2: _kernel("kmem_cache_alloc_noprof", "alloc_empty_file") + [_python("<module>", "server.py")],
    })
    rows = [ev(k * S, "alloc", 0x100 * k, 1024, 1, tid=PID + 1) for k in range(1, 5)]
    rows += [ev(9 * S // 2, "alloc", 0x900, 192, 2)]
    result = judged(rows, end_ns=6 * S, recording_end_ns=7 * S, exit_at=6 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert [(f.stack_id, f.kind, f.live_count) for f in result.findings] == [
        (1, "held_at_end", 4), (2, "held_at_end", 1)]


def test_nothing_is_start_up_by_time_in_a_process_without_python_frames():
    """A C program (or Python whose frames were not read): no first Python frame, so its
    early allocations are judged like the others."""
    stacks, frames = stacks_frames({
        1: _kernel("__kmalloc_cache_noprof", "alloc_pipe_info") + [_native("main", "leak")]})
    rows = [ev(S // 10, "alloc", 0x100, 1024, 1), ev(2 * S, "alloc", 0x200, 1024, 1, pid=PID, tid=PID + 1)]
    result = judged(rows, end_ns=5 * S, recording_end_ns=6 * S, exit_at=5 * S, layer="kernel_slab",
                    known=known_chains(stacks, frames))
    assert [(f.stack_id, f.kind, f.live_count) for f in result.findings] == [(1, "held_at_end", 2)]


def per_request(n_requests: int, tokens: int, kept_per_request: int) -> list[dict]:
    """Requests of `tokens` steps each (one step a token); a cache chain (stack 5) that
    grows 24 KiB a token and is freed when its request ends, and, with `kept_per_request`,
    one allocation of that size (stack 6) kept from every request. Everything is freed at
    41 s, before the exit at 42 s, as a list goes when main returns."""
    rows, step, kept = [], 0, []
    for r in range(n_requests):
        cache = []
        for _ in range(tokens):
            step += 1
            rows.append(dict(ts_ns=step * S, action="mark", category="step", step=step, pid=PID, tid=PID))
            addr = 0xC000_0000 + step * 0x10_0000
            rows.append(ev(step * S + S // 2, "alloc", addr, 24 * KiB, 5))
            cache.append(addr)
        rows += [ev(step * S + S // 2 + 10 + i, "free", a) for i, a in enumerate(cache)]
        if kept_per_request:
            kept.append(0xD000_0000 + r * 0x10_0000)
            rows.append(ev(step * S + S // 2 + 100, "alloc", kept[-1], kept_per_request, 6))
    rows += [ev(41 * S + i, "free", a) for i, a in enumerate(kept)]
    return rows


def test_a_request_cache_grows_within_each_request_and_is_not_a_leak():
    result = judged(per_request(4, 10, 0), end_ns=43 * S, exit_at=42 * S)
    assert result.findings == []
    (cache,) = result.not_leaks
    assert (cache.reason, cache.resets, cache.within_slope_bytes_per_step) == ("sawtooth", 3, 24 * KiB)


def test_keeping_something_from_every_request_grows_even_when_freed_before_the_end():
    result = judged(per_request(4, 10, 300 * KiB), end_ns=43 * S, exit_at=42 * S)
    (kept,) = result.findings
    assert (kept.kind, kept.reason, kept.stack_id, kept.released_before_end) == ("grows_per_step", "grows", 6, True)
    assert (kept.live_count, kept.live_bytes) == (3, 3 * 300 * KiB)  # at its highest checkpoint (the 4th comes after the last step)
    assert [f.reason for f in result.not_leaks] == ["sawtooth"]


def test_one_buffer_made_larger_each_step_then_released_is_a_requests_working_memory():
    """generate_kv.py's KV cache: one tensor per layer, replaced by a larger one (torch.cat)
    every token, all freed when generate returns, before the end. It grows in bytes, not in
    number: not a leak."""
    rows, live = [], None
    for step in range(1, 31):
        rows.append(dict(ts_ns=step * S, action="mark", category="step", step=step, pid=PID, tid=PID))
        addr = 0xE000_0000 + step * 0x10_0000
        rows.append(ev(step * S + S // 2, "alloc", addr, 24 * KiB * step, 5))
        if live is not None:
            rows.append(ev(step * S + S // 2 + 1, "free", live))
        live = addr
    rows.append(ev(int(31.5 * S), "free", live))
    result = judged(rows, end_ns=34 * S, exit_at=33 * S)
    assert result.findings == []
    (cache,) = result.not_leaks
    assert (cache.reason, cache.live_count, cache.released_before_end) == ("grows_within", 1, True)
    assert cache.slope_bytes_per_step == pytest.approx(24 * KiB)


@pytest.mark.parametrize("processes", [1, 3, 8, 9, 40])
def test_each_processes_first_python_allocation_is_the_same_by_either_way_of_finding_it(processes):
    """leaks._first_python_ns: one masked pass per process up to a few, one groupby past
    them; both give each wanted process's earliest allocation with Python frames, and leave
    out a process that has none."""
    from memprof.analysis import leaks as L
    rng = np.random.default_rng(processes)
    pid = rng.integers(100, 100 + processes + 2, 5000)  # two pids that are never wanted
    ts = rng.permutation(5000).astype(np.int64) * 10
    is_python = rng.random(5000) < 0.3
    is_python[pid == 100] = False  # a wanted process that never ran Python
    wanted = np.arange(100, 100 + processes)
    pids, firsts = L._first_python_ns(pid, ts, is_python, wanted)
    expected = {p: ts[is_python & (pid == p)].min() for p in wanted.tolist() if (is_python & (pid == p)).any()}
    assert dict(zip(pids.tolist(), firsts.tolist())) == expected and list(pids) == sorted(expected)


DDP = "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"


def test_ddps_gradient_buckets_are_framework_state_unless_they_grow():
    """A DDP run that keeps nothing (20 steps): its reducer's gradient bucket, rebuilt in the
    second step's forward and held to the exit, is DistributedDataParallel's state, not a
    leak (it failed `check --fail-on-leak` on every DDP run before 2026-12-07). A chain
    through the same frames that grows per step stays a leak, and so do the script's own
    tensor held to the exit and a function of that name in another file."""
    bucket = [_native("c10::DefaultCPUAllocator::allocate", "libc10.so"),
              _python("DistributedDataParallel._pre_forward", DDP, 1775),
              _python("DistributedDataParallel.forward", DDP, 1886), _python("<module>", "ddp.py", 13)]
    stacks, frames = stacks_frames({
        1: bucket,
        2: bucket[:1] + [_python("DistributedDataParallel._pre_forward", DDP, 1780)] + bucket[2:],
        3: [_native("c10::DefaultCPUAllocator::allocate", "libc10.so"), _python("<module>", "ddp.py", 20)],
        4: [_native("c10::DefaultCPUAllocator::allocate", "libc10.so"),
            _python("DistributedDataParallel._pre_forward", "/home/me/my_ddp/distributed.py", 10)],
    })
    assert known_chains(stacks, frames).framework_state == frozenset({1, 2})
    rows = step_marks(20) + [ev(2 * S + 5, "alloc", 0x100, 139 * KiB, 1), ev(3 * S + 5, "alloc", 0x200, KiB, 3),
                             ev(3 * S + 6, "alloc", 0x300, KiB, 4)]
    rows += [ev(k * S + 9, "alloc", 0x1_0000 + k * 0x1000, 4 * KiB, 2) for k in range(1, 21)]
    result = judged(rows, end_ns=21 * S, recording_end_ns=22 * S, exit_at=21 * S, known=known_chains(stacks, frames))
    assert sorted((f.stack_id, f.kind) for f in result.findings) == [
        (2, "grows_per_step"), (3, "held_at_end"), (4, "held_at_end")]
    assert [(f.stack_id, f.reason, f.live_bytes) for f in result.not_leaks] == [(1, "framework_state", 139 * KiB)]
