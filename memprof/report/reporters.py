"""The reporter contract: every view of memprof.analysis.views has one reporter module here,
which gives `to_json(view) -> dict` (JSON-ready: ints, floats, strings, lists, dicts, None;
times CLOCK_MONOTONIC ns, sizes bytes) and `render(view, console)` (the terminal report on a
rich Console). The HTML page is a file, not a console's: its reporter gives
`html_page(view) -> str` in place of `render`. Callers (the CLI's one `emit`) go through
`to_json` and `render` here and never pick a renderer themselves."""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from memprof.analysis import views
from memprof.report import advice, attribution, budget, diff, gpu, growth, job, layers, leaks, modules, regions, summary
from memprof.report.html import page

if TYPE_CHECKING:
    from rich.console import Console

REPORTERS: dict[type, ModuleType] = {
    views.SummaryView: summary, views.LeaksView: leaks, views.LayersView: layers,
    views.AttributionView: attribution, views.GpuView: gpu, views.GrowthView: growth, views.RegionsView: regions,
    views.ModulesView: modules, views.AdviceView: advice,
    views.CheckView: budget, views.JobView: job,
    views.DiffView: diff, views.HtmlView: page,
}


def reporter(view) -> ModuleType:
    """The module that renders `view`; TypeError for what is no view."""
    try:
        return REPORTERS[type(view)]
    except KeyError:
        raise TypeError(f"no reporter for {type(view).__name__}") from None


def to_json(view) -> dict:
    """The view as a JSON-ready dict."""
    return reporter(view).to_json(view)


def render(view, console: Console) -> None:
    """The view on `console`, for people."""
    reporter(view).render(view, console)
