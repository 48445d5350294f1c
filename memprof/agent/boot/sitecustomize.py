"""memprof's start-up hook for the Python processes of a recorded command.

`memprof record -- CMD` puts a copy of this folder first on PYTHONPATH and sets
MEMPROF_AGENT_DIR, so every Python process of the command's tree — `python train.py`,
`python -m pkg`, torchrun and its workers — runs this at start-up, before the user's code.
It does nothing until the process imports torch; then it starts the agent (memprof_agent.py,
beside this file). It must never break the target: every failure is written to the agent
folder of the recording and swallowed.

It also runs the sitecustomize this one shadows (Debian ships one in /etc/python3.X), so the
target starts exactly as it would have.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_shadowed_sitecustomize():
    """Import the next sitecustomize on sys.path, as Python would have without us."""
    saved = list(sys.path)
    mine = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        import importlib
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception:  # the user's own hook failed: report it as Python would, and go on
        import traceback
        traceback.print_exc()
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _start():
    _run_shadowed_sitecustomize()
    if not os.environ.get("MEMPROF_AGENT_DIR"):
        return
    try:
        if _HERE not in sys.path:
            sys.path.append(_HERE)
        import memprof_agent
        memprof_agent.watch_for_torch()
    except Exception as e:  # never break the target
        try:
            import memprof_agent
            memprof_agent.log_failure("start-up hook", e)
        except Exception:
            pass


_start()
