"""The memory surface on the HTML page and `report regions` on a recording: a 3 × 3 sweep with
known peaks (tests/regions_factories.py) gives nine cells with those peaks, drawn in a real
browser (headless Chromium, skipped with a reason without one)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprof.units import format_bytes
from tests.regions_factories import BATCHES, SEQ_LENS, configs, peak_bytes, sweep_recording
from tests.unit.test_html import blob, browser, invoke  # noqa: F401 (browser: the fixture)

EXPECTED = [[peak_bytes(s, b) for b in BATCHES] for s in SEQ_LENS]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return sweep_recording(tmp_path_factory.mktemp("sweep") / "sweep.memprof")


@pytest.fixture(scope="module")
def sweep_page(sweep) -> Path:
    out = sweep.parent / "sweep.html"
    code, _, err = invoke("report", "html", sweep, "-o", out)
    assert code == 0, err
    return out


def test_report_regions_json_has_nine_regions_and_the_known_grid(sweep):
    code, stdout, err = invoke("report", "regions", sweep, "--format", "json")
    assert code == 0, err
    data = json.loads(stdout)
    assert [(r["start_ns"], r["quantities"]) for r in data["regions"]] == \
        [(t, {"seq_len": s, "batch": b}) for t, s, b in configs()]
    assert data["surface"]["grids"] == [{"layer": "torch_cpu", "device": "cpu", "bytes": EXPECTED}]
    assert data["regions"][8]["peaks"][0]["top_chains"][0]["name"] == "forward (model.py:42) ← main (sweep.py:5)"


def test_report_regions_text_at_80_columns(sweep):
    code, stdout, err = invoke("report", "regions", sweep)
    assert code == 0, err
    assert "region 9 config  seq_len=256 batch=4" in stdout
    assert [line.split()[0] for line in stdout.splitlines() if line.strip().split()[:1] in (["64"], ["128"], ["256"])] \
        == ["64", "128", "256"]


def test_page_data_carries_the_regions_and_the_surface(sweep_page):
    data = blob(sweep_page.read_text(encoding="utf-8"))["regions"]
    assert len(data["regions"]) == 9 and data["surface"]["rows"] == "seq_len" and data["surface"]["columns"] == "batch"
    assert data["surface"]["grids"][0]["bytes"] == EXPECTED


def test_heatmap_in_a_real_browser_has_nine_cells_with_the_peaks(sweep_page, browser):  # noqa: F811
    browser.get(sweep_page.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert browser.find_element("id", "regions-section").is_displayed()
    cells = browser.find_elements("css selector", "#surface rect.surface-cell")
    assert [(int(c.get_attribute("data-row")), int(c.get_attribute("data-column")), int(c.get_attribute("data-bytes")))
            for c in cells] == [(s, b, EXPECTED[i][j]) for i, s in enumerate(SEQ_LENS) for j, b in enumerate(BATCHES)]
    texts = [t.text for t in browser.find_elements("css selector", "#surface text.surface-value")]
    assert texts == [format_bytes(v) for row in EXPECTED for v in row]
    axes = [t.text for t in browser.find_elements("css selector", "#surface text.column-value, #surface text.row-value")]
    assert axes[:3] == ["1", "2", "4"] and sorted(axes[3:]) == sorted(["64", "128", "256"])
    # Darker is more: the biggest peak's cell is the darkest, its value written in white.
    fills = [c.value_of_css_property("fill") for c in cells]
    assert fills[-1] == "rgb(127, 39, 4)" and fills[0] == "rgb(255, 245, 235)"
    rows = browser.find_elements("css selector", "table.regions tr")
    assert len(rows) == 10 and rows[9].text.split()[:4] == ["9", "config", "256", "4"]
    # The whole window's screenshot: the section is drawn, not only present.
    assert len(browser.find_element("id", "regions-section").screenshot_as_png) > 5_000


def test_a_page_without_regions_keeps_the_section_hidden(browser, tmp_path):  # noqa: F811
    from tests.html_factories import leaky_recording
    path = leaky_recording(tmp_path / "leak.memprof")
    out = tmp_path / "leak.html"
    assert invoke("report", "html", path, "-o", out)[0] == 0
    browser.get(out.as_uri())
    assert not browser.find_element("id", "regions-section").is_displayed()
    assert blob(out.read_text(encoding="utf-8"))["regions"]["empty"].startswith("no regions")
