"""What an advice rule may read of a recording: the analyses the reports already make. Rules
ask for them through this interface, and each is computed once and shared by every rule (and
every report of the same run): `memprof.api.Analysed` is the implementation.

Typing only: the analysis layer never imports the api (the layer contract, setup.cfg).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol

if TYPE_CHECKING:
    import pandas as pd

    from memprof.analysis.attribution import Span
    from memprof.analysis.lifetimes import Lifetimes
    from memprof.analysis.views import (
        AttributionView, GpuView, GrowthView, LayersView, LeaksView, ModulesView, RegionsView,
    )


class Facts(Protocol):
    """A recording and its analyses. `rec`: meta, stacks, frames, samples, and `rec.events`
    the merged timeline; `lifetimes` the allocations paired with their frees; `span` the
    recording's start, the target's end and the recording's end. The view methods take the
    options of the report that shows them (memprof.api.Analysed documents each); a view's
    `.result` is the analysis result, `.chains` the frames of the chains it names."""

    rec: Any  # memprof.recording.Recording (not imported: analysis never reads recordings)
    lifetimes: Lifetimes

    @property
    def events(self) -> pd.DataFrame: ...

    @property
    def span(self) -> Span: ...

    def chains(self, stack_ids: Iterable, native_frames: str = ...) -> dict[int, list[dict]]: ...

    def leaks(self, **options) -> LeaksView: ...

    def layers(self, **options) -> LayersView: ...

    def attribution(self, **options) -> AttributionView: ...

    def gpu(self, **options) -> GpuView: ...

    def growth(self, **options) -> GrowthView: ...

    def modules(self, **options) -> ModulesView: ...

    def regions(self, **options) -> RegionsView: ...
