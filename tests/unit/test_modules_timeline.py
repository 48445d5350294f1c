"""Which module (issue 21, item 5), from the agent's lines to `report top --by module`: the
reader turns `modules` records into boundary rows (refusing bad ones), the timeline gives
each allocation its thread's innermost module path, and attribution totals live bytes per
path."""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from memprof.analysis.attribution import ModuleRow, Span, attribute
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.modules import chain_modules, with_chain_modules
from memprof.model.meta import ClockAnchor
from memprof.model.schema import MODULE_NONE
from memprof.report import attribution as report_attribution
from memprof.report.labels import in_module, module_first
from memprof.sources.agent_reader import lines
from memprof.sources.agent_reader.modules import boundaries
from memprof.sources.agent_reader.source import AgentSource
from tests.agent_factories import agent_source_with
from memprof.timeline import timeline
from tests.factories import ev, events_frame

PATHS = {0: "", 1: "h.0", 2: "h.0.attn", 3: "h.0.mlp", 4: "lm_head"}
# One outermost forward on thread 100, 100..1000 ns: h.0 (attn, then mlp), then lm_head.
SPANS = [[0, 100, 1000], [1, 200, 600], [2, 250, 400], [3, 450, 550], [4, 700, 900]]


def modules_record(spans=SPANS, paths=PATHS, tid=100, **fields):
    return {"kind": "modules", "ts_ns": 1000, "pid": 100, "tid": tid, "paths": {str(k): v for k, v in paths.items()},
            "spans": spans, **fields}


def source_with(tmp_path, *records) -> AgentSource:
    return agent_source_with(tmp_path, 100, *records)


def test_boundaries_say_what_runs_from_each_enter_and_exit_on():
    assert boundaries([tuple(s) for s in SPANS], PATHS) == [
        (100, "module:"), (200, "module:h.0"), (250, "module:h.0.attn"), (400, "module-return:h.0"),
        (450, "module:h.0.mlp"), (550, "module-return:h.0"), (600, "module-return:"), (700, "module:lm_head"),
        (900, "module-return:"), (1000, MODULE_NONE)]


def test_rows_at_one_ns_end_inner_first_and_begin_outer_first():
    # attn ends at 400 and mlp begins at 400; h.0 and its last child mlp both end at 550.
    spans = [(0, 100, 550), (1, 100, 550), (2, 100, 400), (3, 400, 550)]
    rows = boundaries(spans, PATHS)
    assert rows[-1] == (550, MODULE_NONE)
    assert [c for t, c in rows if t == 400] == ["module-return:h.0", "module:h.0.mlp"]
    assert [c for t, c in rows if t == 100] == ["module:", "module:h.0", "module:h.0.attn"]


def test_the_reader_turns_a_record_into_boundary_rows_and_remembers_names_across_polls(tmp_path):
    source = source_with(tmp_path, modules_record())
    events, _, _ = source.poll(ClockAnchor(0, 0))
    assert list(zip(events["ts_ns"], events["category"]))[:3] == [(100, "module:"), (200, "module:h.0"),
                                                                 (250, "module:h.0.attn")]
    assert set(events["action"]) == {"mark"} and set(events["layer"]) == {None} and set(events["tid"]) == {100}
    source_with(tmp_path, modules_record(spans=[[2, 2000, 2100]], paths={}))  # named in the first poll
    events, _, _ = source.poll(ClockAnchor(0, 0))
    assert list(zip(events["ts_ns"], events["category"])) == [(2000, "module:h.0.attn"), (2100, MODULE_NONE)]


@pytest.mark.parametrize("change", [
    {"spans": [[9, 100, 200]]},                       # a path never named
    {"spans": [[0, 300, 200]]},                       # ends before it begins
    {"spans": [[0, 300, 400], [1, 200, 250]]},        # not in the order they began
    {"spans": [[0, 100, True]]},                      # a bool is no time
    {"spans": [[0, 100]]},                            # not three numbers
    {"spans": [[0, 100, 2 ** 63]]},                   # past int64
    {"spans": [[-1, 100, 200]]},                      # a negative index
    {"spans": "no"},
    {"paths": {"x": "h.0"}},                          # an index that is not a number
    {"paths": {"1": 5}},                              # a name that is not text
    {"paths": {"99999999": "h.0"}},                   # an index past the bound
    {"dropped": -1},
])
def test_bad_modules_records_are_refused_whole_and_counted(tmp_path, change):
    source = source_with(tmp_path, {**modules_record(), **change})
    assert source.poll(ClockAnchor(0, 0)) is None
    assert source.stats().detail["malformed_lines"] == 1


