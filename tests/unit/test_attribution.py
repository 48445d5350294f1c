"""Attribution (report top / peak / chains --flame): known answers on the timeline of
tests/attribution_factories.py, the renderers, and the commands' exit codes."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.attribution import (
    Attribution, CategoryRow, FunctionRow, LayerLive, Span, attribute, stack_functions,
)
from memprof.analysis.layers import ChainBytes
from memprof.analysis.chains import canonical_stacks
from memprof.analysis.leaks import chain_frames
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.errors import UsageError
from memprof.analysis.views import About, AttributionView
from memprof.report.attribution import folded_stacks, frame_label, render, to_json
from tests.attribution_factories import END_NS, RECORDING_END_NS, START_NS, S, events, tables, write_recording
from tests.factories import ev, events_frame, stacks_frames

SPAN = Span(start_ns=START_NS, end_ns=END_NS, recording_end_ns=RECORDING_END_NS)


def attributed(by: str, at="end", **kwargs) -> Attribution:
    stacks, frames = tables()
    timeline = events()
    return attribute(pair_lifetimes(timeline), by=by, at=at, span=SPAN, stacks=stacks, frames=frames,
                     events=timeline, canonical_stack=canonical_stacks(stacks), **kwargs)


def by_layer(result: Attribution) -> dict[str, LayerLive]:
    return {layer.layer: layer for layer in result.layers}


def chain_rows(result: Attribution, layer: str) -> list[tuple]:
    return [(r.stack_id, r.live_bytes, r.live_count) for r in by_layer(result)[layer].rows]


def function_rows(result: Attribution, layer: str) -> list[tuple]:
    return [(r.kind, r.function, r.module or r.file, r.self_bytes, r.self_count, r.total_bytes, r.total_count)
            for r in by_layer(result)[layer].rows]


def invoke(*args):
    """The CLI in this process: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return write_recording(tmp_path_factory.mktemp("attribution") / "run.memprof")


# --- the moment --------------------------------------------------------------------------------

def test_each_layer_is_judged_at_the_end_or_its_own_peak_or_a_time():
    end = {l.layer: (l.ts_ns, l.live_bytes, l.live_count) for l in attributed("layer").layers}
    assert end == {"torch_cpu": (END_NS, 5632, 3), "native_heap": (END_NS, 2410, 8), "kernel_slab": (END_NS, 512, 2)}
    peak = {l.layer: (l.ts_ns, l.live_bytes, l.live_count) for l in attributed("layer", "peak").layers}
    assert peak == {"torch_cpu": (3 * S, 7680, 4), "native_heap": (3 * S, 4500, 3),
                    "kernel_slab": (int(2.5 * S), 832, 4)}
    at = {l.layer: (l.ts_ns, l.live_bytes) for l in attributed("layer", 3 * S).layers}  # 3 s after the 0.5 s start
    assert at == {"torch_cpu": (int(3.5 * S), 7680), "native_heap": (int(3.5 * S), 4500),
                  "kernel_slab": (int(3.5 * S), 768)}  # the 64 B freed at exactly 3.5 s is not live
    assert [l.layer for l in attributed("layer").layers] == ["torch_cpu", "native_heap", "kernel_slab"]


@pytest.mark.parametrize("offset_ns", [-1, RECORDING_END_NS - START_NS + 1])
def test_a_time_outside_the_recording_is_a_usage_error_naming_its_duration(offset_ns):
    with pytest.raises(UsageError) as e:
        attributed("chain", offset_ns)
    assert "lasted 9.5s" in e.value.message and "from 0s to 9.5s" in e.value.hint


def test_the_recording_end_itself_is_a_valid_time():
    (heap,) = attributed("layer", RECORDING_END_NS - START_NS, layers=["native_heap"]).layers
    assert (heap.ts_ns, heap.live_bytes, heap.live_count) == (RECORDING_END_NS, 1410, 7)  # A freed by the teardown


# --- groupings -----------------------------------------------------------------------------------

def test_by_chain_at_end_merges_twin_stacks_weights_sampled_and_keeps_null_stacks():
    result = attributed("chain")
    # chain 1: A 1000 + E 100 + F 10 (stack 6, same frames); no stack: 200 B × weight 4.
    assert chain_rows(result, "native_heap") == [(1, 1110, 3), (None, 800, 4), (3, 500, 1)]
    assert chain_rows(result, "kernel_slab") == [(4, 512, 2)]
    assert chain_rows(result, "torch_cpu") == [(None, 5632, 3)]


