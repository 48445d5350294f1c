"""The library's one entry point to a recording: `analyse(path)` opens it, merges its events
into one timeline, pairs allocations with their frees and merges identical chains, and
returns an `Analysed`, which computes each report's view (memprof.analysis.views) when first
asked and keeps it. Every command that reads a recording, the benchmarks and the tests start
here; none assembles the pipeline itself.

Above `analysis` (it opens recordings, which analysis may not) and below `cli`. Times are
CLOCK_MONOTONIC ns of the recording host, sizes bytes.
"""
from __future__ import annotations

import inspect
from functools import cached_property, wraps
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from memprof.analysis.chains import DEFAULT_NATIVE_FRAMES
from memprof.analysis.leaks import DEFAULT_MIN_AGE_NS
from memprof.analysis.views import (
    About, AdviceView, AttributionView, CheckView, DiffView, GpuView, GrowthView, HtmlView, LayersView, LeaksView, ModulesView,
    RegionsView, SummaryView,
)

if TYPE_CHECKING:
    from memprof.analysis.attribution import Span
    from memprof.analysis.budget import Budgets
    from memprof.analysis.diff import Recorded
    from memprof.analysis.fold import Fold
    from memprof.recording import Recording

Stage = Callable[[str], None]  # names the step now running (the CLI's progress bar)
STAGES = 4  # how many times `analyse` calls its `stage`
FOLDED_SUMMARY_NOTE = ("folded: no advice here (the fold was not asked to keep what its rules read); "
                       "`report advice` folds for them")
GPU_POINTS = 20  # `report gpu`'s over-time points, and those the advice rules read


def folded_curves_note(fold: Fold) -> str:
    """What a folded recording's curves (the page, the trace exports) are drawn through."""
    moments = (f"the {len(fold.instants_ns):,} moments the fold kept what was live at (steps, windows, exits, the "
               f"end, marks, the peaks)")
    if fold.curve_extremes:
        from memprof.bounded import CURVE_STRETCHES
        return (f"folded: each layer's curve is drawn through {moments} and, between them, through its highest and "
                f"lowest point in each of {CURVE_STRETCHES} even stretches of the recording, each exact; the way from "
                f"one of these points to the next is not drawn")
    return (f"folded: each layer's curve is drawn through {moments}, exact there; what rose and fell between two "
            f"of them is not drawn")


FOLDED_GPU_NOTE = ("folded: each term's peak and the points shown are exact; the peak requested is the highest at "
                   "the moments the fold kept (each term's peak and the points), so it may read below the whole "
                   "recording's")


def _quiet(text: str) -> None:
    """A stage callback that shows nothing."""


