"""Issue 23 item 1: folding old events (analysis/compaction.py). Counts and bytes of what is
folded stay exact; what is live at every window edge, at the end and at each peak is kept
row for row; folding again changes nothing."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memprof.analysis.compaction import FOLDED_ADDRESS_BASE, fold_events
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import NEVER, pair_lifetimes
from tests.factories import events_frame, mark

MS = 1_000_000
S = 1000 * MS


def churn(first_ts: int, n: int, size: int, stack: int, addr: int = 0x1000, gap: int = MS, life: int = MS // 2):
    """`n` allocations of `size` bytes at one address, each freed `life` ns after it was made."""
    rows = []
    for i in range(n):
        ts = first_ts + i * gap
        rows += [(ts, "alloc", addr, size, stack), (ts + life, "free", addr)]
    return rows


def spike(ts: int = 700 * MS, pid: int = 100):
    """A short allocation bigger than everything else: the peak, of its layer and of `pid`,
    is there, and only it is kept for being live at a peak."""
    return [dict(ts_ns=ts, action="alloc", addr=0xF000, size_bytes=100_000, stack_id=99, pid=pid, tid=pid),
            dict(ts_ns=ts + 1, action="free", addr=0xF000, pid=pid, tid=pid)]


def folded(rows, window_ns=S, **kw):
    return fold_events(events_frame(rows), origin_ns=0, window_ns=window_ns, **kw)


def totals(events: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Per stack: (allocations, bytes), weighted."""
    allocs = pair_lifetimes(events).allocations
    weight = allocs["weight"].to_numpy()
    size = allocs["size_bytes"].to_numpy(dtype=float, na_value=0)
    frame = pd.DataFrame({"stack": allocs["stack_id"].to_numpy(dtype=float, na_value=-1), "n": weight,
                          "bytes": size * weight})
    return {int(k): (v.n, v.bytes) for k, v in frame.groupby("stack").sum().iterrows()}


def peak(events: pd.DataFrame) -> tuple[int, int]:
    """(time, bytes) of the earliest highest live bytes, as layers.live_curve gives them."""
    allocs = pair_lifetimes(events).allocations
    end = allocs["end_ts_ns"].to_numpy(dtype=np.int64, na_value=NEVER)
    size = np.rint(allocs["size_bytes"].to_numpy(dtype=float, na_value=0) * allocs["weight"].to_numpy())
    times, live = live_curve(allocs["alloc_ts_ns"].to_numpy(), end, size.astype(np.int64))
    return int(times[np.argmax(live)]), int(live.max())


def test_churn_within_a_window_becomes_one_pair_with_its_count_and_bytes():
    """100 allocations of 64 B, each freed at once: one allocation standing for 100, freed
    at the instant of the first (the spike elsewhere is the peak, kept as it was)."""
    result = folded(churn(10 * MS, 100, 64, stack=7) + spike())
    assert (result.folded_pairs, result.groups, result.protected) == (100, 1, 1)
    allocs = pair_lifetimes(result.events).allocations
    assert len(allocs) == 2 and len(result.events) == 4
    [row] = allocs[allocs["stack_id"] == 7].itertuples()
    assert (row.weight, row.size_bytes, row.stack_id, row.end_kind) == (100.0, 64, 7, "freed")
    assert row.alloc_ts_ns == row.end_ts_ns == 10 * MS  # the first allocation's instant
    assert row.addr == FOLDED_ADDRESS_BASE


def test_sizes_that_differ_keep_bytes_exact_with_a_second_pair():
    rows = [(1 * MS, "alloc", 0x10, 10, 3), (2 * MS, "free", 0x10),
            (3 * MS, "alloc", 0x20, 11, 3), (4 * MS, "free", 0x20),
            (5 * MS, "alloc", 0x30, 11, 3), (6 * MS, "free", 0x30)] + spike()
    result = folded(rows)
    allocs = pair_lifetimes(result.events).allocations
    allocs = allocs[allocs["stack_id"] == 3]
    assert sorted(zip(allocs["size_bytes"], allocs["weight"].fillna(1))) == [(10, 1.0), (11, 2.0)]
    assert totals(result.events)[3] == (3.0, 32.0)
    assert sorted(allocs["addr"]) == [FOLDED_ADDRESS_BASE, FOLDED_ADDRESS_BASE + 1]


def test_what_outlives_its_window_is_kept_row_for_row():
    """A leak (never freed) and an allocation freed in the next window stay as they were,
    so the live bytes at each window edge and at the end are exact."""
    rows = churn(10 * MS, 50, 64, stack=1) + [
        (500 * MS, "alloc", 0x9000, 4096, 2),                      # never freed: the leak
        (900 * MS, "alloc", 0x8000, 1024, 3), (1100 * MS, "free", 0x8000),  # crosses the edge at 1 s
    ]
    result = folded(rows)
    kept = result.events[result.events["addr"] < FOLDED_ADDRESS_BASE]
    assert sorted(zip(kept["ts_ns"], kept["action"].astype(str))) == \
        [(500 * MS, "alloc"), (900 * MS, "alloc"), (1100 * MS, "free")]
    assert totals(result.events) == totals(events_frame(rows))
    live = pair_lifetimes(result.events).allocations
    assert live[live["end_kind"] == "live"]["size_bytes"].tolist() == [4096]


