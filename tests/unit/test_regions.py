"""Regions and the memory surface (memprof.analysis.regions, memprof.report.regions): known
marks with numbers and known allocations give known peaks per region, a known grid, and the
terminal text fits 80 and 160 columns."""
from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.regions import HOW_TO, regions
from memprof.analysis.views import About, RegionsView
from memprof.cli.main import cli
from memprof.report import reporters
from memprof.units import format_bytes
from tests.factories import concat_events, ev, events_frame, mark

MS = 1_000_000  # times below are in ms, as far apart as a real sweep's marks
END_NS = 5_000 * MS
WEIGHTS = 1_000  # torch_cpu, stack 1, live from t=100 ms to the end
# (mark time, seq_len, batch, bytes of the region's buffer: stack 2, live [t+100 ms, t+500 ms))
CONFIGS = [(1_000 * MS, 64, 1, 100), (2_000 * MS, 64, 2, 200), (3_000 * MS, 128, 1, 300), (4_000 * MS, 128, 2, 800)]
CARRY = 5_000  # torch_cpu, stack 3: allocated at 2_900 ms, freed at 3_050 ms: live as region 3 begins
PEAKS = [WEIGHTS + 100, WEIGHTS + CARRY, WEIGHTS + CARRY, WEIGHTS + 800]  # torch_cpu's, region by region
CHAINS = {1: [{"kind": "python", "function": "load_weights", "module": None, "file": "sweep.py", "line": 10}],
          2: [{"kind": "python", "function": "forward", "module": None, "file": "model.py", "line": 42},
              {"kind": "python", "function": "run_config", "module": None, "file": "sweep.py", "line": 20}],
          3: [{"kind": "python", "function": "prefetch", "module": None, "file": "sweep.py", "line": 30}]}


def sweep_events(numbers: bool = True) -> pd.DataFrame:
    rows = [ev(100 * MS, "alloc", 0x10, WEIGHTS, 1, layer="torch_cpu")]
    for k, (t, _, _, size) in enumerate(CONFIGS):
        rows.append(mark(t, 100, "config"))
        rows += [ev(t + 100 * MS, "alloc", 0x100 + k, size, 2, layer="torch_cpu"),
                 ev(t + 500 * MS, "free", 0x100 + k, layer="torch_cpu"),
                 ev(t + 200 * MS, "alloc", 0x900 + k, 10 * (k + 1), 4, layer="kernel_slab")]
    rows += [ev(2_900 * MS, "alloc", 0x500, CARRY, 3, layer="torch_cpu"),
             ev(3_050 * MS, "free", 0x500, layer="torch_cpu"),
             mark(2_500 * MS, 100, "halfway"),  # a mark without numbers: no new region
             mark(3_500 * MS, 100, "step")]  # a step mark: not the user's
    return concat_events(events_frame(rows))


def sweep_samples(numbers: bool = True) -> pd.DataFrame:
    rows = []
    for t, seq_len, batch, _ in CONFIGS:
        if numbers:  # the mark's numbers, stamped 30 µs before it, seq_len named first
            rows += [(t, "quantity:seq_len", "", seq_len), (t, "quantity:batch", "", batch)]
        # the forward's sizes, 50 µs after the mark: they make no region and are not the mark's
        rows += [(t + 50_000, "quantity:batch", "", batch), (t + 50_000, "quantity:seq_len", "", seq_len),
                 (t + 50_000, "quantity:tokens", "", 0), (t + 50_000, "rss_bytes", "cpu", 1e6)]
    return pd.DataFrame(rows, columns=["ts_ns", "metric", "device", "value"])


def analysed(events=None, samples=None, **options):
    events = sweep_events() if events is None else events
    samples = sweep_samples() if samples is None else samples
    return regions(pair_lifetimes(events), events, samples, end_ns=END_NS, **options)


def test_each_mark_with_numbers_begins_a_region_until_the_next_and_the_last_until_the_end():
    result = analysed()
    assert result.empty is None and result.quantities == ["seq_len", "batch"]
    assert [(r.index, r.label, r.pid, r.start_ns, r.end_ns) for r in result.regions] == [
        (1, "config", 100, 1_000 * MS, 2_000 * MS), (2, "config", 100, 2_000 * MS, 3_000 * MS),
        (3, "config", 100, 3_000 * MS, 4_000 * MS), (4, "config", 100, 4_000 * MS, END_NS)]
    assert [list(r.quantities.items()) for r in result.regions] == [
        [("seq_len", 64), ("batch", 1)], [("seq_len", 64), ("batch", 2)],
        [("seq_len", 128), ("batch", 1)], [("seq_len", 128), ("batch", 2)]]


