"""A seq_len × batch sweep under `memprof record` (issue 21, item 3): examples/sweep_kv.py, a
transformers GPT-2 (random weights) running one forward with its KV cache per configuration,
marked with memprof.mark("config", seq_len=…, batch=…). `report regions` gives one region per
configuration and a 3 × 3 surface whose torch_cpu peaks rise along both axes, and the HTML
page draws it as a heatmap of nine cells (in a real browser where there is one)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.unit.test_html import browser  # noqa: F401 (the fixture: headless Chromium, skipped without)

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep_kv.py"
SEQ_LENS, BATCHES = [64, 128, 256], [1, 2, 4]


@pytest.fixture(scope="module")
def recording(tmp_path_factory, run_memprof) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    path = folder / "sweep.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, EXAMPLE, cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "configs=9 " in result.stdout
    return path


@pytest.fixture(scope="module")
def regions(recording, run_memprof) -> dict:
    result = run_memprof("report", "regions", recording, "--format", "json", cwd=recording.parent, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_one_region_per_configuration_in_the_order_they_ran(regions):
    assert regions["empty"] is None
    assert [r["quantities"] for r in regions["regions"]] == [{"seq_len": s, "batch": b} for s in SEQ_LENS for b in BATCHES]
    assert all(r["label"] == "config" for r in regions["regions"])


def test_the_torch_cpu_surface_is_3_by_3_and_rises_with_seq_len_and_batch(regions):
    surface = regions["surface"]
    assert (surface["rows"], surface["columns"]) == ("seq_len", "batch")
    assert (surface["row_values"], surface["column_values"]) == (SEQ_LENS, BATCHES)
    grid = next(g["bytes"] for g in surface["grids"] if g["layer"] == "torch_cpu")
    assert all(row[0] < row[1] < row[2] for row in grid), grid  # batch 1 < 2 < 4 at each seq_len
    assert all(grid[0][j] < grid[1][j] < grid[2][j] for j in range(3)), grid  # seq_len 64 < 128 < 256
    # The largest configuration holds at least its KV cache more than the smallest: 2 × 4 layers
    # × 256 hidden × 4 bytes per (token × batch), 1024 - 64 more of them.
    assert grid[2][2] - grid[0][0] >= 2 * 4 * 256 * 4 * (256 * 4 - 64), grid


def test_the_page_draws_the_heatmap_with_nine_cells(recording, run_memprof, browser):  # noqa: F811
    page = recording.parent / "sweep.html"
    result = run_memprof("report", "html", recording, "-o", page, cwd=recording.parent, timeout=300)
    assert result.returncode == 0, result.stderr
    browser.get(page.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    cells = browser.find_elements("css selector", "#surface rect.surface-cell")
    assert len(cells) == 9 and all(c.get_attribute("data-bytes") for c in cells)
    assert len(browser.find_elements("css selector", "table.regions tr")) == 10
