"""`memprof report html`: the page's data has known answers, the page is self-contained and
small, and it works in a real browser (headless Chromium, skipped with a reason without one)."""
from __future__ import annotations

import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memprof.analysis.chains import canonical_stacks
from memprof.analysis.html_data import MAX_POINTS, html_data, stacked_layers, timeline_series
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter, open_recording
from memprof.analysis.views import About, HtmlView
from memprof.report.html import html_page
from memprof.timeline import timeline
from tests.factories import concat_events, leak, random_lifetimes, stacks_frames
from tests.html_factories import (
    EXIT_NS, LEAK_BYTES, LEAKY_FUNCTION, LOST, MiB, OOM_NS, START_NS, STEP_NS, STEPS, leaky_recording,
)

DATA_BLOB = re.compile(r'<script type="application/json" id="memprof-data">(.*?)</script>', re.S)


def invoke(*args):
    """Run the CLI in this process; (exit code, stdout, stderr)."""
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def leaky(tmp_path_factory) -> Path:
    return leaky_recording(tmp_path_factory.mktemp("html") / "leak.memprof")


@pytest.fixture(scope="module")
def page(leaky) -> str:
    out = leaky.parent / "leak.html"
    code, _, err = invoke("report", "html", leaky, "-o", out)
    assert code == 0, err
    return out.read_text(encoding="utf-8")


def blob(page_text: str) -> dict:
    return json.loads(DATA_BLOB.search(page_text).group(1))


# --- curves ------------------------------------------------------------------------------------

def test_layer_curve_is_exact_below_the_cap_and_layers_stay_apart():
    events = concat_events(leak(3, size=4096, every_ns=10), leak(2, size=100, layer="kernel_slab", start_ns=5))
    series = timeline_series(pair_lifetimes(events), None)
    assert [(s.name, s.device, s.family) for s in series] == [("native_heap", "cpu", "host"),
                                                              ("kernel_slab", "cpu", "kernel")]
    heap, slab = series
    assert heap.times_ns.tolist() == [0, 10, 20] and heap.values.tolist() == [4096, 8192, 12288]
    assert (heap.peak, heap.peak_ns, heap.final, slab.peak, slab.final) == (12288, 20, 12288, 200, 200)


def test_layers_that_do_not_nest_are_stacked_on_shared_times_and_nested_ones_are_not():
    """native_heap holds torch_cpu (nested: only the heap is stacked); kernel_slab does not nest
    with either, so cpu gets heap + slab on the union of their times, 0 before a layer starts."""
    events = concat_events(leak(3, size=4096, every_ns=10),
                           leak(2, size=100, layer="kernel_slab", start_ns=5, every_ns=10),
                           leak(1, size=64, layer="torch_cpu", start_ns=1))
    [stack] = stacked_layers(timeline_series(pair_lifetimes(events), None))
    assert (stack.device, stack.layers) == ("cpu", ["native_heap", "kernel_slab"])
    assert stack.times_ns.tolist() == [0, 5, 10, 15, 20]
    assert [v.tolist() for v in stack.values] == [[4096, 4096, 8192, 8192, 12288], [0, 100, 100, 200, 200]]
    alone = concat_events(leak(2, size=10, layer="cuda_block"), leak(1, size=99, layer="cuda_segment"))
    assert stacked_layers(timeline_series(pair_lifetimes(alone), None)) == []  # a block lives in its segment


# --- the page's data ----------------------------------------------------------------------------

