"""memprof's agent: code that runs inside a Python target (memprof/agent/boot/).

`memprof record -- CMD` starts it by itself in the command's Python processes. For
`memprof record --pid`, a process can opt in beforehand:

    import memprof.agent
    memprof.agent.install()

which loads the agent now; it begins writing when a recording asks it to (see
memprof/agent/boot/memprof_agent.py).
"""
from __future__ import annotations

import os
import sys

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def install() -> None:
    """Let a later `memprof record --pid` reach this process's agent (idempotent, never
    raises): the recorder finds this process ready and signals it (SIGUSR2; a handler the
    program had for it still runs). Inside `memprof record -- CMD` it starts at once."""
    try:
        if BOOT not in sys.path:
            sys.path.append(BOOT)
        import memprof_agent
        memprof_agent.enable_attach()
        if os.environ.get("MEMPROF_AGENT_DIR"):
            memprof_agent.watch_for_torch()
    except Exception:  # the target goes on
        pass
