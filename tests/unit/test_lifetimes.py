"""pair_lifetimes: known answers for the pairing and loss rules of DESIGN.md §3."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import ALLOCATION_COLUMNS, pair_lifetimes
from tests.factories import ev, events_frame, mark, random_lifetimes


def ends(lifetimes) -> list[tuple]:
    """(addr, alloc_ts_ns, end_ts_ns or None, end_kind) per allocation, in timeline order."""
    a = lifetimes.allocations
    return [(int(r.addr), int(r.alloc_ts_ns), None if pd.isna(r.end_ts_ns) else int(r.end_ts_ns), r.end_kind)
            for r in a.itertuples(index=False)]


def test_simple_pairs():
    lt = pair_lifetimes(events_frame([
        (100, "alloc", 0xA0, 64, 1), (150, "alloc", 0xB0, 32, 2), (200, "free", 0xA0), (300, "free", 0xB0),
    ]))
    assert ends(lt) == [(0xA0, 100, 200, "freed"), (0xB0, 150, 300, "freed")]
    assert lt.unmatched_frees == {} and lt.missed_frees == {}
    assert list(lt.allocations.columns) == ALLOCATION_COLUMNS
    assert lt.allocations["size_bytes"].tolist() == [64, 32]
    assert lt.allocations["stack_id"].tolist() == [1, 2]
    assert str(lt.allocations["end_ts_ns"].dtype) == "Int64"


def test_alloc_without_free_is_live_to_the_end():
    lt = pair_lifetimes(events_frame([(100, "alloc", 0xA0, 64), (200, "alloc", 0xB0, 64), (300, "free", 0xB0)]))
    assert ends(lt) == [(0xA0, 100, None, "live"), (0xB0, 200, 300, "freed")]


def test_free_without_alloc_is_unmatched_not_paired():
    lt = pair_lifetimes(events_frame([(100, "free", 0xA0), (200, "alloc", 0xB0, 8), (300, "free", 0xB0)]))
    assert ends(lt) == [(0xB0, 200, 300, "freed")]
    assert lt.unmatched_frees == {"native_heap": 1}


def test_duplicate_free_is_unmatched():
    lt = pair_lifetimes(events_frame([(100, "alloc", 0xA0, 8), (200, "free", 0xA0), (300, "free", 0xA0)]))
    assert ends(lt) == [(0xA0, 100, 200, "freed")]
    assert lt.unmatched_frees == {"native_heap": 1}


def test_alloc_at_live_address_closes_the_old_one_as_missed_free():
    lt = pair_lifetimes(events_frame([
        (100, "alloc", 0xA0, 64), (200, "alloc", 0xA0, 16), (300, "alloc", 0xA0, 8), (400, "free", 0xA0),
    ]))
    assert ends(lt) == [(0xA0, 100, 200, "missed"), (0xA0, 200, 300, "missed"), (0xA0, 300, 400, "freed")]
    assert lt.missed_frees == {"native_heap": 2}
    assert (lt.allocations["end_kind"] != "live").all()


def test_alloc_id_is_preferred_over_addr():
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", 0xA0, 64, alloc_id=1, layer="cuda_block", device="cuda:0"),
        ev(200, "alloc", 0xA0, 64, alloc_id=2, layer="cuda_block", device="cuda:0"),  # same addr, new id
        ev(300, "free", 0xFF, alloc_id=1, layer="cuda_block", device="cuda:0"),  # addr differs, id matches
    ]))
    assert ends(lt) == [(0xA0, 100, 300, "freed"), (0xA0, 200, None, "live")]
    assert lt.missed_frees == {} and lt.unmatched_frees == {}


def test_same_addr_in_different_layers_and_devices_is_independent():
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", 0xA0, 64, layer="native_heap"),
        ev(110, "alloc", 0xA0, 64, layer="kernel_slab"),
        ev(120, "alloc", 0xA0, 64, layer="cuda_driver", device="cuda:0"),
        ev(130, "alloc", 0xA0, 64, layer="cuda_driver", device="cuda:1"),
        ev(200, "free", 0xA0, layer="kernel_slab"),
        ev(210, "free", 0xA0, layer="cuda_driver", device="cuda:1"),
    ]))
    assert ends(lt) == [(0xA0, 100, None, "live"), (0xA0, 110, 200, "freed"),
                        (0xA0, 120, None, "live"), (0xA0, 130, 210, "freed")]
    assert lt.allocations["layer"].astype(str).tolist() == ["native_heap", "kernel_slab", "cuda_driver", "cuda_driver"]
    assert lt.missed_frees == {} and lt.unmatched_frees == {}


def test_a_user_space_address_belongs_to_its_process_and_a_kernel_one_to_none():
    """Two workers forked from one parent hand out the same heap addresses: each one's
    allocation at 0xA0 is its own, freed only by its own free (before 2026-12-07 the second
    closed the first as a missed free, and half of what forked workers leaked went
    uncounted). The kernel has one address space: its object is freed on any task's time."""
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", 0xA0, 64, pid=201, tid=201), ev(110, "alloc", 0xA0, 64, pid=202, tid=202),
        ev(120, "alloc", 0xA0, 64, layer="torch_cpu", pid=201, tid=201),
        ev(130, "alloc", 0xB0, 32, layer="kernel_slab", pid=201, tid=201),
        ev(200, "free", 0xA0, pid=202, tid=202), ev(210, "free", 0xB0, layer="kernel_slab", pid=202, tid=202),
        ev(220, "free", 0xA0, layer="torch_cpu", pid=202, tid=202),  # another process's: not this block
    ]))
    assert ends(lt) == [(0xA0, 100, None, "live"), (0xA0, 110, 200, "freed"), (0xA0, 120, None, "live"),
                        (0xB0, 130, 210, "freed")]
    assert lt.missed_frees == {} and lt.unmatched_frees == {"torch_cpu": 1}


