"""What each report shows, as one value: an analysis result, the frames of the chains it
names, and what the recording says about itself (`About`). Every view has one reporter in
`memprof.report` with the same two functions, `to_json(view) -> dict` and
`render(view, console)` (memprof.report.reporters); `memprof.api.Analysed` builds them.

Plain values, no I/O. Times are CLOCK_MONOTONIC ns of the recording host, sizes bytes. A
chain map (`Chains`) is stack id -> frames, innermost first, as `leaks.chain_frames` gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.analysis.attribution import Attribution
    from memprof.analysis.budget import CheckResult
    from memprof.analysis.diff import DiffResult
    from memprof.analysis.gpu import GpuBreakdown
    from memprof.analysis.growth import GrowthResult
    from memprof.analysis.html_data import HtmlData
    from memprof.analysis.layers import LayerSummary
    from memprof.analysis.leaks import LeakResult
    from memprof.analysis.overview import Summary
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
class SummaryView:
    """`memprof report`: the one-screen summary."""

    summary: Summary
    chains: Chains
    about: About


@dataclass(frozen=True)
class LeaksView:
    """`memprof report leaks`: the findings and what is not a leak."""

    result: LeakResult
    chains: Chains
    about: About


@dataclass(frozen=True)
class LayersView:
    """`memprof report layers`: per layer peak and end, and who held the peak."""

    summary: LayerSummary
    chains: Chains
    about: About


@dataclass(frozen=True)
class AttributionView:
    """`memprof report top | peak | chains`: who held each layer's bytes at one moment."""

    result: Attribution
    chains: Chains
    about: About


@dataclass(frozen=True)
class GpuView:
    """`memprof report gpu`: what each GPU's memory is made of."""

    result: GpuBreakdown
    about: About


@dataclass(frozen=True)
class GrowthView:
    """`memprof report growth`: fits per layer, device and chain, and the forecasts."""

    result: GrowthResult
    chains: Chains
    about: About


@dataclass(frozen=True)
class HtmlView:
    """`memprof report html`: the page's data and the recording's metadata."""

    data: HtmlData
    meta: RecordingMeta
    about: About


@dataclass(frozen=True)
class CheckView:
    """`memprof check`: the budgets judged on one recording."""

    result: CheckResult
    about: About


@dataclass(frozen=True)
class DiffView:
    """`memprof diff A B`: recording B against the baseline A, with each side's chains."""

    result: DiffResult
    chains_a: Chains
    chains_b: Chains
    a: About
    b: About