def test_allocations_live_at_the_peak_are_kept_and_the_peak_is_exact():
    """Ten buffers of 1 KiB held together once (the layer's peak) among 200 short ones of 64 B:
    the ten stay as they were, so the peak's time, bytes and chains are the recording's."""
    spike = []
    for i in range(10):
        spike.append((600 * MS + i, "alloc", 0x50000 + i * 0x1000, 1024, 9))
    spike += [(601 * MS + i, "free", 0x50000 + i * 0x1000) for i in range(10)]
    rows = churn(10 * MS, 200, 64, stack=1) + spike
    original = events_frame(rows)
    result = folded(rows)
    assert peak(result.events) == peak(original) == (600 * MS + 9, 10 * 1024)
    assert result.protected == 10
    kept = result.events[result.events["addr"] < FOLDED_ADDRESS_BASE]
    assert set(kept["stack_id"].dropna()) == {9} and len(kept) == 20


def test_each_process_keeps_its_own_peak():
    """pid 200's highest point is lower than pid 100's, at another time: it is kept too."""
    rows = [dict(ts_ns=100 * MS, action="alloc", addr=0x10, size_bytes=8192, stack_id=1, pid=100),
            dict(ts_ns=101 * MS, action="free", addr=0x10, pid=100),
            dict(ts_ns=300 * MS, action="alloc", addr=0x20, size_bytes=512, stack_id=2, pid=200),
            dict(ts_ns=301 * MS, action="free", addr=0x20, pid=200),
            dict(ts_ns=400 * MS, action="alloc", addr=0x30, size_bytes=64, stack_id=2, pid=200),
            dict(ts_ns=401 * MS, action="free", addr=0x30, pid=200)]
    result = fold_events(events_frame(rows), origin_ns=0, window_ns=S)
    assert result.protected == 2 and result.folded_pairs == 1
    kept = result.events[result.events["addr"] < FOLDED_ADDRESS_BASE]
    assert sorted(kept["size_bytes"].dropna()) == [512, 8192]


def test_rows_that_are_not_allocations_or_frees_stay():
    rows = churn(10 * MS, 5, 64, stack=1) + [mark(20 * MS, 100), (30 * MS, "free", 0x7777)] + spike()
    result = folded(rows)
    others = result.events[(result.events["addr"] < FOLDED_ADDRESS_BASE) & (result.events["addr"] != 0xF000)]
    assert sorted(others["action"].astype(str)) == ["free", "mark"]
    assert pair_lifetimes(result.events).unmatched_frees == {"native_heap": 1}


def test_sampled_allocations_keep_their_weighted_count_and_bytes():
    rows = [dict(ts_ns=1 * MS, action="alloc", addr=0x10, size_bytes=3000, stack_id=4, weight=2.73),
            dict(ts_ns=2 * MS, action="free", addr=0x10),
            dict(ts_ns=3 * MS, action="alloc", addr=0x10, size_bytes=3000, stack_id=4, weight=2.73),
            dict(ts_ns=4 * MS, action="free", addr=0x10)]
    [(n, nbytes)] = totals(folded(rows).events).values()
    assert n == pytest.approx(5.46) and nbytes == pytest.approx(2 * 3000 * 2.73, abs=3)


def test_groups_keep_processes_threads_chains_and_windows_apart():
    rows = (churn(10 * MS, 3, 64, stack=1) + churn(20 * MS, 3, 64, stack=2, addr=0x2000)
            + churn(1200 * MS, 3, 64, stack=1, addr=0x3000)
            + [dict(r, pid=300, tid=301) for r in (
                dict(ts_ns=40 * MS, action="alloc", addr=0x4000, size_bytes=64, stack_id=1),
                dict(ts_ns=41 * MS, action="free", addr=0x4000))]) + spike() + spike(800 * MS, pid=300)
    result = folded(rows)
    assert result.groups == 4
    assert totals(result.events) == totals(events_frame(rows))


def test_folding_again_changes_nothing():
    rows = churn(10 * MS, 40, 64, stack=1) + churn(15 * MS, 7, 100, stack=2, addr=0x2000, gap=3 * MS) + [
        (3 * MS, "alloc", 0x10, 10, 5), (4 * MS, "free", 0x10), (5 * MS, "alloc", 0x10, 11, 5), (6 * MS, "free", 0x10),
        (500 * MS, "alloc", 0x9000, 4096, 2)]
    once = folded(rows).events
    twice = fold_events(once, origin_ns=0, window_ns=S).events
    columns = ["ts_ns", "seq", "addr", "size_bytes", "weight", "stack_id"]
    pd.testing.assert_frame_equal(once[columns], twice[columns])


