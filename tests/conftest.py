"""What every test of the suite keeps to."""
from __future__ import annotations

import pytest

from memprof import own_env


@pytest.fixture(autouse=True)
def _memprofs_tuning_stays_memprofs():
    """Test modules import memprof's CLI in pytest's own process, and that import applies
    memprof's tuning of its own environment (own_env.apply) to this process. Every program a
    test starts (memprof, and the command it records) would then inherit it as the user's
    own setting, which memprof keeps for its commands: with OPENBLAS_NUM_THREADS=1 so passed
    on, a recorded torch program started no OpenBLAS thread, and the leak gate's test missed
    its `threads` (CI, 2026-12-05). Taken back before and after each test."""
    own_env.undo()
    yield
    own_env.undo()
