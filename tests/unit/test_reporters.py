"""The one entry point (memprof.api.analyse) and the reporter contract
(memprof.report.reporters): every view of a factory recording gives JSON-ready output and
renders on a Console, and every report command goes through both."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis import views
from memprof.analysis.budget import Budgets, PeakBudget
from memprof.api import Analysed, analyse, diff
from memprof.cli.main import cli
from memprof.report import reporters
from memprof.report.html import page
from tests.report_factories import HELD, KiB, known_recording

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Analysed:
    return analyse(known_recording(tmp_path_factory.mktemp("rec") / "run.memprof"))


# Each view, and one number of its JSON that the recording fixes (so a view of the wrong
# recording, or a contract that drops the result, fails).
VIEWS = {
    "summary": (lambda a: a.summary(), lambda doc: doc["layers"][0]["peak_bytes"] == HELD),
    "leaks": (lambda a: a.leaks(),
              lambda doc: sorted(f["live_bytes"] for f in doc["findings"]) == [1 << 20, 20 * 128 * KiB]),
    "layers": (lambda a: a.layers(), lambda doc: doc["layers"][0]["final_bytes"] == HELD),
    "top by chain": (lambda a: a.attribution(), lambda doc: doc["layers"][0]["live_bytes"] == HELD),
    "top by function": (lambda a: a.attribution(by="function"),
                        lambda doc: doc["layers"][0]["rows"][0]["total_bytes"] == HELD),
    "peak": (lambda a: a.attribution(at="peak"), lambda doc: doc["layers"][0]["live_bytes"] == HELD),
    "gpu": (lambda a: a.gpu(), lambda doc: doc["devices"] == []),
    "growth": (lambda a: a.growth(), lambda doc: doc["x_unit"] == "step"),
    "check": (lambda a: a.check(Budgets(peaks=(PeakBudget(limit_bytes=1 << 20),))),
              lambda doc: [v["actual_bytes"] for v in doc["violations"]] == [HELD]),
    "diff": (lambda a: diff(a, a), lambda doc: doc["layers"][0]["peak_a"] == doc["layers"][0]["peak_b"] == HELD),
}


@pytest.mark.parametrize("name", VIEWS)
def test_every_view_gives_json_and_renders(analysed, name):
    make, fixed = VIEWS[name]
    view = make(analysed)
    doc = json.loads(json.dumps(reporters.to_json(view)))  # plain JSON: nothing numpy, nothing NaN-only
    assert fixed(doc), doc
    console = Console(width=120, record=True, color_system=None)
    reporters.render(view, console)
    assert console.export_text().strip()


def test_the_html_view_gives_json_and_a_page(analysed):
    view = analysed.html()
    doc = json.loads(json.dumps(reporters.to_json(view)))
    assert doc["recording"] == analysed.about.path and doc["leaks"]["findings"]
    assert page.html_page(view).startswith("<!DOCTYPE html>")


def test_every_view_has_a_reporter_and_nothing_else_does():
    kinds = {cls for name, cls in vars(views).items()
             if name.endswith("View") and isinstance(cls, type) and cls is not views.View}
    assert set(reporters.REPORTERS) == kinds
    with pytest.raises(TypeError):
        reporters.to_json(object())


def test_a_view_is_computed_once_per_options(analysed):
    assert analysed.leaks() is analysed.leaks()
    assert analysed.leaks(top=1) is not analysed.leaks()
    assert len(analysed.leaks(top=1).result.findings) == 1


def test_stages_are_named_as_they_run(tmp_path):
    named = []
    analyse(known_recording(tmp_path / "r.memprof"), stage=named.append)
    assert named == ["reading the recording", "merging 42 events into one timeline",
                     "pairing allocations with their frees", "merging identical chains"]


COMMANDS = [
    (["report"], views.SummaryView), (["report", "leaks"], views.LeaksView), (["report", "layers"], views.LayersView),
    (["report", "top"], views.AttributionView), (["report", "peak"], views.AttributionView),
    (["report", "chains"], views.AttributionView), (["report", "gpu"], views.GpuView),
    (["report", "growth"], views.GrowthView), (["check", "--max-peak", "1GiB"], views.CheckView),
]


@pytest.mark.parametrize("fmt", ["json", "table"])
@pytest.mark.parametrize("command,kind", COMMANDS, ids=[" ".join(c) for c, _ in COMMANDS])
def test_every_report_command_goes_through_the_entry_point_and_the_contract(tmp_path, monkeypatch, command,
                                                                             kind, fmt):
    path = known_recording(tmp_path / "run.memprof")
    opened, emitted = _spy(monkeypatch)
    result = CliRunner().invoke(cli, [*command, str(path), "--format", fmt])
    assert result.exit_code == 0, result.output
    assert opened == [str(path)]
    assert emitted == [("to_json" if fmt == "json" else "render", kind)]
    if fmt == "json":
        assert json.loads(result.output)["recording"] == str(path)


def test_diff_and_html_go_through_the_entry_point_and_the_contract(tmp_path, monkeypatch):
    path = known_recording(tmp_path / "run.memprof")
    opened, emitted = _spy(monkeypatch)
    assert CliRunner().invoke(cli, ["diff", str(path), str(path), "--format", "json"]).exit_code == 0
    assert CliRunner().invoke(cli, ["report", "html", str(path), "--format", "json"]).exit_code == 0
    assert opened == [str(path)] * 3
    assert emitted == [("to_json", views.DiffView), ("to_json", views.HtmlView)]


def _spy(monkeypatch):
    """Record each path memprof.api.analyse opens and each view the reporters are handed."""
    import memprof.api
    opened, emitted = [], []
    real_analyse, real_json, real_render = memprof.api.analyse, reporters.to_json, reporters.render

    def analyse_spy(path, **kwargs):
        opened.append(str(path))
        return real_analyse(path, **kwargs)

    def json_spy(view):
        emitted.append(("to_json", type(view)))
        return real_json(view)

    def render_spy(view, console):
        emitted.append(("render", type(view)))
        return real_render(view, console)

    monkeypatch.setattr(memprof.api, "analyse", analyse_spy)
    monkeypatch.setattr(reporters, "to_json", json_spy)
    monkeypatch.setattr(reporters, "render", render_spy)
    return opened, emitted


PIPELINE = {"open_recording", "find_latest_recording", "timeline", "pair_lifetimes", "canonical_stacks"}


@pytest.mark.parametrize("module", sorted((REPO / "cli").glob("*.py")), ids=lambda p: p.name)
def test_no_command_assembles_the_pipeline_or_picks_a_renderer(module):
    """The CLI imports neither the pipeline's stages (memprof.api.analyse runs them) nor a
    renderer's own functions (`*_to_json`, `render_*`: cli.common.emit hands views on)."""
    imports = [node for node in ast.walk(ast.parse(module.read_text())) if isinstance(node, ast.ImportFrom)]
    names = [alias.name for node in imports for alias in node.names]
    stages = [name for name in names if name in PIPELINE]
    renderers = [name for name in names if name.endswith("_to_json") or name.startswith("render_")]
    assert (stages, renderers) == ([], [])