def test_page_data_has_the_known_leak_steps_oom_samples_and_warning(page):
    data = blob(page)
    assert set(data) >= {"version", "recording", "meta", "span", "warnings", "series", "steps", "ooms", "leaks",
                         "frames", "flames", "gpu", "max_points"}
    finding = data["leaks"]["findings"][0]
    assert (finding["layer"], finding["kind"], finding["live_bytes"], finding["live_count"]) == \
        ("native_heap", "grows_per_step", STEPS * LEAK_BYTES, STEPS)
    assert finding["slope_bytes_per_step"] == LEAK_BYTES
    assert [f["function"] for f in finding["stack"]] == ["malloc", LEAKY_FUNCTION, "main"]
    assert data["span"] == {"start_ns": START_NS, "end_ns": EXIT_NS,
                            "recording_end_ns": START_NS + (STEPS + 1) * STEP_NS}
    assert data["steps"] == [[k * STEP_NS, k] for k in range(STEPS)]
    assert data["ooms"] == [{"t": OOM_NS - START_NS, "layer": "cuda_block", "device": "cuda:0", "size_bytes": 64 * MiB}]
    assert any(f"{LOST} events were lost" in w for w in data["warnings"])
    names = {(s["name"], s["device"]): s for s in data["series"]}
    assert names[("native_heap", "cpu")]["peak"] == MiB + STEPS * LEAK_BYTES
    assert names[("cuda_segment", "cuda:0")]["peak"] == 8 * MiB and names[("cuda_block", "cuda:0")]["final"] == 0
    assert names[("rss_bytes", "cpu")]["family"] == "host" and names[("gpu_used_bytes", "cuda:0")]["family"] == "gpu"
    assert data["gpu"]["devices"][0]["device"] == "cuda:0" and data["gpu"]["devices"][0]["peak"]["used_nvml"] == 9 * MiB


def test_flame_at_the_end_holds_the_leak_under_its_chain_outermost_first(page):
    data = blob(page)
    heap = next(f for f in data["flames"]["end"] if f["layer"] == "native_heap")
    frame, nbytes, children = heap["root"]
    assert (frame, nbytes, heap["live_count"]) == (-1, STEPS * LEAK_BYTES, STEPS)
    path, node = [], children[0]
    while True:
        path.append(data["frames"][node[0]][1])
        assert node[1] == STEPS * LEAK_BYTES
        if not node[2]:
            break
        node = node[2][0]
    assert path == ["main", LEAKY_FUNCTION, "malloc"] and len(children) == 1
    assert data["frames"][children[0][0]][0] == "python"
    peak = next(f for f in data["flames"]["peak"] if f["layer"] == "native_heap")
    assert peak["root"][1] == MiB + STEPS * LEAK_BYTES  # the churn's 1 MiB is live at the peak


def test_page_is_self_contained_and_the_data_cannot_close_its_script(page):
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|fetch\(|XMLHttpRequest", page)
    raw = DATA_BLOB.search(page).group(1)
    assert "<" not in raw and "\\u003c" in raw  # fill_leaky_cache_<lambda>, escaped
    assert any(f[1] == LEAKY_FUNCTION for f in blob(page)["frames"])
    assert page.count("</script>") == 2 and page.startswith("<!DOCTYPE html>")


def test_page_size_is_bounded_and_curves_are_capped_whatever_the_recording_length():
    def built(n_allocs: int) -> tuple[int, dict]:
        events = random_lifetimes(n_allocs, seed=1)
        meta = RecordingMeta(start_ns=0, end_ns=int(events["ts_ns"].max()) + 1)
        stacks, frames = stacks_frames({})
        data = html_data(events, pair_lifetimes(events), stacks=stacks, frames=frames, samples=None, meta=meta)
        text = html_page(HtmlView(data, meta, About("big.memprof")))
        return len(text.encode()), blob(text)

    small_size, _ = built(50_000)
    size, data = built(500_000)  # ~10^6 events
    assert all(len(s["t"]) == len(s["v"]) <= MAX_POINTS for s in data["series"])  # peaks kept: series.downsample_max
    assert [s["points_in"] > MAX_POINTS for s in data["series"]] == [True, True, True]
    # Curves are capped, so 10x the events adds little: 10^7 events stay far below 5 MB.
    assert size < 2 * small_size and size + 10 * (size - small_size) < 5_000_000


# --- the command --------------------------------------------------------------------------------

def test_command_writes_the_page_and_says_where_in_one_line(leaky, tmp_path):
    out = tmp_path / "p.html"
    code, stdout, stderr = invoke("report", "html", leaky, "-o", out)
    assert code == 0 and stdout == ""
    assert re.fullmatch(rf"memprof: wrote {re.escape(str(out))} \(0\.\d MB\)\n", stderr)


def test_json_format_prints_the_data_blob(leaky):
    code, stdout, _ = invoke("report", "html", leaky, "--format", "json")
    assert code == 0 and json.loads(stdout)["leaks"]["findings"][0]["live_count"] == STEPS


def test_bad_path_exits_5_with_a_hint(tmp_path):
    code, _, stderr = invoke("report", "html", tmp_path / "nope.memprof", "-o", tmp_path / "x.html")
    assert code == 5 and "memprof: error:" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "x.html").exists()