def test_a_record_of_more_spans_than_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MAX_SPANS", 4)
    source = source_with(tmp_path, modules_record())
    assert source.poll(ClockAnchor(0, 0)) is None


def test_long_paths_are_cut_and_dropped_calls_counted(tmp_path):
    source = source_with(tmp_path, modules_record(spans=[[0, 1, 2]], paths={0: "x" * 5000}, dropped=7))
    events, _, _ = source.poll(ClockAnchor(0, 0))
    assert events["category"][0] == "module:" + "x" * lines.MAX_TEXT
    assert source.stats().detail["module_calls_dropped"] == 7


def recording():
    """Thread 100 runs SPANS; thread 101 runs `other` 260..310. Allocations (bytes tell them
    apart) in each place, one freed before the end."""
    marks = [dict(ts_ns=t, action="mark", category=c, layer=None, pid=100, tid=100)
             for t, c in boundaries([tuple(s) for s in SPANS], PATHS)]
    marks += [dict(ts_ns=t, action="mark", category=c, layer=None, pid=100, tid=101)
              for t, c in boundaries([(0, 260, 310)], {0: "other"})]
    allocs = [ev(50, "alloc", 0x1, 1, 9),            # before any module
              ev(300, "alloc", 0x2, 1000, 1),        # h.0.attn
              ev(350, "alloc", 0x3, 24, 1),          # h.0.attn, freed at 1500
              ev(420, "alloc", 0x4, 200, 2),         # between attn and mlp: h.0
              ev(500, "alloc", 0x5, 30, 3),          # h.0.mlp
              ev(650, "alloc", 0x6, 4, 4),           # between h.0 and lm_head: the outermost module
              ev(800, "alloc", 0x7, 7000, 5),        # lm_head
              ev(1100, "alloc", 0x8, 2, 9),          # after the forward: none
              ev(300, "alloc", 0x9, 60, 6, tid=101),  # the other thread, in its own module
              ev(400, "alloc", 0xA, 5, 6, tid=101),   # the other thread, after it
              ev(1500, "free", 0x3)]
    events = events_frame(sorted(marks + allocs, key=lambda r: r["ts_ns"]), pid=100, tid=100)
    return timeline(SimpleNamespace(events=events))


def test_each_allocation_gets_the_innermost_module_of_its_own_thread():
    events = recording()
    allocs = events[events["action"] == "alloc"]
    got = dict(zip(allocs["size_bytes"], allocs["module"].astype(object).where(allocs["module"].notna(), None)))
    assert got == {1: None, 1000: "h.0.attn", 24: "h.0.attn", 200: "h.0", 30: "h.0.mlp", 4: "", 7000: "lm_head",
                   2: None, 60: "other", 5: None}
    assert events.loc[events["action"] != "alloc", "module"].isna().all()


def test_a_recording_without_boundaries_has_an_empty_module_column():
    events = timeline(SimpleNamespace(events=events_frame([(100, "alloc", 0x1, 8, 1)])))
    assert events["module"].isna().all()


def test_lifetimes_carry_the_module_and_chains_name_their_most_common_one():
    events = recording()
    lifetimes = pair_lifetimes(events)
    assert dict(zip(lifetimes.allocations["size_bytes"], lifetimes.allocations["module"]))[1000] == "h.0.attn"
    # Chain 9: one allocation before the forward, one after it: none. Stack 6 is chain 1's twin
    # (canonical): attn twice, then `other` and none once each, so attn wins 2 to 1.
    assert chain_modules(lifetimes.allocations, events, [1, 9, 5], canonical_stack={6: 1}) == {
        1: "h.0.attn", 9: None, 5: "lm_head"}