def test_by_chain_at_peak_and_top():
    result = attributed("chain", "peak", top=2)
    heap = by_layer(result)["native_heap"]
    assert chain_rows(result, "native_heap") == [(2, 3000, 1), (1, 1000, 1)] and heap.rows_left_out == 1
    assert chain_rows(result, "kernel_slab") == [(4, 768, 3), (None, 64, 1)]


def test_by_function_self_and_total_recursion_counted_once_eval_loop_merged():
    assert function_rows(attributed("function"), "native_heap") == [
        ("native", "malloc", "libc.so.6", 1610, 4, 1610, 4),
        ("python", "main", "train.py", 0, 0, 1610, 4),   # lines 5 and 7: one function
        ("python", "load", "data.py", 0, 0, 1110, 3),
        (None, None, None, 800, 4, 800, 4),               # no stack: self and total
        ("python", "walk", "tree.py", 0, 0, 500, 1),      # twice in chain 3, counted once
    ]


def test_by_function_at_peak_in_the_kernel_layer():
    rows = function_rows(attributed("function", "peak"), "kernel_slab")
    assert rows[0] == ("kernel", "__kmalloc_noprof", "vmlinux", 768, 3, 768, 3)
    assert [r[1] for r in rows[1:]] == ["alloc_pipe_info", "do_pipe2", "__pipe", "main", None]
    assert rows[-1] == (None, None, None, 64, 1, 64, 1)


def test_native_frames_all_keeps_the_eval_loop_as_a_function():
    rows = function_rows(attributed("function", native_frames="all"), "native_heap")
    assert ("native", "_PyEval_EvalFrameDefault", "python3.11", 0, 0, 1110, 3) in rows
    assert all(r[1] != "_PyEval_EvalFrameDefault" for r in function_rows(attributed("function"), "native_heap"))


def test_stack_functions_links_each_function_once_per_stack():
    stacks, frames = tables()
    links, functions = stack_functions(stacks, frames, [3])
    names = dict(zip(functions["fn"], functions["name"]))
    assert sorted((names[f], bool(s)) for f, s in zip(links["fn"], links["self"])) == [
        ("main", False), ("malloc", True), ("walk", False)]


def test_by_category_at_end_peak_and_time():
    def cats(result):
        return [(r.category, r.live_bytes, r.live_count) for r in by_layer(result)["torch_cpu"].rows]
    assert cats(attributed("category")) == [("parameter", 4096, 1), ("activation", 1024, 1), ("unknown", 512, 1)]
    assert cats(attributed("category", "peak")) == [("parameter", 4096, 1), ("activation", 3072, 2),
                                                    ("unknown", 512, 1)]
    assert cats(attributed("category", int(0.5 * S))) == [("parameter", 4096, 1)]  # at 1 s
    heap = by_layer(attributed("category"))["native_heap"]
    assert [(r.category, r.live_bytes) for r in heap.rows] == [("unknown", 2410)]


def test_null_category_and_an_explicit_unknown_are_one_row():
    timeline = events_frame([ev(1 * S, "alloc", 0x1, 10, category="unknown"), ev(1 * S, "alloc", 0x2, 5),
                             ev(1 * S, "alloc", 0x3, 7, category="gradient")], layer="torch_cpu")
    result = attribute(pair_lifetimes(timeline), by="category", at="end", span=Span(0, 2 * S, 2 * S), events=timeline)
    assert [(r.category, r.live_bytes, r.live_count) for r in result.layers[0].rows] == [
        ("unknown", 15, 2), ("gradient", 7, 1)]


def test_layer_filter_and_empty_layers():
    assert [l.layer for l in attributed("chain", layers=["kernel_slab"]).layers] == ["kernel_slab"]
    (slab,) = attributed("chain", int(0.5 * S), layers=["kernel_slab"]).layers  # at 1 s: nothing yet
    assert (slab.live_bytes, slab.live_count, slab.rows) == (0, 0, [])
    assert attributed("chain", layers=["cuda_block"]).layers == []


def test_fractional_weights_round_bytes_per_allocation_like_the_layer_curve():
    timeline = events_frame([ev(1 * S, "alloc", 0x1, 10, 1, weight=2.5), ev(2 * S, "alloc", 0x2, 10, 1, weight=2.5)])
    result = attribute(pair_lifetimes(timeline), by="chain", at="end", span=Span(0, 3 * S, 3 * S))
    assert chain_rows(result, "native_heap") == [(1, 50, 5)]