def test_unwritable_output_exits_1_with_a_hint(leaky, tmp_path):  # as every command's -o (cli/output.py)
    code, _, stderr = invoke("report", "html", leaky, "-o", tmp_path / "no" / "such" / "dir.html")
    assert code == 1 and "cannot write" in stderr and "hint:" in stderr


def test_empty_recording_gives_a_valid_page_that_says_so(tmp_path):
    writer = RecordingWriter(tmp_path / "empty.memprof", RecordingMeta(memprof_version="0.1.0", start_ns=1_000))
    writer.finalize(end_ns=2_000)
    code, _, err = invoke("report", "html", writer.path, "-o", tmp_path / "e.html")
    assert code == 0, err
    data = blob((tmp_path / "e.html").read_text())
    assert data["series"] == [] and data["leaks"]["findings"] == [] and data["gpu"]["devices"] == []
    assert data["flames"] == {"end": [], "peak": []}


def test_help_explains_the_page():
    code, stdout, _ = invoke("report", "html", "--help")
    assert code == 0 and "opens offline" in stdout and "--format" in stdout and "-o, --output" in stdout


# --- a real browser -----------------------------------------------------------------------------

def _chromium_missing() -> str | None:
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _chromium_missing()
    if why:
        pytest.skip(f"no headless browser: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,1600"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def test_page_in_a_real_browser_loads_cleanly_names_the_leak_zooms_and_draws(page, leaky, browser):
    path = leaky.parent / "leak.html"
    # Catch errors thrown while the page starts, before any test code could install a handler.
    guarded = page.replace("<head>", "<head><script>window.__errors = []; window.onerror = function (m) "
                                     "{ window.__errors.push(String(m)); };</script>", 1)
    path.write_text(guarded, encoding="utf-8")
    browser.get(path.as_uri())
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == [] and browser.execute_script("return window.__errors") == []

    body = browser.find_element("tag name", "body").text
    assert LEAKY_FUNCTION in body and "grows per step" in body
    browser.find_element("css selector", "details.finding summary").click()
    assert "train.py:42" in browser.find_element("css selector", "details.finding ol.chain").text

    charts = browser.find_element("id", "charts")
    before = (charts.get_attribute("data-t0"), charts.get_attribute("data-t1"),
              [e.text for e in browser.find_elements("css selector", "text.x-tick")])
    assert before[:2] == ("0", str((STEPS + 1) * STEP_NS))
    browser.execute_script("window.memprof.zoom(10, 15)")
    after = (charts.get_attribute("data-t0"), charts.get_attribute("data-t1"),
             [e.text for e in browser.find_elements("css selector", "text.x-tick")])
    assert after[:2] == (str(10 * STEP_NS), str(15 * STEP_NS)) and after[2] != before[2]
    assert after[2][0] == "10.00 s" and browser.execute_script("return window.memprof.range()") == [10, 15]

    flame_texts = [e.text for e in browser.find_elements("css selector", "#flame text")]
    assert any(t.startswith("main") for t in flame_texts)
    assert browser.execute_script("return window.__errors") == []
    # The whole window's screenshot, as asked; decoded in pure Python, so only the first chart's.
    assert len(browser.get_screenshot_as_png()) > 10_000
    assert _colours(browser.find_element("css selector", ".chart svg").screenshot_as_png) > 4


def _colours(png: bytes) -> int:
    """Distinct pixel colours of a PNG (8-bit RGB or RGBA, non-interlaced), decoded with zlib."""
    width, height, depth, colour_type = struct.unpack(">IIBB", png[16:26])
    assert depth == 8 and colour_type in (2, 6)
    chunks, pos = [], 8
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            chunks.append(png[pos + 8:pos + 8 + length])
        pos += 12 + length
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * bpp
    pixels, prior = set(), bytearray(stride)
    for y in range(height):
        row = _unfiltered(raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)], prior, bpp)
        pixels.update(bytes(row[x:x + 3]) for x in range(0, stride, bpp))
        prior = row
    return len(pixels)


def _unfiltered(kind: int, line: bytes, prior: bytearray, bpp: int) -> bytearray:
    """One row with PNG's filter undone (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth)."""
    row = bytearray(line)
    for x in range(len(row)):
        left = row[x - bpp] if x >= bpp else 0
        up, corner = prior[x], (prior[x - bpp] if x >= bpp else 0)
        if kind == 1:
            pred = left
        elif kind == 2:
            pred = up
        elif kind == 3:
            pred = (left + up) >> 1
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
        else:
            pred = 0
        row[x] = (row[x] + pred) & 0xFF
    return row


