"""The live status line of `memprof record` (stderr, only on a terminal)."""
from __future__ import annotations

from rich.console import Console

from memprof.report.safe_text import escape
from memprof.units import format_bytes


class StatusLine:
    def __init__(self, console: Console, enabled: bool = True):
        self._console = console
        self._enabled = enabled and console.is_terminal
        self._status = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def update(self, s) -> None:
        if not self._enabled:
            return
        layers = " · ".join(f"{layer} {format_bytes(n)}" for layer, n in sorted(s.bytes_by_layer.items())) or "no allocations yet"
        lost = f" · [red]lost {s.lost:,}[/]" if s.lost else ""
        text = f"recording {escape(str(s.path))} · {s.elapsed_s:5.1f}s · {s.events_per_s:,.0f} events/s · {layers}{lost}"
        if self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
