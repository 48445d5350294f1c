"""memprof's agent: code that runs inside a Python target (memprof/agent/boot/).

`memprof record -- CMD` starts it by itself in the command's Python processes. For
`memprof record --pid`, a process can opt in beforehand:

    import memprof.agent
    memprof.agent.install()

which loads the agent now; it begins writing when a recording asks it to (see
memprof/agent/boot/memprof_agent.py). It leaves its ready file in a private folder of its
own (`tempfile.mkdtemp`, 0700), never at a name another user could guess, and a recorder
signals it only after checking that folder and the process's SIGUSR2 handler
(memprof/sources/agent_reader/attach.py). Under `sudo`, only the invoking user's own processes are
reached.
"""
from __future__ import annotations

import os
import sys

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def install() -> None:
    """Let a later `memprof record --pid` reach this process's agent (idempotent, never
    raises): the recorder finds this process ready and signals it (SIGUSR2; a handler the
    program had for it still runs; the folder goes at exit). Inside `memprof record -- CMD`
    it starts at once."""
    try:
        if BOOT not in sys.path:
            sys.path.append(BOOT)
        import memprof_agent
        memprof_agent.enable_attach()
        if os.environ.get("MEMPROF_AGENT_DIR"):
            memprof_agent.watch_for_torch()
    except Exception:  # the target goes on
        pass
