"""cli/status.py: the phase lines of `memprof record` (issue 20, point 6), off a terminal."""
from __future__ import annotations

import io

from rich.console import Console

from memprof.cli.status import StatusLine, phase_line
from memprof.capture.session import FINALIZING, LOADING, RECORDING, STOPPING, Phase


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200), buffer


def test_phase_lines():
    assert phase_line(Phase(LOADING)) == "loading probes…"
    assert phase_line(Phase(RECORDING, seconds=2.46)) == "probes loaded in 2.5s; recording"
    assert phase_line(Phase(STOPPING, why="--duration reached")) == "--duration reached: stopping…"
    assert phase_line(Phase(STOPPING, seconds=2.0, why="the command exited")) == \
        "the command exited: stopping, collecting the kernel's last frees (at most 2s)…"
    assert phase_line(Phase(FINALIZING, frames=1234)) == "finalizing: 1,234 frames symbolized, writing the recording…"
    assert phase_line(Phase(FINALIZING, frames=1)) == "finalizing: 1 frame symbolized, writing the recording…"


def test_off_a_terminal_each_phase_is_one_line_and_no_live_line():
    console, buffer = _console()
    status = StatusLine(console)
    assert not status.enabled
    for phase in (Phase(LOADING), Phase(RECORDING, seconds=1.0), Phase(STOPPING, why="interrupted"),
                  Phase(FINALIZING, frames=3)):
        status.phase(phase)
    status.close()
    assert buffer.getvalue().splitlines() == [
        "memprof: loading probes…", "memprof: probes loaded in 1.0s; recording",
        "memprof: interrupted: stopping…",
        "memprof: finalizing: 3 frames symbolized, writing the recording…"]


def test_quiet_shows_no_phase():
    console, buffer = _console()
    status = StatusLine(console, enabled=False)
    status.phase(Phase(LOADING))
    status.close()
    assert buffer.getvalue() == ""


def test_the_probes_loading_is_counted_from_when_the_wait_began():
    """`record` passes its process's start: a warm start's loads begin before the session's
    LOADING phase (sources/ebpf/early.py), which alone read 0.0s."""
    import time
    console, buffer = _console()
    status = StatusLine(console, began_at=time.monotonic() - 0.74)
    status.phase(Phase(RECORDING, seconds=0.01))
    status.close()
    assert buffer.getvalue().splitlines() == ["memprof: probes loaded in 0.7s; recording"]