def analyse(path: Path | str | None = None, *, stage: Stage = _quiet, max_memory: int | None = None,
            keep_at: Iterable[int] = (), window_ns: int | None = None, gpu_points: int | None = None,
            regions: bool = False, advice: bool = False, curves: bool = False) -> Analysed:
    """Open and analyse the recording at `path` (default: the newest `*.memprof` in the
    current directory). `stage(text)` is called before each of the STAGES steps (a 10^7-event
    recording takes seconds). Raises BadRecordingError (exit 5) for what is no recording.

    A recording whose whole analysis would take more than `max_memory` bytes (default:
    bounded.default_limit, most of the memory available) is folded (memprof.bounded): read
    in bounded memory, keeping the allocations the leak, peak and end views judge; the views
    that need every event refuse it (FoldedRecordingError, exit 2). `keep_at`: moments, ns
    after the start, that such a fold keeps what was live at too, so that `attribution(at=T)`
    reads it for each T among them (`report top --at TIME`); `window_ns`: the windows such a
    fold keeps what was live at the ends of, so that `leak_result(window_ns=…)` reads it
    (`report leaks --window`); `gpu_points`: the over-time points such a fold keeps what was
    live at, so that `gpu(points=…)` reads it (`report gpu`); `regions`: such a fold keeps
    what `regions()` reads (`report regions`); `advice`: such a fold keeps what the advice
    rules read (the regions, the GPU_POINTS points of `gpu()` unless `gpu_points` says
    otherwise, and each sampled process's first and last sample), so that `advice()` and the
    summary's advice read it (`report`, `report advice`); `curves`: such a fold keeps each
    layer's highest and lowest point between two moments it kept (Fold.curve_extremes), so that the page's
    and the trace exports' curves keep the spikes and dips between them (`report html`, `export`)."""
    from memprof.analysis.chains import canonical_stacks
    from memprof.analysis.lifetimes import pair_lifetimes
    from memprof.bounded import analyse_folded, default_limit, estimated_bytes
    from memprof.recording import find_latest_recording, open_recording, read_meta
    from memprof.recording.stream import event_parts
    from memprof.timeline import timeline

    stage("reading the recording")
    path = Path(path) if path else find_latest_recording(".")
    read_meta(path)  # what is no recording is said before its parts are looked at
    parts = event_parts(path)
    limit = default_limit() if max_memory is None else int(max_memory)
    if estimated_bytes(parts) > limit:
        if advice:
            regions, gpu_points = True, gpu_points or GPU_POINTS
        rec, lifetimes, fold = analyse_folded(path, parts, limit, stage, keep_at_ns=tuple(int(t) for t in keep_at),
                                              window_ns=window_ns, gpu_points=gpu_points, regions=regions,
                                              advice=advice, curves=curves)
        stage("merging identical chains")
        return Analysed(rec, lifetimes, canonical_stacks(rec.stacks), fold=fold)
    rec = open_recording(path)
    stage(f"merging {len(rec.events):,} events into one timeline")
    rec.events = timeline(rec)  # the unsorted frame is dropped, not kept beside it
    stage("pairing allocations with their frees")
    lifetimes = pair_lifetimes(rec.events)
    stage("merging identical chains")
    return Analysed(rec, lifetimes, canonical_stacks(rec.stacks))


def job_paths(paths: Iterable[Path | str]) -> list[Path]:
    """The recordings of a job: each path that is a recording, and each `*.memprof` recording
    inside a folder that is not one, sorted by name within it. BadRecordingError (exit 5)
    for a path that is neither, or a folder holding none."""
    from memprof.errors import BadRecordingError
    from memprof.recording.reader import META_NAME
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():  # said before the others are analysed, which takes seconds each
            raise BadRecordingError(f"{path} does not exist", "give the job's recordings, or the folder holding them")
        if (path / META_NAME).is_file() or not path.is_dir():
            found.append(path)  # a recording, or what open_recording will say is none
            continue
        inside = sorted(p for p in path.glob("*.memprof") if (p / META_NAME).is_file())
        if not inside:
            raise BadRecordingError(f"no memprof recording (*.memprof) in {path}",
                                    "give the folder the job's `memprof record` runs wrote to, or the recordings")
        found += inside
    return found


def analyse_job(paths: Iterable[Path | str], *, stage: Stage = _quiet, min_age_ns: int = DEFAULT_MIN_AGE_NS,
                native_frames: str = DEFAULT_NATIVE_FRAMES, max_memory: int | None = None):
    """Analyse the recordings of one job (job_paths: recordings, or folders of them) as one
    JobView: per host and per rank, the diverging ranks, one leak list, one clock. One
    recording is analysed at a time and only its small results are kept (job.RecordingPart),
    so memory is that of the largest recording, not of the job. `stage(text)` before each;
    `max_memory` as `analyse` takes it, for each recording."""
    from memprof.analysis.job import job_report
    from memprof.analysis.views import About, JobView
    recordings = job_paths(paths)
    parts = []
    for index, path in enumerate(recordings, 1):
        stage(f"recording {index} of {len(recordings)}: {path}")
        parts.append(analyse(path, max_memory=max_memory).job_part(min_age_ns=min_age_ns, native_frames=native_frames))
    return JobView(job_report(parts), About(path=", ".join(map(str, recordings))))


