"""memprof: kernel, native, PyTorch and CUDA memory of a Linux ML job on one timeline."""

__version__ = "0.1.0"


def mark(label: str = "mark", **values: float) -> None:
    """Put a named moment on the timeline of a `memprof record` run (e.g. "epoch 3"), with
    numbers of that moment (`memprof.mark("request", tokens=512, batch=8)`) that
    `memprof report growth --against tokens` plots memory against.

    Inside a recorded Python process, memprof's agent writes it (with the time and thread);
    when nothing else counts training steps (no optimizer, no torch.profiler), each mark also
    begins a step. Values that are not finite numbers are left out. Outside a recording it
    does nothing, so it can stay in the code."""
    import sys
    agent = sys.modules.get("memprof_agent")
    if agent is not None:
        agent.mark(label, **values)