# --- renderers -----------------------------------------------------------------------------------

def test_folded_stacks_are_exact_outermost_first_with_the_layer_as_root():
    result = attributed("chain", top=None)
    stacks, frames = tables()
    chains = chain_frames(stacks, frames, [r.stack_id for l in result.layers for r in l.rows])
    assert folded_stacks(result, chains) == [
        "torch_cpu;[no stack] 5632",
        "native_heap;[py] main (train.py:5);[py] load (data.py:10);[n] malloc (libc.so.6) 1110",
        "native_heap;[no stack] 800",
        "native_heap;[py] main (train.py:7);[py] walk (tree.py:4);[py] walk (tree.py:3);[n] malloc (libc.so.6) 500",
        "kernel_slab;[n] main (kernel_leak);[n] __pipe (libc.so.6);[k] do_pipe2;[k] alloc_pipe_info;"
        "[k] __kmalloc_noprof 512",
    ]


def test_folded_names_escape_separators_and_identical_lines_merge():
    stacks, frames = stacks_frames({1: [("native", "f;g\nh", "lib.so", None, None)],
                                    2: [("native", "f;g\nh", "lib.so", None, None)]})
    layer = LayerLive("native_heap", 0, 30, 3, [ChainBytes(1, 10, 1), ChainBytes(2, 20, 2), ChainBytes(None, 0, 1)], 0)
    result = Attribution(by="chain", at="end", span=Span(0, 0, 0), layers=[layer])
    assert folded_stacks(result, chain_frames(stacks, frames, [1, 2])) == ["native_heap;[n] f,g h (lib.so) 30"]


def test_frame_labels():
    assert frame_label({"kind": "python", "function": "step", "file": "train.py", "line": 42}) == \
        "[py] step (train.py:42)"
    assert frame_label({"kind": "native", "function": "at::empty", "module": "libtorch_cpu.so"}) == \
        "[n] at::empty (libtorch_cpu.so)"
    assert frame_label({"kind": "kernel", "function": "alloc_pipe_info", "module": "vmlinux"}) == "[k] alloc_pipe_info"
    assert frame_label({"kind": "kernel", "function": "nv_alloc", "module": "nvidia"}) == "[k] nv_alloc (nvidia)"


GOLDEN_FUNCTIONS = """\
Live bytes by function at the end, +7.50s (the target began to exit)
Layers nest (a tensor lives in the heap, a slab in pages): their bytes are never added.

native_heap  2.4 KiB in 8 allocations at +7.50s
┏━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ # ┃    self ┃   total ┃ share ┃ allocations ┃ function               ┃
┡━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━┩
│ 1 │ 1.6 KiB │ 1.6 KiB │ 66.8% │           4 │ [n] malloc (libc.so.6) │
│ 2 │     0 B │ 1.6 KiB │ 66.8% │           4 │ [py] main (train.py)   │
│ 3 │     0 B │ 1.1 KiB │ 46.1% │           3 │ [py] load (data.py)    │
└───┴─────────┴─────────┴───────┴─────────────┴────────────────────────┘
  … and 2 more functions
note: kmem: a note
"""


def test_golden_function_table_at_width_100():
    console = Console(width=100, record=True, color_system=None)
    render(AttributionView(attributed("function", layers=["native_heap"], top=3), About("r", notes=("kmem: a note",))),
           console)
    assert console.export_text() == GOLDEN_FUNCTIONS


def test_chain_table_escapes_markup_and_shows_loss():
    stacks, frames = stacks_frames({7: [("native", "collate[batch]", "train", None, None)]})
    layer = LayerLive("native_heap", 2 * S, 100, 1, [ChainBytes(7, 100, 1)], 0)
    result = Attribution(by="chain", at="peak", span=Span(S, 3 * S, 3 * S), layers=[layer])
    console = Console(width=100, record=True, color_system=None)
    render(AttributionView(result, About("r", lost_events=47), chain_frames(stacks, frames, [7])), console)
    text = console.export_text()
    assert "collate[batch]" in text and "100.0%" in text and "at +1.00s (its peak)" in text
    assert "47 events were lost while recording" in text