def _kept(method):
    """Keep a view method's result per arguments: a second ask with the same options is free,
    whether it spells out a default or leaves it out (`leak_result(top=None)` from an advice
    rule and `leak_result(min_age_ns=DEFAULT_MIN_AGE_NS, top=None)` are one analysis)."""
    signature = inspect.signature(method)

    @wraps(method)
    def view(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        key = (method.__name__, bound.args[1:], tuple(sorted(bound.kwargs.items())))
        if key not in self._kept:
            self._kept[key] = method(self, *args, **kwargs)
        return self._kept[key]
    return view


class Analysed:
    """One recording, analysed: `rec` (its meta, stacks, frames, samples; `rec.events` the
    merged timeline), `lifetimes` (analysis.lifetimes.Lifetimes) and `canonical` (stack id ->
    the id of the first identical chain). Each view is computed when first asked, with the
    defaults of the command that shows it, and kept per options."""

    def __init__(self, rec: Recording, lifetimes, canonical, fold: Fold | None = None):
        self.rec, self.lifetimes, self.canonical = rec, lifetimes, canonical
        self.fold = fold  # None: every event was read; else how it was folded (memprof.bounded)
        self._kept: dict = {}

    def every_event(self, what: str) -> None:
        """Refuse `what` (a report's name) on a folded recording: it reads every event, or
        curves between the moments a fold keeps. FoldedRecordingError (exit 2) with what to do."""
        if self.fold is None:
            return
        from memprof.errors import FoldedRecordingError
        from memprof.units import format_bytes
        need = -(-self.fold.needed_bytes // 2**30)
        raise FoldedRecordingError(
            f"{what} needs every event of {self.rec.path}, and the whole analysis of its {self.fold.events:,} events "
            f"would take about {format_bytes(self.fold.needed_bytes)}, more than the "
            f"{format_bytes(self.fold.limit_bytes)} allowed",
            f"on a machine with the memory, give --max-memory {need}GiB; here, `report`, `report leaks`, "
            f"`report layers`, `report top`, `report growth`, `report modules`, `report gpu`, `report regions`, "
            f"`report advice`, `report html`, `check`, a job's report and `export` but for csv and parquet read it "
            f"folded", what=what)

    @property
    def events(self):
        """The merged timeline (one clock, sorted by ts_ns then seq)."""
        return self.rec.events

    @cached_property
    def span(self) -> Span:
        """Start, the target's end, the recording's end (overview.recording_span)."""
        from memprof.analysis.overview import recording_span
        return recording_span(self.rec.meta, self.events)

    @cached_property
    def about(self) -> About:
        """Path, start, lost events and the notes every view carries."""
        from memprof.analysis.loss import recording_notes
        meta = self.rec.meta
        return About(path=str(self.rec.path), start_ns=int(meta.start_ns), lost_events=int(meta.lost_events),
                     notes=tuple(recording_notes(meta)))

    def chains(self, stack_ids: Iterable, native_frames: str = DEFAULT_NATIVE_FRAMES) -> dict[int, list[dict]]:
        """The frames of each of `stack_ids`, innermost first (leaks.chain_frames)."""
        from memprof.analysis.leaks import chain_frames
        return chain_frames(self.rec.stacks, self.rec.frames, stack_ids, native_frames)

    @_kept
    def leak_result(self, *, min_age_ns: int = DEFAULT_MIN_AGE_NS, layers: tuple = (), top: int | None = 10,
                    window_ns: int | None = None, confidence: float = 0.99, by: str = "chain"):
        """The findings as `report leaks` judges them (overview.leak_report)."""
        if window_ns is not None and self.fold is not None and self.fold.window_ns != window_ns:
            self.every_event("`report leaks --window` (windows the fold was not asked to keep)")
        from memprof.analysis.overview import leak_report
        rec = self.rec
        return leak_report(rec.meta, self.events, self.lifetimes, rec.stacks, rec.frames,
                           canonical_stack=self.canonical, min_age_ns=min_age_ns, layers=layers, top=top,
                           window_ns=window_ns, confidence=confidence, by=by)

    @_kept
    def leaks(self, *, native_frames: str = DEFAULT_NATIVE_FRAMES, **options) -> LeaksView:
        """`report leaks`: `options` as `leak_result` takes them."""
        result = self.leak_result(**options)
        shown = [f.stack_id for f in result.findings + result.not_leaks]
        return LeaksView(result, self.about, self.chains(shown, native_frames))

    @_kept
    def summary(self, *, top: int = 3) -> SummaryView:
        """`report`: the one-screen summary with at most `top` findings. Of a folded recording:
        with the advice where the fold kept what its rules read (analyse(advice=True)), else
        without it (a note says so)."""
        from memprof.analysis.overview import summarize
        rec = self.rec
        # The uncut leak analysis and the layers the advice asks for too (kept): `report` runs each once.
        result = summarize(rec.meta, self.events, self.lifetimes, rec.stacks, rec.frames, rec.samples,
                           canonical_stack=self.canonical, top=top, leaks=self.leak_result(top=None),
                           layers=self.layers().result)
        result.ranks = self.ranks()
        if self.fold is None or self.fold.advice:
            result.advice = list(self.advice().result.advice)
        else:
            result.notes.append(FOLDED_SUMMARY_NOTE)
        if self.fold is not None:
            result.events = self.fold.events
        return SummaryView(result, self.about, self.chains(f.stack_id for f in result.leaks.findings))

    @_kept
    def layers(self, *, top: int = 3, native_frames: str = DEFAULT_NATIVE_FRAMES) -> LayersView:
        """`report layers`: per layer peak and end, with the `top` chains at its peak."""
        from memprof.analysis.layers import layer_summary
        summary = layer_summary(self.lifetimes, self.rec.samples, top=top, canonical_stack=self.canonical)
        if self.fold is not None:  # what the fold dropped was allocated too
            from dataclasses import replace
            dropped = self.fold.dropped_count
            summary.layers = [replace(s, alloc_count=s.alloc_count + dropped.get(s.layer, 0)) for s in summary.layers]
        ids = [c.stack_id for stats in summary.layers for c in stats.top_chains]
        return LayersView(summary, self.about, self.chains(ids, native_frames))

    @_kept
    def attribution(self, *, by: str = "chain", at="end", layers: tuple = (), top: int | None = 10,
                    native_frames: str = DEFAULT_NATIVE_FRAMES) -> AttributionView:
        """`report top | peak | chains`: live bytes `by` chain, function, layer or category at
        `at` ("end", "peak" or ns after the start); `top` None keeps every row."""
        if at not in ("end", "peak") and (self.fold is None or at not in self.fold.kept_at_ns):
            self.every_event(f"`report top --at {at}` (a time the fold was not asked to keep)")
        from memprof.analysis.attribution import attribute
        rec = self.rec
        from memprof.analysis.ranks import rank_labels
        result = attribute(self.lifetimes, by=by, at=at, span=self.span, stacks=rec.stacks, frames=rec.frames,
                           events=self.events, layers=layers or None, top=top, canonical_stack=self.canonical,
                           native_frames=native_frames, rank_of_pid=lambda pids: rank_labels(rec.meta, pids))
        ids = [row.stack_id for layer in result.layers for row in layer.rows] if by == "chain" else []
        return AttributionView(result, self.about, self.chains(ids, native_frames))

    @_kept
    def gpu(self, *, points: int = GPU_POINTS) -> GpuView:
        """`report gpu`: each GPU's memory, term by term, at `points` times. Of a folded
        recording: at the points its fold kept (analyse(gpu_points=points)), which without
        step marks span the recording rather than its GPU data; each term's peak is exact,
        and the peak requested is read at the moments kept (a note says so)."""
        times_ns = None
        if self.fold is not None:
            if self.fold.gpu_points != points:
                self.every_event(f"`report gpu --points {points}` (points the fold was not asked to keep)")
            times_ns = self.fold.gpu_times_ns
        from memprof.analysis.gpu import gpu_breakdown
        result = gpu_breakdown(self.lifetimes, self.events, self.rec.samples, meta=self.rec.meta, points=points,
                               times_ns=times_ns)
        if self.fold is not None and result.devices:
            result.notes.append(FOLDED_GPU_NOTE)
        return GpuView(result, self.about)

    @_kept
    def growth(self, *, layers: tuple = (), top: int = 3, points: int = 50,
               native_frames: str = DEFAULT_NATIVE_FRAMES, against: str | None = None) -> GrowthView:
        """`report growth`: fits and forecasts per layer, device and `top` chains, x the step
        (or time), or the quantity `against` (UnknownQuantityError, exit 2, if there is none).
        Of a folded recording without step marks, x is time at the window ends its fold kept
        (a note says so), not `points` evenly spaced times; refused where it kept none."""
        from memprof.analysis.growth import growth
        result = growth(self.lifetimes, self.events, self.rec.samples, origin_ns=self.rec.meta.start_ns,
                        points=points, top=top, layers=layers or None, canonical_stack=self.canonical,
                        against=against, times_ns=self._folded_windows() if self.fold is not None else None)
        ids = [s.stack_id for s in result.series if s.chain]
        return GrowthView(result, self.about, self.chains(ids, native_frames))

    def _folded_windows(self) -> tuple[int, ...] | None:
        """Where `report growth` reads a folded recording: None with step marks enough for it
        (every fold keeps what was live at each); else the window ends the fold kept
        (Fold.window_ends_ns). FoldedRecordingError where it kept fewer than two."""
        from memprof.analysis.checkpoints import step_marks
        from memprof.analysis.growth import MIN_POINTS
        if len(step_marks(self.events)) >= MIN_POINTS:
            return None
        if len(self.fold.window_ends_ns) < 2:
            self.every_event("`report growth` (no window ends kept to read it at)")
        return self.fold.window_ends_ns

    @_kept
    def modules(self, *, layers: tuple = (), top: int | None = 10) -> ModulesView:
        """`report modules`: per nn.Module path, in each layer, its calls, bytes allocated
        per call and what it held at the layer's peak and at the end. A folded recording
        counts what its fold dropped in the bytes allocated (Lifetimes.folded_modules)."""
        from memprof.analysis.module_use import module_use
        result = module_use(self.lifetimes, self.events, self.span, layers=layers or None, top=top)
        return ModulesView(result, self.about)

    @_kept
    def regions(self, *, layers: tuple = (), top: int = 3,
                native_frames: str = DEFAULT_NATIVE_FRAMES) -> RegionsView:
        """`report regions`: from each mark with numbers to the next (the last: to the
        target's end), each (layer, device)'s peak and its `top` chains; the memory surface
        when two quantities vary. Of a folded recording: where its fold kept each region's
        start and peaks (analyse(regions=True)), exactly as of the whole."""
        if self.fold is not None and not self.fold.regions:
            self.every_event("`report regions` (regions the fold was not asked to keep)")
        from memprof.analysis.regions import regions
        result = regions(self.lifetimes, self.events, self.rec.samples, end_ns=self.span.end_ns,
                         layers=layers or None, top=top, canonical_stack=self.canonical)
        ids = [c.stack_id for region in result.regions for peak in region.peaks for c in peak.top_chains]
        return RegionsView(result, self.about, self.chains(ids, native_frames))

    @_kept
    def ranks(self):
        """The ranks of a distributed job: per rank its peak, end and growth per step, and
        the ranks that differ from the others (ranks.rank_report)."""
        from memprof.analysis.ranks import rank_report
        return rank_report(self.rec.meta, self.lifetimes, self.events, self.span.end_ns)

    def job_part(self, *, min_age_ns: int = DEFAULT_MIN_AGE_NS, native_frames: str = DEFAULT_NATIVE_FRAMES):
        """What a job of several recordings keeps of this one (job.recording_part): its ranks,
        every leak finding tagged with host and ranks, its clock."""
        from memprof.analysis.job import recording_part
        view = self.leaks(min_age_ns=min_age_ns, top=None, native_frames=native_frames)
        checkpoints = view.result.checkpoints
        return recording_part(self.rec.meta, str(self.rec.path), self.ranks(), view.result.findings, view.chains,
                              self.lifetimes, self.canonical, events=len(self.events),
                              unit=checkpoints.unit if checkpoints is not None else "step")

    @_kept
    def advice(self, *, native_frames: str = DEFAULT_NATIVE_FRAMES) -> AdviceView:
        """`report advice`: every rule of the table (memprof.analysis.advice.table) judged on
        this recording's analyses, which they share with the other views; each piece of
        advice with its evidence, the change to try and the expected saving. Of a folded
        recording: where its fold kept what the rules read (analyse(advice=True)); each rule
        reads its views as they read the fold, and a rule whose view refuses it (e.g. growth
        without steps or windows) is not judged and says so."""
        if self.fold is not None and not self.fold.advice:
            self.every_event("`report advice` (what its rules read, which the fold was not asked to keep)")
        from memprof.analysis.advice import advise
        result = advise(self)
        ids = {stack_id for advice in result.advice for stack_id in advice.chains if stack_id is not None}
        return AdviceView(result, self.about, self.chains(sorted(ids), native_frames))

    @_kept
    def html(self, *, top: int = 20, points: int = 2000, min_age_ns: int = DEFAULT_MIN_AGE_NS,
             native_frames: str = DEFAULT_NATIVE_FRAMES) -> HtmlView:
        """`report html`: the page's data, curves kept to `points` per series. Of a folded
        recording: where its fold kept what the advice reads (analyse(advice=True)), with the
        layers' curves drawn through the moments it kept (Fold.instants_ns: exact there, the
        peaks among them) and, where it tracked them (analyse(curves=True)), each stretch's
        highest and lowest point (Fold.curve_extremes), not through every event (a warning on
        the page says which: folded_curves_note)."""
        if self.fold is not None and not self.fold.advice:
            self.every_event("`report html` (what its advice and regions read, which the fold was not asked to keep)")
        from memprof.analysis.html_data import html_data
        from memprof.analysis.leaks import cut
        rec = self.rec
        advice = self.advice(native_frames=native_frames)
        # The leak analysis and GPU breakdown the advice rules asked for (kept) are the page's too.
        data = html_data(self.events, self.lifetimes, stacks=rec.stacks, frames=rec.frames, samples=rec.samples,
                         meta=rec.meta, canonical_stack=self.canonical, top=top, max_points=points,
                         native_frames=native_frames, min_age_ns=min_age_ns,
                         leaks=cut(self.leak_result(min_age_ns=min_age_ns, top=None), top), gpu=self.gpu().result,
                         curve_times_ns=None if self.fold is None else self.fold.instants_ns,
                         curve_extremes=None if self.fold is None else self.fold.curve_extremes)
        if self.fold is not None:
            data.warnings.append(folded_curves_note(self.fold))
        data.advice = advice.result
        data.chains = {**advice.chains, **data.chains}
        return HtmlView(data, rec.meta, self.about)

    def check(self, budgets: Budgets, *, min_age_ns: int = DEFAULT_MIN_AGE_NS) -> CheckView:
        """`check`: `budgets` judged; leaks (every finding, no --top) only when one needs them."""
        from memprof.analysis.budget import check_recording
        result = check_recording(self.lifetimes, budgets,
                                 lambda: self.leak_result(min_age_ns=min_age_ns, top=None))
        return CheckView(result, self.about)

    def side(self) -> Recorded:
        """This recording as one side of a diff, judged at its target's end."""
        from memprof.analysis.diff import Recorded
        return Recorded(lifetimes=self.lifetimes, stacks=self.rec.stacks, frames=self.rec.frames,
                        end_ns=self.span.end_ns)


def diff(a: Analysed, b: Analysed, *, layers: tuple = (), top: int = 10,
         native_frames: str = DEFAULT_NATIVE_FRAMES) -> DiffView:
    """`diff A B`: what changed from `a` (the baseline) to `b`, by layer and chain."""
    from memprof.analysis.diff import diff_recordings
    result = diff_recordings(a.side(), b.side(), layers=layers or None, top=top)
    shown = [chain for layer in result.layers for chain in layer.chains]
    return DiffView(result, a.chains([c.stack_id_a for c in shown], native_frames),
                    b.chains([c.stack_id_b for c in shown], native_frames), a.about, b.about)
