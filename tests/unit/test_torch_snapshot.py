"""CUDA memory snapshots → timeline rows (memprof/sources/torch_import/snapshot.py, torch_trace.py),
over the hand-built fixtures of tests/data/ (tests/data/make_snapshot_fixtures.py) and small
hand-written dicts for each format quirk."""
from __future__ import annotations

import pickle
import sys
from collections import Counter
from pathlib import Path

import pytest

from memprof.analysis.lifetimes import pair_lifetimes
from memprof.errors import BadInputError, UnsafeInputError
from memprof.sources.symbols.frame_interner import FrameInterner
from memprof.sources.torch_import.safe_pickle import load_plain, loads_plain
from memprof.sources.torch_import.snapshot import check_snapshot, realtime_ns, snapshot_rows, trace_rows
from memprof.sources.torch_import.trace import MAX_LABELS, TraceConverter
from tests.factories import typed_events

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
import make_snapshot_fixtures as fx  # noqa: E402

MiB = 1 << 20
T0_NS = fx.T0_US * 1000


def rows_of(name: str, to_ns=realtime_ns, **kw):
    return snapshot_rows(load_plain(DATA / name), to_ns, **kw)


def table(events: dict) -> list[dict]:
    """Events columns as row dicts, in seq order."""
    keys = list(events)
    return [dict(zip(keys, values)) for values in zip(*(events[k] for k in keys))]


def pick(rows: list[dict], **where) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def frames_of(result, stack_id: int) -> list[tuple]:
    """(kind, function, file, line) of a stack, innermost first."""
    stacks, frames = result.stacks, result.frames
    ids = [f for s, f in zip(stacks["stack_id"], stacks["frame_id"]) if s == stack_id]
    by_id = {fid: (k, fn, file, line) for fid, k, fn, file, line in
             zip(frames["frame_id"], frames["kind"], frames["function"], frames["file"], frames["line"])}
    return [by_id[f] for f in ids]


def lifetimes(events: dict):
    return pair_lifetimes(typed_events(events))


# --- fixtures -----------------------------------------------------------------------------

def test_generator_reproduces_the_committed_fixtures():
    for name, data in fx.all_files().items():
        assert (DATA / name).read_bytes() == data, f"{name} differs: rerun tests/data/make_snapshot_fixtures.py"


# --- the leak fixture: counts, bytes, layers, actions, frames -----------------------------

def test_leak_rows_counts_and_bytes():
    result = rows_of("handbuilt_snapshot_leak.pickle")
    rows = table(result.events)
    # 97 entries: 1 segment_alloc, 23 x 4, 3 for the temporary, 1 snapshot (no row);
    # + 2 annotation marks + 3 rows for the held blocks the trace lost + 1 for their segment.
    assert len(rows) == 96 + 2 + 3 + 1
    assert result.stats["entries"] == 97 and result.stats["events"] == 102
    counts = Counter((r["layer"], r["action"]) for r in rows)
    assert counts == {("cuda_block", "alloc"): 23 + 23 + 1 + 2, ("cuda_block", "free_requested"): 23 + 1 + 1,
                      ("cuda_block", "free"): 23 + 1, ("cuda_segment", "alloc"): 2, (None, "mark"): 2}
    assert {r["device"] for r in rows} == {"cuda:0"} and result.stats["devices"] == ["cuda:0"]
    assert {r["pid"] for r in rows} == {0} and {r["tid"] for r in rows} == {0}
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    leaks = pick(rows, action="alloc", size_bytes=fx.LEAK_SIZE)
    assert len(leaks) == fx.LEAK_COUNT
    assert sorted(r["addr"] for r in leaks) == [fx.LEAK_BASE + i * MiB for i in range(fx.LEAK_COUNT)]
    assert all(r["requested_bytes"] == MiB for r in leaks)
    assert [r["ts_ns"] for r in leaks] == [T0_NS + (i * fx.STEP_US + 20) * 1000 for i in range(fx.LEAK_COUNT)]