def test_json_rows_of_each_grouping():
    stacks, frames = tables()
    result = attributed("chain", layers=["native_heap"])
    doc = to_json(AttributionView(result, About("run.memprof", lost_events=2), chain_frames(stacks, frames, [1, 3])))
    json.dumps(doc)
    assert (doc["by"], doc["at"], doc["end_ns"], doc["target_exited"], doc["lost_events"]) == \
        ("chain", "end", END_NS, True, 2)
    (heap,) = doc["layers"]
    assert (heap["live_bytes"], heap["live_count"], heap["rows_left_out"]) == (2410, 8, 0)
    assert heap["rows"][0]["stack"][1] == {"kind": "python", "function": "load", "module": None, "file": "data.py",
                                           "line": 10}
    fn = to_json(AttributionView(attributed("function", layers=["native_heap"], top=1), About("r")))["layers"][0]["rows"]
    assert fn == [{"kind": "native", "function": "malloc", "module": "libc.so.6", "file": None,
                   "self_bytes": 1610, "self_count": 4, "total_bytes": 1610, "total_count": 4}]
    cat = to_json(AttributionView(attributed("category", layers=["torch_cpu"], top=1), About("r")))["layers"][0]["rows"]
    assert cat == [{"category": "parameter", "live_bytes": 4096, "live_count": 1}]


def test_rows_are_plain_dataclasses():
    row = attributed("category", layers=["torch_cpu"]).layers[0].rows[0]
    assert isinstance(row, CategoryRow)
    assert isinstance(attributed("function").layers[0].rows[0], FunctionRow)


# --- the commands ---------------------------------------------------------------------------------

def test_cli_top_json_by_layer_at_a_relative_time(recording):
    code, out, err = invoke("report", "top", recording, "--by", "layer", "--at", "+3000ms", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(l["layer"], l["ts_ns"], l["live_bytes"]) for l in doc["layers"]] == [
        ("torch_cpu", int(3.5 * S), 7680), ("native_heap", int(3.5 * S), 4500), ("kernel_slab", int(3.5 * S), 768)]


def test_cli_top_by_function_and_category_tables(recording):
    code, out, _ = invoke("report", "top", recording, "--by", "function", "--layer", "native_heap", "--top", "1")
    assert code == 0 and "[n] malloc (libc.so.6)" in out and "… and 4 more functions" in out
    code, out, _ = invoke("report", "top", recording, "--by", "category", "--layer", "torch_cpu")
    assert code == 0 and "parameter" in out and "72.7%" in out


def test_cli_peak_judges_each_layer_at_its_own_peak(recording):
    code, out, err = invoke("report", "peak", recording, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["at"] == "peak"
    assert [(l["layer"], l["ts_ns"], l["live_bytes"], [r["stack_id"] for r in l["rows"]]) for l in doc["layers"]] == [
        ("torch_cpu", 3 * S, 7680, [None]), ("native_heap", 3 * S, 4500, [2, 1, 3]),
        ("kernel_slab", int(2.5 * S), 832, [4, None])]


def test_cli_chains_flame_to_a_file_and_table(recording, tmp_path):
    out_file = tmp_path / "heap.folded"
    code, out, err = invoke("report", "chains", recording, "--flame", "--layer", "native_heap", "--at", "peak",
                            "-o", out_file)
    assert code == 0 and out == "", err
    assert out_file.read_text() == (
        "native_heap;[py] main (train.py:6);[py] step (train.py:20);[n] malloc (libc.so.6) 3000\n"
        "native_heap;[py] main (train.py:5);[py] load (data.py:10);[n] malloc (libc.so.6) 1000\n"
        "native_heap;[py] main (train.py:7);[py] walk (tree.py:4);[py] walk (tree.py:3);[n] malloc (libc.so.6) 500\n")
    code, out, _ = invoke("report", "chains", recording, "--layer", "native_heap")
    assert code == 0 and "load ← main" in out and "46.1%" in out


@pytest.mark.parametrize("args, message", [
    (["top", "{rec}", "--at", "99s"], "outside the recording, which lasted 9.5s"),
    (["top", "{rec}", "--at", "soon"], "not a duration"),
    (["chains", "{rec}", "--flame", "--format", "json"], "two outputs"),
    (["chains", "{rec}", "-o", "x.folded"], "writes folded stacks"),
])
def test_cli_bad_options_exit_2_with_one_message(recording, args, message):
    code, _, err = invoke("report", *[a.format(rec=recording) for a in args])
    assert code == 2 and message in err and "Traceback" not in err


def test_cli_missing_recording_exits_5(tmp_path):
    code, _, err = invoke("report", "top", tmp_path / "missing.memprof")
    assert code == 5 and "does not exist" in err
    assert invoke("report", "chains", tmp_path / "missing.memprof", "--flame")[0] == 5
