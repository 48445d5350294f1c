"""start_quiet: a thread started by it blocks the signals `record` takes itself from its
first instruction, so that the kernel never hands it one (memprof/quiet_threads.py); its
creator's mask is left as it was. Read from the kernel: /proc/self/task/TID/status SigBlk."""
from __future__ import annotations

import signal
import threading

from memprof.quiet_threads import FORWARDED_SIGNALS, start_quiet


def blocked_in_this_thread() -> set[int]:
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {signo for signo in range(1, 65) if mask >> (signo - 1) & 1}


def test_a_quiet_thread_blocks_the_forwarded_signals_and_its_creator_keeps_its_mask():
    before = blocked_in_this_thread()
    seen: list[set[int]] = []
    start_quiet(threading.Thread(target=lambda: seen.append(blocked_in_this_thread()))).join()
    assert set(FORWARDED_SIGNALS) | {signal.SIGCHLD} <= seen[0]
    assert blocked_in_this_thread() == before


def test_a_plain_thread_would_take_them():
    """The control: a thread started plainly inherits this one's mask, without them."""
    assert signal.SIGINT not in blocked_in_this_thread()
    seen: list[set[int]] = []
    thread = threading.Thread(target=lambda: seen.append(blocked_in_this_thread()))
    thread.start()
    thread.join()
    assert signal.SIGINT not in seen[0]