def test_values_past_48_bits_are_scoped_by_process_too():
    """The pid goes above a user address's 48 bits; an id or a file's address past them
    (no real user address is) is scoped by a second hashing instead, just as exactly."""
    high = (1 << 63) + 0xA0
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", high, 64, pid=201, tid=201), ev(110, "alloc", high, 64, pid=202, tid=202),
        ev(200, "free", high, pid=202, tid=202),
    ]))
    assert ends(lt) == [(high, 100, None, "live"), (high, 110, 200, "freed")]
    assert lt.missed_frees == {} and lt.unmatched_frees == {}


def test_free_requested_ends_and_its_completion_is_not_unmatched():
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", 0xA0, 512, alloc_id=7, layer="cuda_block"),
        ev(200, "free_requested", 0xA0, alloc_id=7, layer="cuda_block"),
        ev(250, "free", 0xA0, alloc_id=7, layer="cuda_block"),
        ev(300, "free_requested", 0xA0, alloc_id=7, layer="cuda_block"),  # a second request: unmatched
    ]))
    assert ends(lt) == [(0xA0, 100, 200, "freed")]
    assert lt.unmatched_frees == {"cuda_block": 1}


def test_alloc_carries_its_own_columns_and_free_size_is_irrelevant():
    lt = pair_lifetimes(events_frame([
        ev(100, "alloc", 0xA0, 100, 9, requested_bytes=90, pid=7, tid=8),
        ev(200, "free", 0xA0, size_bytes=None, pid=1, tid=1, stack_id=3),
    ]))
    row = lt.allocations.iloc[0]
    assert (row.pid, row.tid, row.stack_id, row.size_bytes, row.requested_bytes) == (7, 8, 9, 100, 90)


def test_order_is_ts_then_seq_regardless_of_row_order():
    rows = [
        ev(100, "alloc", 0xA0, 8, seq=0),
        ev(200, "free", 0xA0, seq=2),
        ev(200, "alloc", 0xA0, 8, seq=3),  # same ts as the free: seq says it comes after
        ev(300, "free", 0xA0, seq=4),
    ]
    expected = [(0xA0, 100, 200, "freed"), (0xA0, 200, 300, "freed")]
    assert ends(pair_lifetimes(events_frame(rows))) == expected
    shuffled = pair_lifetimes(events_frame([rows[i] for i in (3, 1, 2, 0)]))
    assert sorted(ends(shuffled)) == expected
    assert shuffled.unmatched_frees == {} and shuffled.missed_frees == {}