def test_leaking_line_is_the_innermost_python_frame_and_one_stack():
    result = rows_of("handbuilt_snapshot_leak.pickle")
    leaks = pick(table(result.events), action="alloc", size_bytes=fx.LEAK_SIZE)
    assert len({r["stack_id"] for r in leaks}) == 1
    chain = frames_of(result, leaks[0]["stack_id"])
    assert chain == [("python", "cache_batch", fx.LEAK_FILE, 42), ("python", "train_step", fx.LEAK_FILE, 88),
                     ("python", "main", fx.LEAK_FILE, 120)]
    activation = pick(table(result.events), action="alloc", size_bytes=4 * MiB)[0]
    assert frames_of(result, activation["stack_id"])[0][:2] == ("native", "c10::cuda::CUDACachingAllocator::malloc")
    # Every frame and every chain is stored once.
    frames = list(zip(result.frames["function"], result.frames["file"], result.frames["line"]))
    assert len(frames) == len(set(frames)) == len(result.frames["frame_id"])


def test_pairing_leaves_the_23_leaks_and_the_lost_blocks_live():
    result = rows_of("handbuilt_snapshot_leak.pickle")
    lt = lifetimes(result.events)
    live = lt.allocations[lt.allocations["end_kind"] == "live"]
    blocks = live[live["layer"] == "cuda_block"]
    assert sorted(blocks["size_bytes"].tolist()) == [MiB] * 23 + [8 * MiB]
    assert lt.unmatched_frees == {} and lt.missed_frees == {}
    segments = live[live["layer"] == "cuda_segment"]
    assert sorted(segments["size_bytes"].tolist()) == [20 * MiB, 64 * MiB]


def test_blocks_the_trace_lost_are_allocated_at_its_first_time_before_every_trace_row():
    result = rows_of("handbuilt_snapshot_leak.pickle")
    rows = table(result.events)
    weight, pending = pick(rows, addr=fx.SEG0, layer="cuda_block"), pick(rows, addr=fx.SEG0 + 8 * MiB)
    assert [(r["action"], r["ts_ns"], r["size_bytes"], r["requested_bytes"]) for r in weight] == [
        ("alloc", T0_NS, 8 * MiB, 8 * MiB - 100)]
    assert frames_of(result, weight[0]["stack_id"])[0] == ("python", "__init__", "/work/job/model.py", 10)
    # Pending free: allocated from the first time, its free requested by the snapshot's time.
    assert [(r["action"], r["ts_ns"]) for r in pending] == [("alloc", T0_NS), ("free_requested", fx.SNAPSHOT_US * 1000)]
    first_trace_row = pick(rows, layer="cuda_segment", addr=fx.SEG1)[0]
    assert weight[0]["seq"] < first_trace_row["seq"] and weight[0]["ts_ns"] == first_trace_row["ts_ns"]
    stats = result.stats
    assert (stats["synthesized_blocks"], stats["synthesized_block_bytes"]) == (2, 10 * MiB)
    assert (stats["synthesized_segments"], stats["synthesized_segment_bytes"]) == (1, 20 * MiB)
    assert any("no alloc in its trace" in n and "2 CUDA blocks, 10.0 MiB" in n for n in stats["notes"])


