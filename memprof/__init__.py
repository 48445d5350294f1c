"""memprof: kernel, native, PyTorch and CUDA memory of a Linux ML job on one timeline."""

__version__ = "0.1.0"


def mark(label: str = "mark") -> None:
    """Put a named moment on the timeline of a `memprof record` run (e.g. "epoch 3").

    Inside a recorded Python process, memprof's agent writes it (with the time and thread);
    when nothing else counts training steps (no optimizer, no torch.profiler), each mark also
    begins a step. Outside a recording it does nothing, so it can stay in the code."""
    import sys
    agent = sys.modules.get("memprof_agent")
    if agent is not None:
        agent.mark(label)