def test_non_alloc_rows_are_ignored_and_empty_input_works():
    lt = pair_lifetimes(events_frame([ev(100, "mark", category="exit"), ev(150, "oom")]))
    assert lt.allocations.empty and list(lt.allocations.columns) == ALLOCATION_COLUMNS
    assert lt.unmatched_frees == {} and lt.missed_frees == {}


def test_plain_string_columns_work_like_categoricals():
    frame = events_frame([(100, "alloc", 0xA0, 8), (200, "free", 0xA0), (300, "free", 0xB0)])
    for name in ("layer", "action", "device", "category"):
        frame[name] = frame[name].astype(object)
    lt = pair_lifetimes(frame)
    assert ends(lt) == [(0xA0, 100, 200, "freed")]
    assert lt.unmatched_frees == {"native_heap": 1}


def _reference(frame: pd.DataFrame):
    """Per-event Python pairing, the obvious way, to check the vectorized one against."""
    rows = frame.sort_values(["ts_ns", "seq"]).itertuples(index=False)
    last: dict = {}
    result, unmatched, missed = {}, 0, 0
    for r in rows:
        scope = None if r.layer in ("kernel_slab", "kernel_page") else r.pid  # a process's own address space
        key = (r.layer, r.device, scope, ("id", r.alloc_id) if not pd.isna(r.alloc_id) else ("addr", r.addr))
        prev = last.get(key)
        if r.action == "alloc":
            if prev is not None and prev[0] == "alloc":
                result[prev[1]] = (r.ts_ns, "missed")
                missed += 1
            result[r.seq] = (None, "live")
        elif prev is not None and prev[0] == "alloc":
            result[prev[1]] = (r.ts_ns, "freed")
        elif not (r.action == "free" and prev is not None and prev[0] == "free_requested"):
            unmatched += 1
        last[key] = (r.action, r.seq)
    return result, unmatched, missed


def test_matches_a_per_event_reference_on_random_collisions():
    rng = np.random.default_rng(42)
    n = 3000
    frame = events_frame([
        ev(int(t), a, int(addr), 8, alloc_id=(int(aid) if aid >= 0 else None), layer=layer, seq=i, pid=int(pid))
        for i, (t, a, addr, aid, layer, pid) in enumerate(zip(
            rng.integers(0, 500, n), rng.choice(["alloc", "alloc", "free", "free_requested"], n),
            rng.integers(0, 20, n), rng.integers(-10, 5, n), rng.choice(["native_heap", "kernel_slab"], n),
            rng.choice([100, 101, 102], n)))
    ])
    result, unmatched, missed = _reference(frame)
    lt = pair_lifetimes(frame)
    alloc_seqs = frame.loc[frame["action"] == "alloc"].sort_values(["ts_ns", "seq"])["seq"]
    got = {int(s): (None if pd.isna(e) else int(e), k) for s, e, k in zip(
        frame.loc[frame["action"] == "alloc", "seq"], lt.allocations["end_ts_ns"], lt.allocations["end_kind"])}
    assert got == {int(s): result[s] for s in alloc_seqs}
    assert sum(lt.unmatched_frees.values()) == unmatched
    assert sum(lt.missed_frees.values()) == missed


def test_speed_smoke_two_million_events(capsys):
    frame = random_lifetimes(1_000_000)
    started = time.perf_counter()
    lt = pair_lifetimes(frame)
    seconds = time.perf_counter() - started
    with capsys.disabled():
        print(f"\npair_lifetimes: {len(frame):,} events in {seconds:.2f}s = {len(frame) / seconds:,.0f} events/s")
    assert len(lt.allocations) == 1_000_000
    assert (lt.allocations["end_kind"] == "live").sum() + (lt.allocations["end_kind"] == "freed").sum() \
        + sum(lt.missed_frees.values()) == 1_000_000