def test_annotations_become_marks_and_settings_are_kept():
    result = rows_of("handbuilt_snapshot_leak.pickle")
    marks = pick(table(result.events), action="mark")
    assert [(m["category"], m["ts_ns"], m["layer"]) for m in marks] == [
        ("annotation:## forward ##", T0_NS + 5000, None), ("annotation:## forward ##:end", T0_NS + 25000, None)]
    assert result.stats["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    assert (result.stats["first_ns"], result.stats["last_ns"]) == (T0_NS, fx.SNAPSHOT_US * 1000)


def test_to_ns_decides_the_clock():
    offset = 123_456
    result = rows_of("handbuilt_snapshot_leak.pickle", to_ns=lambda us: us * 1000 - T0_NS + offset)
    assert min(result.events["ts_ns"]) == offset
    assert result.stats["last_ns"] == offset + 3_000_000_000


# --- expandable segments, OOM, legacy, truncated ring, missing times ---------------------

def test_expandable_segments_map_and_unmap_split_pieces():
    result = rows_of("handbuilt_snapshot_expandable.pickle")
    seg = [(r["action"], r["addr"] - fx.EXP, r["size_bytes"] // MiB, r["ts_ns"] - T0_NS)
           for r in pick(table(result.events), layer="cuda_segment")]
    assert seg == [("alloc", 0, 40, 0), ("alloc", 40 * MiB, 20, 20_000),
                   ("free", 0, 40, 60_000), ("alloc", 0, 20, 60_000), ("free", 40 * MiB, 20, 60_000)]
    lt = lifetimes(result.events)
    live = lt.allocations[(lt.allocations["end_kind"] == "live") & (lt.allocations["layer"] == "cuda_segment")]
    assert live["size_bytes"].tolist() == [20 * MiB]
    assert result.stats["expandable_segments"] and result.stats["synthesized_segments"] == 0
    assert result.stats["actions"]["segment_map"] == 2 and result.stats["actions"]["segment_unmap"] == 1


def test_unmap_in_the_middle_keeps_both_ends_and_unmap_of_unseen_map_is_one_free():
    conv = TraceConverter(0, realtime_ns, FrameInterner())
    rows = conv.rows([{"action": "segment_map", "addr": 0x1000_0000, "size": 60, "time_us": 1},
                      {"action": "segment_unmap", "addr": 0x1000_0000 + 20, "size": 20, "time_us": 2},
                      {"action": "segment_unmap", "addr": 0x2000_0000, "size": 8, "time_us": 3}])
    got = [(a, addr - 0x1000_0000, s) for a, addr, s in
           zip(rows.columns["action"], rows.columns["addr"], rows.columns["size_bytes"])]
    assert got == [("alloc", 0, 60), ("free", 0, 60), ("alloc", 0, 20), ("alloc", 40, 20),
                   ("free", 0x1000_0000, 8)]
    assert [(a, s) for a, s, _ in conv.mapped_pieces(0, 2**40)] == [(0x1000_0000, 20), (0x1000_0000 + 40, 20)]


def test_oom_row_carries_the_requested_bytes():
    result = rows_of("handbuilt_snapshot_oom.pickle")
    oom = pick(table(result.events), action="oom")
    assert [(r["layer"], r["addr"], r["size_bytes"], r["requested_bytes"], r["ts_ns"]) for r in oom] == [
        ("cuda_block", 0, 80 * 1024 * MiB, 80 * 1024 * MiB, T0_NS + 2000)]
    assert frames_of(result, oom[0]["stack_id"])[0][1] == "loss"
    assert any("1 out-of-memory error" in n and "80.0 GiB" in n for n in result.stats["notes"])
    assert pair_lifetimes(typed_events(result.events)).unmatched_frees == {}


def test_legacy_history_gives_held_blocks_address_size_and_frames():
    result = rows_of("handbuilt_snapshot_legacy_history.pickle")
    rows = table(result.events)
    block = pick(rows, layer="cuda_block")
    assert [(r["action"], r["addr"], r["size_bytes"], r["requested_bytes"], r["ts_ns"]) for r in block] == [
        ("alloc", fx.SEG0, 2 * MiB, 2 * MiB - 512, 0)]
    assert frames_of(result, block[0]["stack_id"])[0][1] == "cache_batch"
    assert pick(rows, layer="cuda_segment")[0]["size_bytes"] == 20 * MiB
    stats = result.stats
    assert stats["format"] == "legacy block history" and stats["legacy_past_allocations"] == 2
    assert any("no timestamps" in n for n in stats["notes"]) and any("block histories" in n for n in stats["notes"])


def test_truncated_ring_frees_first_are_unmatched_and_a_pending_block_gets_its_alloc():
    result = rows_of("handbuilt_snapshot_truncated_ring.pickle")
    rows = table(result.events)
    assert rows[0]["action"] == "alloc" and rows[0]["addr"] == fx.SEG1 + 2 * MiB and rows[0]["ts_ns"] == T0_NS
    lt = lifetimes(result.events)
    # Two blocks freed whose allocs the ring lost: unmatched (pre-existing), as pairing defines.
    assert lt.unmatched_frees == {"cuda_block": 2}
    pending = lt.allocations[(lt.allocations["addr"] == fx.SEG1 + 2 * MiB)]
    assert pending["end_kind"].tolist() == ["freed"] and pending["end_ts_ns"].tolist() == [T0_NS + 4000]
    assert result.stats["synthesized_blocks"] == 1


def test_missing_time_keeps_order_and_old_free_action():
    result = rows_of("handbuilt_snapshot_no_time.pickle")
    rows = table(result.events)
    assert {r["ts_ns"] for r in rows} == {0}
    assert [r["action"] for r in rows] == ["alloc", "alloc", "free_requested", "free", "alloc"]
    assert result.stats["untimed_entries"] == 5 and result.stats["first_ns"] is None
    assert any("no timestamps" in n and "--min-age 0" in n for n in result.stats["notes"])
    lt = lifetimes(result.events)
    assert lt.allocations["end_kind"].tolist() == ["live", "freed", "live"]


def test_entries_without_time_keep_the_time_before_them():
    snap = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 16, "size": 1},
        {"action": "alloc", "addr": 32, "size": 1, "time_us": 5},
        {"action": "alloc", "addr": 48, "size": 1},
        {"action": "alloc", "addr": 64, "size": 1, "time_us": 9}]]}
    result = snapshot_rows(snap, realtime_ns)
    assert result.events["ts_ns"] == [5000, 5000, 5000, 9000]
    assert result.stats["untimed_entries"] == 2