def test_top_by_module_totals_live_bytes_per_path_at_the_end():
    events = recording()
    result = attribute(pair_lifetimes(events), by="module", at="end", span=Span(0, 3000, 3000), events=events)
    (layer,) = result.layers
    assert layer.rows == [ModuleRow("lm_head", 7000, 1), ModuleRow("h.0.attn", 1000, 1), ModuleRow("h.0", 200, 1),
                          ModuleRow("other", 60, 1), ModuleRow("h.0.mlp", 30, 1), ModuleRow(None, 8, 3),
                          ModuleRow("", 4, 1)]
    assert layer.live_bytes == 7000 + 1000 + 200 + 60 + 30 + 8 + 4  # the 24 freed at 1500 is not live


def test_top_by_module_at_a_time_and_rendered_as_json_and_text():
    events = recording()
    result = attribute(pair_lifetimes(events), by="module", at=1200, span=Span(0, 3000, 3000), events=events)
    rows = {row.module: row.live_bytes for row in result.layers[0].rows}
    assert rows["h.0.attn"] == 1024  # both attn allocations live at 1200
    view = SimpleNamespace(result=result, chains={}, about=SimpleNamespace(path="r", lost_events=0, notes=()))
    shown = report_attribution.to_json(view)["layers"][0]["rows"]
    assert shown[1] == {"module": "h.0.attn", "live_bytes": 1024, "live_count": 2}
    assert {"module": None, "live_bytes": 8, "live_count": 3} in shown


def test_findings_and_growth_chains_get_their_chains_module():
    @dataclass(frozen=True)
    class Chain:
        stack_id: int | None
        module: str | None = None

    events = recording()
    named = with_chain_modules([Chain(1), Chain(5), Chain(None), Chain(9)], pair_lifetimes(events).allocations)
    assert [c.module for c in named] == ["h.0.attn", "lm_head", None, None]
    assert in_module("h.0.attn") == " in h.0.attn" and in_module("") == " in (outermost module)" and in_module(None) == ""
    assert module_first("h.*.attn") == "in h.*.attn · " and module_first(None) == ""


def test_module_tracking_is_asked_of_the_agent_only_with_the_option(tmp_path):
    from memprof.sources.agent_reader.source import AgentOptions
    asked = AgentSource(tmp_path / "r.memprof", options=AgentOptions(torch_modules=True)).child_env({})
    default = AgentSource(tmp_path / "r.memprof").child_env({})
    assert json.loads(asked["MEMPROF_AGENT_OPTIONS"])["torch_modules"] is True
    assert json.loads(default["MEMPROF_AGENT_OPTIONS"])["torch_modules"] is False


def test_leak_findings_name_their_chains_module_in_json_and_text():
    from memprof.analysis.leaks import find_leaks
    from memprof.analysis.views import About, LeaksView
    from memprof.report import leaks as report_leaks
    result = find_leaks(pair_lifetimes(recording()), end_ns=3000, recording_end_ns=3000, min_age_ns=0)
    modules = {f.stack_id: f.module for f in result.findings}
    assert modules[5] == "lm_head" and modules[1] == "h.0.attn" and modules[9] is None
    doc = report_leaks.to_json(LeaksView(result, About("r.memprof"), {}))
    assert {f["module"] for f in doc["findings"]} >= {"lm_head", "h.0.attn", None}
    from rich.console import Console
    console = Console(record=True, width=120)
    report_leaks.render(LeaksView(result, About("r.memprof"), {}), console)
    assert "allocated in lm_head" in console.export_text()


@pytest.mark.parametrize("counts,winner", [
    ({"transformer.h.0.attn": 2, "transformer.h.1.attn": 2, None: 3}, "transformer.h.*.attn"),  # 4 beat 3
    ({"transformer.h.0.attn": 2, None: 3}, None),
    ({"h.0.attn": 2, "h.0.mlp": 1}, "h.0.attn"),       # one numbered path: its own name
    ({"0.mlp.1": 1, "1.mlp.0": 1, "lm_head": 1}, "*.mlp.*"),
    ({"a": 1, "b": 1}, "a"),                           # a tie: the one met first
])
def test_a_chain_across_numbered_siblings_is_named_with_a_star(counts, winner):
    from memprof.analysis.modules import _winner
    assert _winner(counts) == winner


