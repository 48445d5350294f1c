"""Renderer of a job of several recordings (memprof.analysis.job.JobReport): JSON and the
terminal. Render only."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from rich.table import Table

from memprof.report.labels import chain_name
from memprof.report.safe_text import escape
from memprof.report.wording import diverging_line, rank_json
from memprof.units import format_bytes, format_duration_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.job import JobClock, JobReport
    from memprof.analysis.views import JobView


def to_json(view: JobView) -> dict:
    """JSON-ready dict: recordings (paths), hosts (host, recordings, ranks, largest_rank_peak_bytes,
    ranks_end_bytes, leaks, leak_bytes), layer (where ranks are compared), world_size, ranks
    (rank, host, pids, layer, peak_bytes, end_bytes, growth_bytes_per_step, steps, diverges:
    why it differs from the job's other ranks, None when it does not), leaks (host, recording,
    ranks, pids, kind, layer, live_bytes, live_count, slope_bytes_per_step, chain: its one-line
    name), clock (aligned, why, skew_ns, start_realtime_ns, end_realtime_ns, overlap_ns, and
    per recording: path, host, clock, anchors, offset_ns = realtime − monotonic, spread_ns,
    start_realtime_ns, end_realtime_ns), notes."""
    job: JobReport = view.result
    clock = job.clock
    return {
        "recordings": list(job.recordings),
        "hosts": [{"host": h.host, "recordings": h.recordings, "ranks": list(h.ranks),
                   "largest_rank_peak_bytes": h.largest_rank_peak_bytes, "ranks_end_bytes": h.ranks_end_bytes,
                   "leaks": h.leaks, "leak_bytes": h.leak_bytes} for h in job.hosts],
        "layer": job.layer,
        "world_size": job.world_size,
        "ranks": [rank_json(rank) for rank in job.ranks],
        "leaks": [{"host": leak.host, "recording": leak.path, "ranks": list(leak.ranks), "pids": list(leak.pids),
                   "kind": leak.kind, "layer": leak.layer, "live_bytes": leak.live_bytes, "live_count": leak.live_count,
                   "slope_bytes_per_step": leak.slope_bytes_per_step, "slope_unit": leak.unit,
                   "chain": chain_name(list(leak.chain))}
                  for leak in job.leaks],
        "clock": {"aligned": clock.aligned, "why": clock.why, "skew_ns": clock.skew_ns,
                  "start_realtime_ns": clock.start_realtime_ns, "end_realtime_ns": clock.end_realtime_ns,
                  "overlap_ns": clock.overlap_ns,
                  "recordings": [{"path": c.path, "host": c.host, "clock": c.clock, "anchors": c.anchors,
                                  "offset_ns": c.offset_ns, "spread_ns": c.spread_ns,
                                  "start_realtime_ns": c.start_realtime_ns, "end_realtime_ns": c.end_realtime_ns}
                                 for c in clock.recordings]},
        "notes": list(job.notes),
    }


def render(view: JobView, console: Console) -> None:
    """Heading, the clock line, the hosts table, the ranks table with the diverging ones
    marked, the job's leaks with host and ranks, the notes."""
    job: JobReport = view.result
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    hosts = len(job.hosts)
    out(f"[bold]memprof job[/] · {len(job.recordings)} recordings · {hosts} host{'s' if hosts != 1 else ''} · "
        f"{len(job.ranks)} ranks" + (f" of {job.world_size}" if job.world_size else ""))
    out(_clock_line(job.clock))
    console.print(_hosts_table(job))
    if job.ranks:
        console.print(_ranks_table(job))
    if job.diverging:
        out(f"[bold]Ranks[/]: [yellow]{len(job.diverging)} differ from the others[/] in {escape(job.layer or '')}:")
        for rank in job.diverging:  # each with its recording's host
            out(diverging_line(rank))
    elif len(job.ranks) >= 3:
        out(f"[bold]Ranks[/]: alike in {escape(job.layer or '')} (peak and growth per step)")
    _render_leaks(out, job)
    for note in job.notes:
        out(f"[dim]note: {escape(note)}[/]")


def _clock_line(clock: JobClock) -> str:
    if not clock.aligned:
        return f"[yellow]Clock[/]: each recording on its own clock: {escape(clock.why or '')}"
    start = datetime.fromtimestamp(clock.start_realtime_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    line = (f"[bold]Clock[/]: one clock (CLOCK_REALTIME, from {start} UTC, "
            f"{format_duration_ns(clock.end_realtime_ns - clock.start_realtime_ns)}); skew within "
            f"±{_ns(clock.skew_ns)} as the recordings' clock anchors tell (the hosts' own wall-clock "
            f"sync error is not seen); the recordings overlap for {format_duration_ns(clock.overlap_ns)}")
    return line + (f"\n  [yellow]! {escape(clock.why)}[/]" if clock.why else "")


def _ns(ns: int) -> str:
    """A small duration in the unit that reads best: ns, µs or ms."""
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns / 1e6:.1f} ms"


def _hosts_table(job: JobReport) -> Table:
    table = Table(title="Hosts", title_justify="left", highlight=False)
    for name, justify in (("host", "left"), ("recordings", "right"), ("ranks", "left"), ("largest rank peak", "right"),
                          ("ranks' end", "right"), ("leaks", "right"), ("leaked", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for h in job.hosts:
        table.add_row(escape(h.host), str(h.recordings), ", ".join(map(str, h.ranks)) or "-",
                      format_bytes(h.largest_rank_peak_bytes), format_bytes(h.ranks_end_bytes), str(h.leaks),
                      format_bytes(h.leak_bytes))
    return table


def _ranks_table(job: JobReport) -> Table:
    table = Table(title=f"Ranks ({job.layer})", title_justify="left", highlight=False)
    for name, justify in (("rank", "right"), ("host", "left"), ("pids", "left"), ("peak", "right"), ("end", "right"),
                          ("growth/step", "right"), ("steps", "right"), ("", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    for r in job.ranks:
        growth = "-" if r.growth_bytes_per_step is None else format_bytes(r.growth_bytes_per_step)
        table.add_row(str(r.rank), escape(str(r.host)), ", ".join(map(str, r.pids)), format_bytes(r.peak_bytes),
                      format_bytes(r.end_bytes), growth, str(r.steps), "[yellow]differs[/]" if r.diverges else "")
    return table


def _render_leaks(out, job: JobReport) -> None:
    if not job.leaks:
        out("[green]No leaks found[/] on any host (held at the end, or growing from step to step).")
        return
    out(f"[bold]Leaks[/]: {len(job.leaks)} across the job (`memprof report leaks RECORDING` for each one's chains)")
    for index, leak in enumerate(job.leaks, 1):
        ranks = f" rank {', '.join(map(str, leak.ranks))}" if leak.ranks else ""
        rate = f", +{format_bytes(leak.slope_bytes_per_step)}/{leak.unit}" if leak.slope_bytes_per_step else ""
        kind = leak.kind.replace("_", " ").replace("per step", f"per {leak.unit}")
        out(f"  {index}. {escape(leak.host)}{ranks} · {escape(leak.layer)} {escape(kind)}: "
            f"{format_bytes(leak.live_bytes)} in {leak.live_count:,}{rate}  {escape(chain_name(list(leak.chain)))}",
            no_wrap=True, overflow="ellipsis")