# --- format drift -------------------------------------------------------------------------

def _held_snapshot(state: str, **block_extra) -> dict:
    blocks = [{"size": 512, "requested_size": 500, "state": state, "frames": [], **block_extra},
              {"size": 512, "requested_size": 0, "state": "inactive", "frames": []}]
    return {"segments": [{"device": 1, "address": 4096, "total_size": 1024, "stream": 0, "blocks": blocks}],
            "device_traces": [[], [{"action": "snapshot", "addr": 0, "size": 0, "time_us": 7}]]}


@pytest.mark.parametrize("state", ["active_pending_free", "active_awaiting_free"])
def test_both_names_of_the_pending_state(state):
    rows = table(snapshot_rows(_held_snapshot(state), realtime_ns).events)
    assert [(r["action"], r["addr"], r["device"], r["ts_ns"]) for r in rows if r["layer"] == "cuda_block"] == [
        ("alloc", 4096, "cuda:1", 7000), ("free_requested", 4096, "cuda:1", 7000)]


def test_block_address_defaults_to_its_offset_in_the_segment():
    snap = _held_snapshot("inactive")
    snap["segments"][0]["blocks"][1]["state"] = "active_allocated"
    rows = table(snapshot_rows(snap, realtime_ns).events)
    assert [(r["addr"], r["size_bytes"], r["requested_bytes"]) for r in rows if r["layer"] == "cuda_block"] == [
        (4096 + 512, 512, 0)]


def test_a_bare_list_of_segments_is_a_snapshot():
    snap = _held_snapshot("active_allocated")
    result = snapshot_rows(snap["segments"], realtime_ns)
    assert result.stats["format"] == "segments only" and result.stats["synthesized_blocks"] == 1
    assert any("no trace" in n for n in result.stats["notes"])


def test_unknown_actions_are_skipped_and_counted_and_user_defined_is_a_mark():
    snap = {"segments": [], "device_traces": [[{"action": "defragment", "time_us": 1},
                                               {"action": "user_defined", "time_us": 2, "addr": 0, "size": 0}]]}
    result = snapshot_rows(snap, realtime_ns)
    assert result.stats["skipped_actions"] == {"defragment": 1}
    assert table(result.events)[0]["category"] == "annotation:user_defined"


def test_annotation_names_beyond_the_category_limit_are_dropped_and_said():
    anns = [{"stage": "START", "name": f"op{i}", "device": 0, "time_us": i} for i in range(MAX_LABELS + 7)]
    result = snapshot_rows({"segments": [], "external_annotations": anns}, realtime_ns)
    assert len(result.events["ts_ns"]) == MAX_LABELS and result.stats["annotations_dropped"] == 7
    assert any("annotations left out" in n for n in result.stats["notes"])


@pytest.mark.parametrize("snapshot, message", [
    (42, "holds a int, not a CUDA memory snapshot"),
    ([1, 2], "holds a list, not a CUDA memory snapshot"),
    ({"foo": 1}, "no 'segments' or 'device_traces' key (keys: foo)"),
    ({"segments": {}}, "'segments' is a dict, not a list"),
    ({"device_traces": [["x"]]}, "device_traces[0][0] is a str, not a trace entry dict"),
    ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 1}]]}, "device_traces[0][0]: addr is '0x10'"),
    ({"device_traces": [[{"action": "alloc", "addr": 16, "size": -1}]]}, "size is -1, not a byte count"),
    ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 1, "time_us": "now"}]]}, "time_us is 'now'"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 8, "blocks": [{"state": "inactive"}]}]},
     "segments[0].blocks[0]: size is None"),
    ({"segments": [{"device": -1, "address": 0, "total_size": 8, "blocks": []}]}, "segments[0]: device is -1"),
])
def test_bad_structure_is_a_bad_input_error_naming_the_part(snapshot, message):
    with pytest.raises(BadInputError) as e:
        snapshot_rows(snapshot, realtime_ns)
    assert message in e.value.message and e.value.hint and e.value.exit_code == 5


def test_check_snapshot_passes_a_dict_through():
    snap = {"segments": [], "device_traces": []}
    assert check_snapshot(snap) is snap