def test_peaks_per_region_and_layer_are_exact_with_the_chains_holding_them():
    result = analysed()
    torch = [next(p for p in r.peaks if p.layer == "torch_cpu") for r in result.regions]
    # The 5000-byte prefetch outweighs region 2's and 3's own buffers: region 2 peaks when it
    # is made (2_900 ms), region 3 as it begins (what was live then counts), before its free.
    assert [(p.peak_bytes, p.peak_ns // MS) for p in torch] == [
        (PEAKS[0], 1_100), (PEAKS[1], 2_900), (PEAKS[2], 3_000), (PEAKS[3], 4_100)]
    assert [(c.stack_id, c.live_bytes, c.live_count) for c in torch[0].top_chains] == [(1, WEIGHTS, 1), (2, 100, 1)]
    assert [c.stack_id for c in torch[2].top_chains] == [3, 1]
    # kernel_slab keeps what each region added: 10, 30, 60, 100 bytes at t + 200 ms
    slab = [next(p for p in r.peaks if p.layer == "kernel_slab") for r in result.regions]
    assert [(p.peak_bytes, p.peak_ns // MS, p.device) for p in slab] == [(10, 1_200, "cpu"), (30, 2_200, "cpu"),
                                                                  (60, 3_200, "cpu"), (100, 4_200, "cpu")]
    assert [p.layer for p in result.regions[0].peaks] == ["torch_cpu", "kernel_slab"]  # schema order


def test_layers_option_keeps_only_those_and_top_bounds_the_chains():
    result = analysed(layers=["kernel_slab"], top=1)
    assert {p.layer for r in result.regions for p in r.peaks} == {"kernel_slab"}
    assert all(len(p.top_chains) == 1 for r in result.regions for p in r.peaks)


def test_surface_is_the_grid_of_peaks_first_named_quantity_as_rows():
    surface = analysed().surface
    assert (surface.rows, surface.columns) == ("seq_len", "batch")
    assert (surface.row_values, surface.column_values) == ([64, 128], [1, 2])
    grids = {(g.layer, g.device): g.bytes for g in surface.grids}
    assert grids[("torch_cpu", "cpu")] == [PEAKS[:2], PEAKS[2:]]
    assert grids[("kernel_slab", "cpu")] == [[10, 30], [60, 100]]


def test_a_missing_cell_is_none_and_a_cell_run_twice_holds_the_higher_peak():
    events = sweep_events()
    samples = sweep_samples()
    samples.loc[(samples["ts_ns"] == 2_000 * MS) & (samples["metric"] == "quantity:seq_len"), "value"] = 128
    result = analysed(events, samples)  # regions 2 and 4 are both (128, 2) now; (64, 2) never ran
    grid = next(g.bytes for g in result.surface.grids if g.layer == "torch_cpu")
    assert grid == [[PEAKS[0], None], [PEAKS[2], max(PEAKS[1], PEAKS[3])]]
    assert any("more than one region" in n for n in result.notes)


def test_no_marks_with_numbers_gives_no_regions_and_says_how_to_make_them():
    plain = analysed(samples=sweep_samples(numbers=False))
    assert plain.regions == [] and plain.surface is None
    assert plain.empty == f"no regions: none of your 5 marks (memprof.mark) carries numbers; {HOW_TO}"
    events = sweep_events()
    unmarked = events[events["category"].astype(object) != "config"]
    none = analysed(events=unmarked[unmarked["category"].astype(object) != "halfway"])
    assert none.empty == f"no regions: the recording has no marks of yours (memprof.mark); {HOW_TO}"


def test_one_varying_quantity_gives_regions_and_no_surface_with_the_reason():
    samples = sweep_samples()
    only_seq = samples[samples["metric"] != "quantity:batch"]
    result = analysed(samples=only_seq)
    assert len(result.regions) == 4 and result.surface is None
    assert result.notes == ["no memory surface: only seq_len varies over the regions (it needs two, e.g. seq_len "
                            "and batch)"]


def view(result=None) -> RegionsView:
    return RegionsView(analysed() if result is None else result, About("sweep.memprof", start_ns=0), CHAINS)


def test_json_has_regions_peaks_named_chains_and_the_surface():
    data = reporters.to_json(view())
    assert data["empty"] is None and data["quantities"] == ["seq_len", "batch"]
    first = data["regions"][0]
    assert first["quantities"] == {"seq_len": 64, "batch": 1} and isinstance(first["quantities"]["seq_len"], int)
    torch = first["peaks"][0]
    assert (torch["layer"], torch["device"], torch["peak_bytes"], torch["peak_ns"]) == \
        ("torch_cpu", "cpu", 1_100, 1_100 * MS)
    assert torch["top_chains"][1]["name"] == "forward (model.py:42) ← run_config (sweep.py:20)"
    assert [f["function"] for f in torch["top_chains"][1]["stack"]] == ["forward", "run_config"]
    assert data["surface"]["grids"][0] == {"layer": "torch_cpu", "device": "cpu",
                                           "bytes": [[1_100, 6_000], [6_000, 1_800]]}
    assert (data["surface"]["row_values"], data["surface"]["column_values"]) == ([64, 128], [1, 2])


def rendered(result, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    reporters.render(view(result), console)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 160])
def test_text_fits_the_width_and_shows_each_region_and_the_grid(width):
    text = rendered(analysed(), width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "region 1 config  seq_len=64 batch=1  +1.00s for 1.00s" in text
    assert "region 4 config  seq_len=128 batch=2  +4.00s for 1.00s" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.strip().startswith("128 ") and "KiB" in line)  # torch_cpu's row
    assert row.split() == ["128", *format_bytes(WEIGHTS + CARRY).split(), *format_bytes(WEIGHTS + 800).split()]
    assert "seq_len \\ batch" in text and "memory surface" in text
    region3 = lines[lines.index(next(line for line in lines if line.startswith("region 3"))) + 3]
    assert region3.split()[:5] == ["torch_cpu", "cpu", "5.9", "KiB", "+0us"]  # at its start
    assert f"{format_bytes(CARRY)}  prefetch (sweep.py:30)" in region3


def test_long_chain_names_end_in_an_ellipsis_at_80_columns_and_not_at_160():
    long = {3: [{"kind": "python", "function": "f" * 70, "module": None, "file": "model.py", "line": 1}]}
    for width, cut in ((80, True), (160, False)):
        console = Console(width=width, record=True, color_system=None)
        reporters.render(RegionsView(analysed(), About("s", start_ns=0), {**CHAINS, **long}), console)
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        assert (("f" * 70 + " (model.py:1)") not in text) == cut


def test_a_wide_sweep_is_cut_into_column_groups_at_80_columns():
    rows = [ev(100, "alloc", 0x10, 1 << 30, 1, layer="torch_cpu")]
    samples, batches = [], list(range(1, 13))
    for k, batch in enumerate(batches):
        t = 1_000 * MS * (k + 1)
        rows.append(mark(t, 100, "config"))
        samples += [(t, "quantity:seq_len", "", 512 * (1 + k % 2)), (t, "quantity:batch", "", batch)]
    events = concat_events(events_frame(rows))
    result = regions(pair_lifetimes(events), events, pd.DataFrame(samples, columns=["ts_ns", "metric", "device", "value"]),
                     end_ns=20_000 * MS)
    text = rendered(result, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    heads = [line.split() for line in text.splitlines() if line.strip().startswith("seq_len \\ batch")]
    assert [int(v) for head in heads for v in head[3:]] == batches and len(heads) > 1
    assert "1.0 GiB" in text


def test_empty_result_prints_why_and_json_says_so():
    result = analysed(samples=sweep_samples(numbers=False))
    assert "no regions: none of your 5 marks" in rendered(result, 80)
    assert reporters.to_json(view(result))["empty"].startswith("no regions")


def test_command_help_says_what_a_region_is_and_how_to_make_one():
    result = CliRunner().invoke(cli, ["report", "regions", "--help"])
    assert result.exit_code == 0
    assert 'memprof.mark("config", seq_len=seq_len, batch=batch)' in result.stdout
    assert "to the next" in result.stdout and "--layer" in result.stdout and "--format" in result.stdout
