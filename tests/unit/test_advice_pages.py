"""The advice where users meet it besides `report advice` (issue 22): a section of the
one-screen `report` (text and JSON) and of the HTML page, drawn in a real browser (headless
Chromium, skipped with a reason without one). The recording is the autograd rule's synthetic
training run, whose graph is kept across 12 steps (tests/unit/test_advice_autograd.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training_factories import write
from tests.unit.test_advice_autograd import CHAINS, PER_STEP, STEPS, training
from tests.unit.test_html import blob, browser, invoke  # noqa: F401 (browser: the fixture)

TITLE = "The autograd graph is kept across steps: 194.5 KiB more each step, saved by the forward at model.py:20"


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    rows, end = training()
    return write(tmp_path_factory.mktemp("advice") / "kept.memprof", rows, CHAINS, end)


def test_report_has_an_advice_section_and_points_to_report_advice(kept):
    code, stdout, err = invoke("report", str(kept))
    assert code == 0, err
    assert "Advice: 1 (`memprof report advice` for the evidence)" in stdout
    assert "1. The autograd graph is kept across steps" in stdout
    assert f"memprof report advice {kept}" in stdout
    code, stdout, err = invoke("report", str(kept), "--format", "json")
    assert code == 0, err
    (advice,) = json.loads(stdout)["advice"]
    assert advice["rule"] == "autograd-graph-kept" and advice["saving_bytes"] == STEPS * PER_STEP
    assert advice["title"] == TITLE


def test_the_page_draws_the_advice_with_its_evidence_and_thresholds(kept, browser):  # noqa: F811
    out = kept.parent / "kept.html"
    code, _, err = invoke("report", "html", str(kept), "-o", str(out))
    assert code == 0, err
    data = blob(out.read_text(encoding="utf-8"))["advice"]
    assert [a["rule"] for a in data["advice"]] == ["autograd-graph-kept"] and len(data["rules"]) == 8
    browser.get(out.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    section = browser.find_element("id", "advice-section")
    assert section.is_displayed()
    item = browser.find_element("css selector", "#advice div.advice[data-rule='autograd-graph-kept']")
    assert item.find_element("tag name", "h3").text == "1. " + TITLE
    text = item.text
    assert "Try: " in text and ".item()" in text
    assert "Saving: " in text and "(2.3 MiB)" in text
    assert "Thresholds: " in text and "chain: " in text


def test_a_page_without_advice_keeps_the_section_hidden(tmp_path, browser):  # noqa: F811
    rows, end = training(kept=False)
    path = write(tmp_path / "freed.memprof", rows, CHAINS, end)
    out = tmp_path / "freed.html"
    assert invoke("report", "html", str(path), "-o", str(out))[0] == 0
    browser.get(out.as_uri())
    assert not browser.find_element("id", "advice-section").is_displayed()
    assert blob(out.read_text(encoding="utf-8"))["advice"]["advice"] == []
