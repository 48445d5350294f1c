"""What `memprof record` shows on stderr while it works: one line per phase (loading probes,
recording, stopping, finalizing), and on a terminal a live status line under them. Quiet:
nothing (the command prints its one final line itself)."""
from __future__ import annotations

import dataclasses
import time

from rich.console import Console

from memprof.capture.session import FINALIZING, LOADING, RECORDING, STOPPING, Phase
from memprof.report.safe_text import escape
from memprof.units import format_bytes


def phase_line(phase: Phase) -> str:
    """The line shown when `phase` begins. Not escaped."""
    if phase.name == LOADING:
        return "loading probes…"
    if phase.name == RECORDING:
        return f"probes loaded in {phase.seconds:.1f}s; recording"
    if phase.name == STOPPING and phase.seconds is not None:
        return f"{phase.why}: stopping, collecting the kernel's last frees (at most {phase.seconds:.0f}s)…"
    if phase.name == STOPPING:
        return f"{phase.why}: stopping…"
    if phase.name == FINALIZING:
        return f"finalizing: {phase.frames:,} frame{'s' if phase.frames != 1 else ''} symbolized, writing the recording…"
    raise ValueError(f"unknown phase {phase.name!r}")


class StatusLine:
    """`phase` prints each phase's line (unless quiet); on a terminal, `update` keeps a live
    line under them (the phase, elapsed time, event rate, live bytes per layer)."""

    def __init__(self, console: Console, enabled: bool = True, began_at: float | None = None):
        """`enabled` False: quiet, nothing is shown. `began_at` (time.monotonic()'s clock): when
        the user's wait began (`record`'s process start); the RECORDING line then counts the
        probes' loading from there, not from the session's LOADING phase, which a first run's
        compile and a warm start's loads begin well before (sources/ebpf/early.py)."""
        self._console = console
        self._began_at = began_at
        self._quiet = not enabled
        self._enabled = enabled and console.is_terminal
        self._status = None
        self._label = "recording"

    @property
    def enabled(self) -> bool:
        """Whether the live line is shown (on a terminal, not quiet): only then is `update` worth calling."""
        return self._enabled

    def phase(self, phase: Phase) -> None:
        if self._quiet:
            return
        if phase.name == RECORDING and self._began_at is not None:
            phase = dataclasses.replace(phase, seconds=time.monotonic() - self._began_at)
        self._console.print(f"[dim]memprof:[/] {escape(phase_line(phase))}", highlight=False, soft_wrap=True)
        self._label = phase.name
        if self._enabled and phase.name != RECORDING:  # while recording, `update` says more
            self._show(f"{phase.name}…")

    def update(self, s) -> None:
        if not self._enabled:
            return
        layers = " · ".join(f"{layer} {format_bytes(n)}" for layer, n in sorted(s.bytes_by_layer.items())) or "no allocations yet"
        lost = f" · [red]lost {s.lost:,}[/]" if s.lost else ""
        self._show(f"{self._label} {escape(str(s.path))} · {s.elapsed_s:5.1f}s · {s.events_per_s:,.0f} events/s · {layers}{lost}")

    def _show(self, text: str) -> None:
        if self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
