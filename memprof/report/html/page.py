"""Renderer of the HTML report (memprof.analysis.html_data): one self-contained page, its
scripts, styles and data inline, so it opens offline from disk. Render only.

The data is one JSON blob in <script type="application/json" id="memprof-data">, written by
`to_json`; every "<" in it is written as \\u003c, so no string in the data (a function
name, a path) can close the script element or open a comment.
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import TYPE_CHECKING

from memprof.analysis.loss import skipped_frees_by_layer
from memprof.analysis.views import About, AdviceView, GpuView, LeaksView, RegionsView
from memprof.report import advice, gpu, leaks, regions
from memprof.report.wording import (
    MODEL_STATE_HEADING, MODEL_STATE_WHY, min_age_left_out, model_state_line, shown_of, unrecorded_heap,
)

if TYPE_CHECKING:
    from memprof.analysis.html_data import Flame, HtmlData, Series, Stack
    from memprof.analysis.views import HtmlView
    from memprof.model.meta import RecordingMeta

DATA_VERSION = 1
_PLACEHOLDER = re.compile(r"/\*MEMPROF_(STYLE|APP|DATA|TITLE)\*/")
_SOURCE_KEYS = ("enabled", "events", "lost", "missed", "stack_sample_every", "timestamp_precision_ns")
_META_KEYS = ("format_version", "memprof_version", "status", "command", "pid", "host", "kernel", "clock",
              "start_ns", "end_ns", "exit_status")


def html_page(view: HtmlView) -> str:
    """The whole page as text (UTF-8 when written): the page's `render`, since a page is a
    file, not a console's (memprof.report.reporters)."""
    parts = {"STYLE": _static("style.css"), "APP": _static("app.js"), "TITLE": html.escape(view.about.path),
             "DATA": json.dumps(to_json(view), separators=(",", ":")).replace("<", "\\u003c")}
    # One pass over the template: text put in is never searched for placeholders again.
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _static("template.html"))


def to_json(view: HtmlView) -> dict:
    """The page's data blob. Absolute times (`*_ns`) are CLOCK_MONOTONIC ns; a series' `t`
    and a mark's `t` are ns after `span.start_ns` (small enough for a JavaScript number);
    sizes are bytes. `leaks` and `gpu` are what `memprof report leaks|gpu --format json` print;
    `leaks_text` the lines the terminal prints about what the filters left out. `warnings` change
    the results (the page's banner), `notes` are information."""
    data, meta, recording_path = view.data, view.meta, view.about.path
    inner = About(recording_path, lost_events=meta.lost_events)  # as `report leaks|gpu` print them
    start = int(data.span[0])
    return {
        "version": DATA_VERSION,
        "recording": str(recording_path),
        "meta": _meta_json(meta),
        "span": {"start_ns": start, "end_ns": int(data.span[1]), "recording_end_ns": int(data.span[2])},
        "warnings": list(data.warnings),
        "notes": list(data.notes),
        "max_points": int(data.max_points),
        "series": [_series_json(s, start) for s in data.series],
        "stacks": [_stack_json(s, start) for s in data.stacks],
        "steps": [[int(t) - start, int(step)] for step, t in zip(data.steps["step"], data.steps["ts_ns"])],
        "marks": [[int(t) - start, str(label)] for t, label in zip(data.marks["ts_ns"], data.marks["label"])],
        "ooms": [{"t": int(row.ts_ns) - start, "layer": row.layer, "device": row.device,
                  "size_bytes": int(row.size_bytes)} for row in data.ooms.itertuples(index=False)],
        "leaks": leaks.to_json(LeaksView(data.leaks, inner, data.chains)),
        "leaks_text": _leaks_text(data),
        "frames": [list(frame) for frame in data.frames],
        "flames": {at: [_flame_json(f, start) for f in flames] for at, flames in data.flames.items()},
        "gpu": gpu.to_json(GpuView(data.gpu, inner)),
        # What `report regions --format json` prints; the page draws its surface as a heatmap.
        "regions": None if data.regions is None else regions.to_json(RegionsView(data.regions, inner, data.chains)),
        # What `report advice --format json` prints.
        "advice": None if data.advice is None else advice.to_json(AdviceView(data.advice, inner, data.chains)),
    }


def _leaks_text(data: HtmlData) -> dict:
    """The lines `report leaks` prints on what --top and --min-age left out ('' for none), its
    model state block (`model_state`: one line per role, layer and device; [] for none), and
    under "no leaks" that the C heap was not recorded (`unrecorded_heap`; '' where it was, or
    where a leak was found)."""
    leaks = data.leaks
    return {"count": shown_of(len(leaks.findings), leaks.findings_total, leaks.top, "finding", "findings"),
            "not_leaks": shown_of(len(leaks.not_leaks), leaks.not_leaks_total, leaks.top, "chain", "chains"),
            "min_age": min_age_left_out(leaks),
            "model_state_heading": f"{MODEL_STATE_HEADING}: {MODEL_STATE_WHY}",
            "model_state": [model_state_line(total) for total in leaks.model_state],
            "unrecorded_heap": unrecorded_heap(leaks)}


def _meta_json(meta: RecordingMeta) -> dict:
    out = {key: getattr(meta, key) for key in _META_KEYS}
    out["sources"] = {name: {key: getattr(stats, key) for key in _SOURCE_KEYS}
                      for name, stats in sorted(meta.sources.items())}
    # Frees only: a recording made before 2026-12-06 also lists allocations its programs
    # were skipped for in `missed`, which were never the target's (analysis/loss.py).
    out["lost_events"], out["skipped_frees"] = meta.lost_events, sum(skipped_frees_by_layer(meta).values())
    return out


def _series_json(series: Series, start: int) -> dict:
    return {"name": series.name, "device": series.device, "kind": series.kind, "family": series.family,
            "t": (series.times_ns - start).tolist(), "v": series.values.tolist(), "peak": series.peak,
            "peak_t": series.peak_ns - start, "final": series.final, "points_in": series.points_in}


def _stack_json(stack: Stack, start: int) -> dict:
    return {"device": stack.device, "layers": stack.layers, "t": (stack.times_ns - start).tolist(),
            "v": [values.tolist() for values in stack.values]}


def _flame_json(flame: Flame, start: int) -> dict:
    return {"layer": flame.layer, "t": flame.ts_ns - start, "live_count": flame.live_count,
            "root": _node_json(flame.root)}


def _node_json(node: tuple) -> list:
    """[frame, bytes, children…] (compact: a page holds thousands of nodes)."""
    frame, nbytes, children = node
    return [frame, nbytes, [_node_json(child) for child in children]]


def _static(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
