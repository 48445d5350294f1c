"""diff_recordings, chain_identities, the diff renderers and `memprof diff`: known answers."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.diff import NO_STACK, Recorded, chain_identities, diff_recordings
from memprof.analysis.leaks import chain_frames, end_of_target
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.analysis.views import About, DiffView
from memprof.report.diff import render, to_json
from tests.diff_factories import KiB, MiB, S, moved, write_recording
from tests.factories import ev, events_frame, mark, stacks_frames

N = 12_345  # what the training chain grew by, in bytes

TRAIN = [("native", "malloc", "libc.so.6", None, None), ("python", "collate[batch]", None, "train.py", 40),
         ("python", "main", None, "train.py", 9)]
PIPE = [("kernel", "__kmalloc+0x2f", "vmlinux", None, None), ("kernel", "alloc_pipe_info+0x3f", "vmlinux", None, None)]
OLD = [("native", "malloc", "libc.so.6", None, None), ("python", "old_cache", None, "train.py", 60)]
NEW = [("native", "malloc", "libc.so.6", None, None), ("python", "new_cache", None, "train.py", 70)]

# A: 1 MiB (train) and 256 KiB (old) held at the end, 2 MiB (train) from 3 s to 4 s: native
# peak 3.25 MiB at 3 s; 4 KiB of kernel_slab; the target begins to exit at 9 s.
CHAINS_A = {1: TRAIN, 2: PIPE, 3: OLD}
EVENTS_A = events_frame([
    (1 * S, "alloc", 0xA0, MiB, 1), (2 * S, "alloc", 0xB0, 256 * KiB, 3),
    (3 * S, "alloc", 0xC0, 2 * MiB, 1), (4 * S, "free", 0xC0),
    ev(1 * S, "alloc", 0x10, 4 * KiB, 2, layer="kernel_slab"), mark(9 * S, pid=100),
])
# B, a commit later: every stack id differs and every line moved. The training chain is
# captured under two ids (11, and 14 with other lines: still one chain) and holds N bytes
# more; old_cache is gone, new_cache new (512 KiB at the end and at the peak; its 1 MiB
# made after the exit began counts for neither); the pipe is unchanged.
CHAINS_B = {11: moved(TRAIN, 3), 12: moved(PIPE, 1), 13: NEW, 14: moved(TRAIN, 5)}
EVENTS_B = events_frame([
    (1 * S, "alloc", 0xA0, MiB, 11), (int(1.5 * S), "alloc", 0xA8, N, 14), (2 * S, "alloc", 0xB0, 512 * KiB, 13),
    (3 * S, "alloc", 0xC0, 2 * MiB, 11), (4 * S, "free", 0xC0), (int(9.5 * S), "alloc", 0xD0, MiB, 13),
    ev(1 * S, "alloc", 0x10, 4 * KiB, 12, layer="kernel_slab"), mark(9 * S, pid=100),
])


def recorded(events: pd.DataFrame, chains: dict, end_ns: int = 10 * S) -> Recorded:
    stacks, frames = stacks_frames(chains)
    return Recorded(pair_lifetimes(events), stacks, frames, end_of_target(events, 100, end_ns))


def summary(chain) -> tuple:
    return (chain.status, chain.stack_id_a, chain.stack_id_b, chain.end_a, chain.end_b, chain.peak_a, chain.peak_b)


def test_a_chain_that_grew_by_n_bytes_is_matched_across_ids_and_lines():
    result = diff_recordings(recorded(EVENTS_A, CHAINS_A), recorded(EVENTS_B, CHAINS_B))
    heap, slab = result.layers
    train = next(c for c in heap.chains if c.frames[1][1] == "collate[batch]")
    assert summary(train) == ("both", 1, 11, MiB, MiB + N, 3 * MiB, 3 * MiB + N)
    assert (train.end_delta, train.peak_delta) == (N, N)
    assert train.frames == (("native", "malloc", "libc.so.6", None), ("python", "collate[batch]", None, "train.py"),
                            ("python", "main", None, "train.py"))
    # The unchanged pipe matched too, though its offsets moved: no changed chain in kernel_slab.
    assert (slab.layer, slab.peak_a, slab.peak_b, slab.end_a, slab.end_b, slab.changed, slab.chains) == \
        ("kernel_slab", 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB, 0, [])


def test_new_and_gone_chains_sorted_by_the_biggest_change():
    heap = diff_recordings(recorded(EVENTS_A, CHAINS_A), recorded(EVENTS_B, CHAINS_B)).layers[0]
    assert [summary(c) for c in heap.chains] == [
        ("new", None, 13, 0, 512 * KiB, 0, 512 * KiB),
        ("gone", 3, None, 256 * KiB, 0, 256 * KiB, 0),
        ("both", 1, 11, MiB, MiB + N, 3 * MiB, 3 * MiB + N),
    ]
    assert (heap.changed, heap.new, heap.gone) == (3, 1, 1)


def test_per_layer_peak_and_end_deltas():
    result = diff_recordings(recorded(EVENTS_A, CHAINS_A), recorded(EVENTS_B, CHAINS_B))
    heap = result.layers[0]
    assert (heap.layer, heap.peak_a, heap.peak_b, heap.peak_ns_a, heap.peak_ns_b) == \
        ("native_heap", 3 * MiB + 256 * KiB, 3 * MiB + 512 * KiB + N, 3 * S, 3 * S)
    assert (heap.end_a, heap.end_b) == (MiB + 256 * KiB, MiB + 512 * KiB + N)
    assert heap.peak_delta == 256 * KiB + N and heap.end_delta == 256 * KiB + N
    assert heap.peak_pct == 100 * (256 * KiB + N) / (3 * MiB + 256 * KiB)
    assert (result.end_ns_a, result.end_ns_b) == (9 * S, 9 * S)


def test_layer_filter_top_and_a_layer_only_in_b():
    b_events = pd.concat([EVENTS_B, events_frame([ev(2 * S, "alloc", 0xE0, 3000, 13, layer="torch_cpu")])],
                         ignore_index=True)
    result = diff_recordings(recorded(EVENTS_A, CHAINS_A), recorded(b_events, CHAINS_B), top=1)
    assert [layer.layer for layer in result.layers] == ["torch_cpu", "native_heap", "kernel_slab"]
    torch_cpu = result.layers[0]
    assert (torch_cpu.peak_a, torch_cpu.peak_b, torch_cpu.peak_ns_a, torch_cpu.peak_pct, torch_cpu.end_pct) == \
        (0, 3000, None, None, None)
    assert [summary(c) for c in torch_cpu.chains] == [("new", None, 13, 0, 3000, 0, 3000)]
    heap = result.layers[1]
    assert [c.status for c in heap.chains] == ["new"] and heap.changed == 3
    only = diff_recordings(recorded(EVENTS_A, CHAINS_A), recorded(b_events, CHAINS_B), layers=["kernel_slab"])
    assert [layer.layer for layer in only.layers] == ["kernel_slab"]


def test_allocations_without_a_stack_are_one_chain_and_weights_count():
    a = events_frame([(1 * S, "alloc", 0xA0, 100, None), (1 * S, "alloc", 0xB0, 50, 77)])  # 77: stack not recorded
    b = events_frame([ev(1 * S, "alloc", 0xA0, 100, None, weight=4.0)])
    (heap,) = diff_recordings(recorded(a, {}), recorded(b, {})).layers
    assert [summary(c) for c in heap.chains] == [("both", None, None, 150, 400, 150, 400)]
    assert heap.chains[0].frames == NO_STACK
    assert (heap.peak_a, heap.peak_b) == (150, 400)


def test_chain_identities_drop_lines_and_offsets_and_read_nulls_as_none():
    stacks, frames = stacks_frames({5: [("kernel", "kfree+0x1a", "vmlinux", None, None),
                                        ("python", "step", None, "t.py", 3)], 2: [("native", "f", "m", "f.c", 7)]})
    frames.loc[1, "module"] = np.nan  # readers give NaN/NA as well as None: both read None
    stacks = pd.concat([stacks, pd.DataFrame({"stack_id": [2], "depth": [1], "frame_id": [99]})], ignore_index=True)
    ids = chain_identities(stacks, frames)
    assert ids.index.tolist() == [2, 5]
    assert ids[5] == (("kernel", "kfree", "vmlinux", None), ("python", "step", None, "t.py"))
    assert ids[2] == (("native", "f", "m", "f.c"), (None, None, None, None))  # frame 99 is missing
    assert chain_identities(stacks.iloc[:0], frames).empty


# --- rendering ----------------------------------------------------------------------------

GOLDEN = """\
Diff  A: base.memprof  →  B: head.memprof
end (target began to exit, or end of recording): A +9.00s, B +9.00s

  layer          peak A    peak B               Δ peak     end A     end B                 Δ end
 ────────────────────────────────────────────────────────────────────────────────────────────────
  native_heap   3.2 MiB   3.5 MiB   +268.1 KiB (+8.1%)   1.2 MiB   1.5 MiB   +268.1 KiB (+20.9%)
  kernel_slab   4.0 KiB   4.0 KiB                  0 B   4.0 KiB   4.0 KiB                   0 B

