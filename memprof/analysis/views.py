"""What each report shows, as one value: an analysis result, the frames of the chains it
names, and what the recording says about itself (`About`). Every view has one reporter in
`memprof.report` with the same two functions, `to_json(view) -> dict` and
`render(view, console)` (memprof.report.reporters); `memprof.api.Analysed` builds them.

Plain values, no I/O. Times are CLOCK_MONOTONIC ns of the recording host, sizes bytes. A
chain map (`Chains`) is stack id -> frames, innermost first, as `leaks.chain_frames` gives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.analysis.diff import DiffResult
    from memprof.analysis.html_data import HtmlData
    from memprof.model import RecordingMeta

Chains = dict  # stack id -> list of frame dicts, innermost first


@dataclass(frozen=True)
class About:
    """What every view says of its recording: its `path`, its start (`start_ns`: times are
    shown relative to it), the events lost while recording (ring buffer full) and the notes
    every report carries (loss.Note, or plain text)."""

    path: str
    start_ns: int = 0
    lost_events: int = 0
    notes: tuple[Any, ...] = ()


@dataclass(frozen=True)
class View:
    """One report's view: `result`, the analysis result it shows; `about`, its recording;
    `chains`, the frames of the chains the result names (empty for a view that names none).
    Each report's view is a subclass, so that its reporter is found by its type."""

    result: Any
    about: About
    chains: Chains = field(default_factory=dict)


class SummaryView(View):
    """`memprof report`: the one-screen summary (overview.Summary)."""


class LeaksView(View):
    """`memprof report leaks`: the findings and what is not a leak (leaks.LeakResult)."""


class LayersView(View):
    """`memprof report layers`: per layer peak and end, and who held the peak (layers.LayerSummary)."""


class AttributionView(View):
    """`memprof report top | peak | chains`: who held each layer's bytes at one moment
    (attribution.Attribution)."""


class GpuView(View):
    """`memprof report gpu`: what each GPU's memory is made of (gpu.GpuBreakdown)."""


class GrowthView(View):
    """`memprof report growth`: fits per layer, device and chain, and the forecasts
    (growth.GrowthResult)."""


class ModulesView(View):
    """`memprof report modules`: per nn.Module path and layer, calls, bytes allocated per
    call, held at the peak and at the end (module_use.ModulesResult)."""


class AdviceView(View):
    """`memprof report advice`: every rule judged, and the advice given with its evidence
    (advice.AdviceResult)."""


class RegionsView(View):
    """`memprof report regions`: each region's peaks between marks with numbers, and the
    memory surface (regions.RegionsResult)."""


class CheckView(View):
    """`memprof check`: the budgets judged on one recording (budget.CheckResult)."""


class JobView(View):
    """`memprof report DIR_OR_RECORDINGS…`: several recordings of one job as one (job.JobReport);
    `about.path` names them all, the leaks carry their own chains."""


@dataclass(frozen=True)
class HtmlView:
    """`memprof report html`: the page's data and the recording's metadata."""

    data: HtmlData
    meta: RecordingMeta
    about: About


@dataclass(frozen=True)
class DiffView:
    """`memprof diff A B`: recording B against the baseline A, with each side's chains."""

    result: DiffResult
    chains_a: Chains
    chains_b: Chains
    a: About
    b: About