# ---- an exec ends the user-space allocations of the image it replaced ----

def _exec_frame(*rows):
    return events_frame(list(rows), pid=7)


def test_exec_frees_what_the_old_image_still_held():
    lt = pair_lifetimes(_exec_frame(
        (100, "alloc", 0xA0, 64), (150, "alloc", 0xB0, 32), (160, "free", 0xB0),
        mark(200, 7, "exec"),
        (300, "alloc", 0xC0, 16)))
    assert ends(lt) == [(0xA0, 100, 200, "freed"), (0xB0, 150, 160, "freed"), (0xC0, 300, None, "live")]
    assert lt.missed_frees == {} and lt.unmatched_frees == {}


def test_exec_leaves_kernel_layers_and_other_processes_alone():
    lt = pair_lifetimes(_exec_frame(
        ev(100, "alloc", 0xA0, 64, layer="kernel_slab"), ev(110, "alloc", 0xA1, 4096, layer="kernel_page"),
        ev(120, "alloc", 0xB0, 64, pid=8), ev(130, "alloc", 0xB1, 64, layer="torch_cpu"),
        mark(200, 7, "exec")))
    assert ends(lt) == [(0xA0, 100, None, "live"), (0xA1, 110, None, "live"), (0xB0, 120, None, "live"),
                        (0xB1, 130, 200, "freed")]


def test_an_address_the_new_image_hands_out_again_is_not_a_missed_free():
    lt = pair_lifetimes(_exec_frame((100, "alloc", 0xA0, 64), mark(200, 7, "exec"), (300, "alloc", 0xA0, 64)))
    assert ends(lt) == [(0xA0, 100, 200, "freed"), (0xA0, 300, None, "live")]
    assert lt.missed_frees == {}


def test_each_allocation_ends_at_the_first_exec_after_it():
    lt = pair_lifetimes(_exec_frame(
        (100, "alloc", 0xA0, 64), mark(200, 7, "exec"), (250, "alloc", 0xB0, 8), mark(300, 7, "exec"),
        (400, "alloc", 0xC0, 8), mark(450, 7, "a user mark")))
    assert ends(lt) == [(0xA0, 100, 200, "freed"), (0xB0, 250, 300, "freed"), (0xC0, 400, None, "live")]


def test_exec_marks_in_plain_string_columns_count_too():
    frame = _exec_frame((100, "alloc", 0xA0, 64), mark(200, 7, "exec"))
    for name in ("action", "category"):
        frame[name] = frame[name].astype(object)
    assert ends(pair_lifetimes(frame)) == [(0xA0, 100, 200, "freed")]


def test_a_stream_of_batches_ends_a_carried_allocation_at_a_later_exec():
    from memprof.analysis.fold import PairingStream
    frame = _exec_frame((100, "alloc", 0xA0, 64), (150, "alloc", 0xB0, 8), mark(200, 7, "exec"))
    stream = PairingStream()
    first = stream.feed(frame.iloc[:2].reset_index(drop=True))
    second = stream.feed(frame.iloc[2:].reset_index(drop=True))
    assert first.empty
    assert sorted(second["end_ts_ns"].tolist()) == [200, 200]
    assert stream.finish().empty


def test_a_stream_of_allocation_batches_takes_the_execs_apart():
    """A folded analysis streams only allocation rows; the exec comes from the marks read
    apart, and ends what was held in the batch that reaches its time, not before."""
    from memprof.analysis.fold import PairingStream
    frame = _exec_frame((100, "alloc", 0xA0, 64), (150, "alloc", 0xB0, 8), (250, "alloc", 0xC0, 8))
    stream = PairingStream(execs={7: np.array([200])})
    first = stream.feed(frame.iloc[:2].reset_index(drop=True))  # up to 150: the exec is still to come
    second = stream.feed(frame.iloc[2:].reset_index(drop=True))
    assert first.empty
    assert sorted(zip(second["addr"].tolist(), second["end_ts_ns"].tolist())) == [(0xA0, 200), (0xB0, 200)]
    assert stream.finish()["addr"].tolist() == [0xC0]