native_heap: 3 changed chains (1 new, 1 gone), biggest change first

      Δ end           end A → B       Δ peak       at peak A → B   chain
 ───────────────────────────────────────────────────────────────────────────────────────
 +512.0 KiB     0 B → 512.0 KiB   +512.0 KiB     0 B → 512.0 KiB   new new_cache
 -256.0 KiB     256.0 KiB → 0 B   -256.0 KiB     256.0 KiB → 0 B   gone old_cache
  +12.1 KiB   1.0 MiB → 1.0 MiB    +12.1 KiB   3.0 MiB → 3.0 MiB   collate[batch] ← main
"""


def rendered() -> tuple[str, dict]:
    a, b = recorded(EVENTS_A, CHAINS_A), recorded(EVENTS_B, CHAINS_B)
    result = diff_recordings(a, b)
    shown = [c for layer in result.layers for c in layer.chains]
    chains_a = chain_frames(a.stacks, a.frames, [c.stack_id_a for c in shown])
    chains_b = chain_frames(b.stacks, b.frames, [c.stack_id_b for c in shown])
    console = Console(width=100, record=True, color_system=None)
    view = DiffView(result, chains_a, chains_b, About("base.memprof"), About("head.memprof"))
    render(view, console)
    return console.export_text(), to_json(view)


def test_terminal_golden_at_width_100():
    """Trailing blanks aside (rich pads tables to their width), line for line; "[batch]" is
    shown, not read as markup."""
    text, _ = rendered()
    assert [line.rstrip() for line in text.splitlines()] == GOLDEN.splitlines() + [""]


def test_a_long_chain_never_cuts_the_numbers():
    """At 80 columns a chain of long C++ names takes the width that is left, cut with an
    ellipsis; each number stays whole (before 2026-12-07 they read "0…" and "+233.4…")."""
    from memprof.analysis.diff import ChainDiff, LayerDiff
    from memprof.report.diff import _chains_table
    name = "at::detail::empty_cpu(c10::ArrayRef<long>, c10::ScalarType, bool, std::optional<c10::MemoryFormat>)"
    chain = ChainDiff(layer="torch_cpu", frames=(), status="both", stack_id_a=1, stack_id_b=1, end_a=0, end_b=0,
                      peak_a=1000 * KiB, peak_b=245_760_000)
    layer = LayerDiff(layer="torch_cpu", peak_a=0, peak_b=0, peak_ns_a=None, peak_ns_b=None, end_a=0, end_b=0,
                      chains=[chain])
    console = Console(width=80, record=True, color_system=None)
    console.print(_chains_table(layer, {}, {1: [{"kind": "native", "function": name, "module": "libtorch_cpu.so",
                                                 "file": None, "line": None}]}, console.width))
    (row,) = [line for line in console.export_text().splitlines() if "at::detail" in line]
    assert "+233.4 MiB" in row and "1000.0 KiB → 234.4 MiB" in row and "0 B → 0 B" in row, row
    assert row.rstrip().endswith("…") and len(row.rstrip()) <= 80, row


def test_json_has_every_number_identity_and_b_lines():
    _, doc = rendered()
    json.dumps(doc)  # plain types only
    assert doc["a"] == {"recording": "base.memprof", "end_ns": 9 * S, "lost_events": 0}
    heap = doc["layers"][0]
    assert {k: heap[k] for k in ("layer", "peak_a", "peak_b", "end_a", "end_b", "changed", "new", "gone")} == {
        "layer": "native_heap", "peak_a": 3 * MiB + 256 * KiB, "peak_b": 3 * MiB + 512 * KiB + N,
        "end_a": MiB + 256 * KiB, "end_b": MiB + 512 * KiB + N, "changed": 3, "new": 1, "gone": 1}
    train = heap["chains"][2]
    assert (train["status"], train["end_delta"], train["peak_delta"], train["stack_id_a"], train["stack_id_b"]) == \
        ("both", N, N, 1, 11)
    assert train["identity"][1] == {"kind": "python", "function": "collate[batch]", "module": None, "file": "train.py"}
    assert train["stack"][1]["line"] == 43  # B's line
    gone = heap["chains"][1]
    assert gone["stack"][1] == {"kind": "python", "function": "old_cache", "module": None, "file": "train.py",
                                "line": 60}
    assert doc["layers"][1]["peak_pct"] == 0.0 and doc["layers"][1]["chains"] == []


# --- the command --------------------------------------------------------------------------

def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def recordings(tmp_path):
    return (write_recording(tmp_path / "base.memprof", EVENTS_A, CHAINS_A),
            write_recording(tmp_path / "head.memprof", EVENTS_B, CHAINS_B, lost=7))


def test_diff_command_json(tmp_path):
    base, head = recordings(tmp_path)
    code, out, err = invoke("diff", base, head, "--format", "json", "--top", "2", "--layer", "native_heap")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["b"] == {"recording": str(head), "end_ns": 9 * S, "lost_events": 7}
    (heap,) = doc["layers"]
    assert [(c["status"], c["end_delta"]) for c in heap["chains"]] == [("new", 512 * KiB), ("gone", -256 * KiB)]
    assert heap["changed"] == 3 and heap["end_delta"] == 256 * KiB + N


def test_diff_command_table_warns_of_loss(tmp_path):
    base, head = recordings(tmp_path)
    code, out, err = invoke("diff", base, head)
    assert code == 0, err
    assert "! B: 7 events were lost while recording" in out
    assert "+268.1 KiB (+8.1%)" in out and "collate[batch] ← main" in out


def test_diff_of_a_missing_recording_exits_5(tmp_path):
    base, _ = recordings(tmp_path)
    code, out, err = invoke("diff", base, tmp_path / "nope.memprof")
    assert code == 5 and out == ""
    assert "nope.memprof" in err