def test_report_modules_gives_calls_bytes_per_call_peak_and_end_per_path():
    from memprof.analysis.module_use import ModuleUse, module_use
    events = recording()
    result = module_use(pair_lifetimes(events), events, Span(0, 3000, 3000))
    assert result.tracked
    (layer,) = result.layers
    rows = {row.module: row for row in layer.modules}
    # attn: called once, 1000 + 24 allocated; the layer's peak (every allocation made, before
    # the one free at 1500) holds both; at the end the 24 freed at 1500 is gone.
    assert rows["h.0.attn"] == ModuleUse("h.0.attn", 1, 1024, 2, 1024, 1000)
    assert rows["h.0.attn"].bytes_per_call == 1024
    assert rows[""] == ModuleUse("", 1, 4, 1, 4, 4)  # the outermost module's own: between h.0 and lm_head
    assert rows["other"].calls == 1 and rows["other"].peak_bytes == 60
    assert rows[None] == ModuleUse(None, None, 8, 3, 8, 8)  # before and after the forward, and thread 101's 5
    assert [row.module for row in layer.modules][:2] == ["lm_head", "h.0.attn"]
    assert layer.peak_bytes == 1 + 1000 + 24 + 200 + 30 + 4 + 7000 + 2 + 60 + 5


def test_report_modules_on_a_recording_without_module_tracking():
    from memprof.analysis.module_use import module_use
    events = timeline(SimpleNamespace(events=events_frame([(100, "alloc", 0x1, 8, 1)])))
    result = module_use(pair_lifetimes(events), events, Span(0, 200, 200))
    assert not result.tracked and [(m.module, m.allocated_bytes) for m in result.layers[0].modules] == [(None, 8)]


def test_report_modules_json_and_text():
    from rich.console import Console

    from memprof.analysis.module_use import module_use
    from memprof.analysis.views import About, ModulesView
    from memprof.report import modules as report_modules
    events = recording()
    view = ModulesView(module_use(pair_lifetimes(events), events, Span(0, 3000, 3000), top=2), About("r.memprof"))
    doc = report_modules.to_json(view)
    assert doc["tracked"] and doc["layers"][0]["modules_left_out"] == 5
    assert doc["layers"][0]["modules"][1] == {"module": "h.0.attn", "calls": 1, "allocated_bytes": 1024,
                                             "allocated_count": 2, "bytes_per_call": 1024.0, "peak_bytes": 1024,
                                             "end_bytes": 1000}
    console = Console(record=True, width=120)
    report_modules.render(view, console)
    text = console.export_text()
    assert "h.0.attn" in text and "… and 5 more modules" in text and "--torch-modules" not in text


def test_top_by_module_without_module_boundaries_says_how_to_get_them():
    """A recording made without --torch-modules: every allocation is in no module, and the
    report says why, in the text and the JSON, rather than one silent "(no module)" row."""
    from rich.console import Console
    events = events_frame([ev(100, "alloc", 0x10, 64, 1, pid=100, tid=100)], layer="torch_cpu")
    result = attribute(pair_lifetimes(timeline(SimpleNamespace(events=events))), by="module", at="end",
                       span=Span(0, 3000, 3000), events=events)
    view = SimpleNamespace(result=result, chains={}, about=SimpleNamespace(path="r", lost_events=0, notes=()))
    assert report_attribution.to_json(view)["modules_tracked"] is False
    console = Console(width=160, record=True, color_system=None)
    report_attribution.render(view, console)
    assert "record with `memprof record --torch-modules`" in console.export_text()
    tracked = attribute(pair_lifetimes(recording()), by="module", at="end", span=Span(0, 3000, 3000),
                        events=recording())
    assert report_attribution.to_json(SimpleNamespace(result=tracked, chains={}, about=view.about))["modules_tracked"]