def test_a_page_without_leaks_says_in_the_browser_that_the_c_heap_was_not_recorded(tmp_path, browser):
    """Recorded with the default sources (no native family) and nothing leaked: the page's
    "No leaks found." goes with the line `report leaks` prints, not alone."""
    from memprof.model.meta import SourceStats
    meta = RecordingMeta(memprof_version="0.1.0", start_ns=1_000,
                         sources={"ebpf": SourceStats(detail={"families": ["kmem", "torch", "cuda"]})})
    writer = RecordingWriter(tmp_path / "quiet.memprof", meta)
    writer.finalize(end_ns=2_000)
    code, _, err = invoke("report", "html", writer.path, "-o", tmp_path / "quiet.html")
    assert code == 0, err
    assert blob((tmp_path / "quiet.html").read_text())["leaks_text"]["unrecorded_heap"].startswith("Not recorded:")
    browser.get((tmp_path / "quiet.html").as_uri())
    leaks = browser.find_element("id", "leaks").text
    assert "No leaks found." in leaks and "--sources +native" in leaks, leaks


def test_kernel_memory_that_may_be_freed_unseen_says_so_in_the_browser(tmp_path, browser):
    """A recording where a process went unseen (meta.json's unseen_tasks): the kernel finding
    that outlived the target is marked in its summary line, as `report leaks` marks it; the
    one its exit released is not."""
    from tests.diff_factories import write_recording
    from tests.factories import ev, events_frame, mark
    s = 1_000_000_000
    rows = [ev(s, "alloc", 0x100 + i, 4096, 1, pid=100, layer="kernel_slab") for i in range(3)]  # outlives it
    rows += [ev(s, "alloc", 0x900 + i, 64, 2, pid=100, layer="kernel_slab") for i in range(5)]
    rows += [mark(8 * s, 100)] + [ev(int(8.5 * s), "free", 0x900 + i, 0, None, pid=100, layer="kernel_slab")
                                  for i in range(5)]
    chains = {1: [("kernel", "sock_alloc_inode", "vmlinux", None, None)],
              2: [("kernel", "alloc_pipe_info", "vmlinux", None, None)]}
    path = write_recording(tmp_path / "unseen.memprof", events_frame(rows), chains)
    meta = json.loads((path / "meta.json").read_text())
    meta["sources"]["ebpf"] = {"events": 13, "detail": {"unseen_tasks": [
        {"pid": 1, "comm": "process_api", "threads": [97], "switches": 4}]}}
    (path / "meta.json").write_text(json.dumps(meta))
    code, _, err = invoke("report", "html", path, "-o", tmp_path / "unseen.html")
    assert code == 0, err
    browser.get((tmp_path / "unseen.html").as_uri())
    summaries = [e.text for e in browser.find_elements("css selector", "#leaks details.finding summary")]
    assert [("may be freed unseen" in t, "sock_alloc_inode" in t) for t in summaries] == [(True, True), (False, False)]
    assert "no probe ran while process 1 (process_api) had a CPU" in browser.find_element("tag name", "body").text


def test_the_pages_skipped_figure_counts_frees_only(tmp_path):
    """A recording made before 2026-12-06 lists the allocations its programs were skipped
    for in `missed` too, which were never the target's and no loss (analysis/loss.py): the
    page's "frees skipped by the kernel" counts the free tracepoints' alone."""
    from memprof.model.meta import SourceStats
    old = SourceStats(missed={"kmem_cache_alloc": 124, "mm_page_alloc": 9, "kfree": 3, "kmem_cache_free": 2})
    meta = RecordingMeta(memprof_version="0.1.0", start_ns=1_000, sources={"ebpf": old})
    writer = RecordingWriter(tmp_path / "old.memprof", meta)
    writer.finalize(end_ns=2_000)
    code, _, err = invoke("report", "html", writer.path, "-o", tmp_path / "old.html")
    assert code == 0, err
    data = blob((tmp_path / "old.html").read_text())["meta"]
    assert (data["skipped_frees"], data["lost_events"]) == (5, 0)
    assert "missed_events" not in data