# --- the API the recorder reuses ----------------------------------------------------------

def test_trace_rows_one_shot_columns_for_the_writer():
    entries = [{"action": "alloc", "addr": 256, "size": 64, "time_us": 10, "frames": fx.LEAK_FRAMES},
               {"action": "free_completed", "addr": 256, "size": 64, "time_us": 11, "frames": []}]
    interner = FrameInterner(first_stack_id=1 << 40, first_frame_id=1 << 40)
    cols = trace_rows(entries, 2, lambda us: us * 10, interner, seq_start=500, pid=4242)
    assert cols["seq"] == [500, 501] and cols["pid"] == [4242] * 2 and cols["device"] == ["cuda:2"] * 2
    assert cols["ts_ns"] == [100, 110] and cols["stack_id"] == [1 << 40, None]
    stacks, frames = interner.drain_tables()
    assert stacks["depth"] == [0, 1, 2] and frames["frame_id"][0] == 1 << 40
    assert interner.drain_tables() == ({"stack_id": [], "depth": [], "frame_id": []},
                                       {k: [] for k in ("frame_id", "kind", "function", "module", "file", "line")})


def test_a_shared_interner_emits_each_stack_once_across_snapshots():
    interner = FrameInterner()
    first = rows_of("handbuilt_snapshot_leak.pickle", interner=interner)
    second = rows_of("handbuilt_snapshot_no_time.pickle", interner=interner, seq_start=1000)
    assert second.events["seq"][0] == 1000
    assert second.stacks["stack_id"] == [] and second.frames["frame_id"] == []  # all its chains seen before
    leak_stack = pick(table(first.events), size_bytes=fx.LEAK_SIZE, action="alloc")[0]["stack_id"]
    assert pick(table(second.events), size_bytes=2 * MiB, action="alloc")[0]["stack_id"] == leak_stack


def test_safe_loader_reads_plain_data_and_refuses_globals():
    assert loads_plain(pickle.dumps({"a": (1, 2.5, b"x", None, True, [])}, 4)) == {"a": (1, 2.5, b"x", None, True, [])}
    with pytest.raises(UnsafeInputError):
        loads_plain(pickle.dumps(Counter(a=1)))


def test_live_traces_keep_ids_and_mapped_pieces_across_drains():
    from memprof.model.schema import EVENT_COLUMNS
    from memprof.sources.torch_import.snapshot import LiveTraces, agent_trace_tables
    from memprof.sources.torch_import.trace import LIVE_ID_BASE
    state = LiveTraces()
    to_ns = lambda us: us * 1000 - 5  # noqa: E731 (monotonic = realtime - 5 ns)
    first = agent_trace_tables([
        (0, 11, {"action": "segment_map", "addr": 1 << 30, "size": 40, "time_us": 1, "frames": fx.LEAK_FRAMES}),
        (1, 11, {"action": "alloc", "addr": 64, "size": 8, "time_us": 2, "frames": fx.LEAK_FRAMES}),
        (0, 12, {"action": "alloc", "addr": 64, "size": 8, "time_us": 3.0, "frames": fx.LEAK_FRAMES}),
        (0, 12, {"action": "alloc", "addr": "bad", "size": 8, "time_us": 3}),
    ], to_ns, state)
    events, stacks, frames = first
    assert set(events) == set(EVENT_COLUMNS) - {"seq"}
    assert len({len(v) for v in events.values()}) == 1 and len(events["ts_ns"]) == 3
    assert events["pid"] == [11, 11, 12] and events["device"] == ["cuda:0", "cuda:1", "cuda:0"]
    assert events["ts_ns"] == [995, 1995, 2995] and events["tid"] == [0, 0, 0]
    assert set(events["stack_id"]) == {LIVE_ID_BASE} and stacks["stack_id"] == [LIVE_ID_BASE] * 3
    assert min(frames["frame_id"]) == LIVE_ID_BASE and state.unreadable == 1
    events, stacks, frames = agent_trace_tables([
        (0, 11, {"action": "segment_unmap", "addr": (1 << 30) + 20, "size": 20, "time_us": 9,
                 "frames": fx.LEAK_FRAMES}),
    ], to_ns, state)
    assert [(a, s) for a, s in zip(events["action"], events["size_bytes"])] == [("free", 40), ("alloc", 20)]
    assert stacks["stack_id"] == [] and frames["frame_id"] == []  # the chain was stored by the first drain