def test_a_window_under_one_ns_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        folded(churn(0, 2, 8, stack=1), window_ns=0)


def test_the_allocation_that_ends_one_by_a_missed_free_stays():
    """0x10 is allocated, its free unseen (an RCU free outside the target, say), then
    allocated again and freed: the second allocation closes the first as a missed free, so
    it stays, even though it was freed within its window; folding it would leave the first
    live to the end."""
    rows = [(1 * MS, "alloc", 0x10, 512, 1), (5 * MS, "alloc", 0x10, 512, 1), (6 * MS, "free", 0x10)] + spike()
    original, result = events_frame(rows), folded(rows)
    assert result.folded_pairs == 0
    ends = pair_lifetimes(result.events).allocations.set_index("alloc_ts_ns")["end_kind"].astype(str)
    assert ends[1 * MS] == "missed" and ends[5 * MS] == "freed"
    assert pair_lifetimes(original).missed_frees == pair_lifetimes(result.events).missed_frees == {"native_heap": 1}


def test_frees_of_allocations_never_seen_are_dropped_and_counted_once_settled():
    """A kernel object allocated where the probes do not see it and freed by the target:
    its free follows no allocation. Dropped and counted when older than `settled_before_ns`
    (its allocation cannot still be coming), kept when newer; matched frees are untouched."""
    rows = [(1 * MS, "free", 0x70), (2 * MS, "free", 0x71), (900 * MS, "free", 0x72),
            (3 * MS, "alloc", 0x80, 64, 1), (4 * MS, "free", 0x80)] + spike()
    result = folded(rows, settled_before_ns=500 * MS)
    assert result.unmatched_frees_dropped == {"native_heap": 2}
    frees = result.events[result.events["action"] == "free"]
    assert 0x72 in set(frees["addr"]) and not {0x70, 0x71} & set(frees["addr"])
    assert totals(result.events) == totals(events_frame(rows))
    assert folded(rows).unmatched_frees_dropped == {}  # None: every free kept


def _earliest_highest_by_brute_force(group, alloc_ts, end_ts, nbytes) -> dict[int, int]:
    """Per group: the earliest instant at which its live bytes, after all its events at that
    instant, are highest; walked event by event."""
    out = {}
    for g in set(group.tolist()):
        mine = group == g
        changes: dict[int, float] = {}
        for a, e, b in zip(alloc_ts[mine], end_ts[mine], nbytes[mine]):
            changes[a] = changes.get(a, 0.0) + b
            if e != NEVER:
                changes[e] = changes.get(e, 0.0) - b
        live, best, best_at = 0.0, None, None
        for t in sorted(changes):
            live += changes[t]
            if best is None or live > best:
                best, best_at = live, t
        out[g] = best_at
    return out


def test_each_groups_peak_instant_is_the_earliest_highest():
    """The fold keeps what is live at each group's peak; its peak instants (numpy alone since
    the fold's memory was cut) against a walk of 2,000 random groupings, ties and
    allocations that live to the end among them."""
    from memprof.analysis.compaction import _peak_instants
    rng = np.random.default_rng(7)
    for _ in range(2000):
        n = int(rng.integers(1, 40))
        group = rng.integers(0, int(rng.integers(1, 5)), n).astype(np.int64)
        alloc_ts = rng.integers(0, 15, n).astype(np.int64)
        end_ts = np.where(rng.random(n) < 0.3, NEVER, alloc_ts + rng.integers(0, 8, n)).astype(np.int64)
        nbytes = rng.integers(0, 4, n).astype(float)
        got = _peak_instants(group, alloc_ts, end_ts, nbytes)
        want = _earliest_highest_by_brute_force(group, alloc_ts, end_ts, nbytes)
        assert {g: int(got[g]) for g in want} == want, (group, alloc_ts, end_ts, nbytes)
    empty = np.zeros(0, dtype=np.int64)
    assert _peak_instants(empty, empty, empty, np.zeros(0)).size == 0


def test_a_chunk_without_allocations_folds():
    """Frees alone (of allocations from before the recording) and a mark: nothing to fold, and
    the frees before the settled instant are dropped and counted. The peak instants of no
    allocation raised IndexError before the fold's memory was cut (b88d022), which stopped
    such a fold."""
    rows = [(1 * MS, "free", 0x1000), (2 * MS, "free", 0x2000), mark(3 * MS, pid=100)]
    result = folded(rows, settled_before_ns=10 * MS)
    assert (result.folded_pairs, result.groups, result.protected) == (0, 0, 0)
    assert result.unmatched_frees_dropped == {"native_heap": 2}
    assert list(result.events["action"].astype(str)) == ["mark"]
