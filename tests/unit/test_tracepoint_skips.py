"""What `Tracepoints.missed` makes of the kernel's recursion skips (bpf/README.md, "Missed
frees", 1): a free tracepoint's skips, less the nested frees its backup program saw, are
frees lost; an allocation tracepoint's skips were made inside memprof's own program (an
interrupt, or the program's own helpers) and are never the target's, so they are kept apart
and reported nowhere as a loss. Stand-ins here: bcc's BPF object and the kernel's program
statistics (the real ones need root and a real nested event, which no test can make on
demand; tests/integration/test_nested_frees.py runs the real backup program)."""
from types import SimpleNamespace

import pytest

from memprof.analysis.html_data import loss_warnings
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.loss import skipped_frees
from memprof.model import RecordingMeta, SourceStats
from memprof.sources.ebpf import loading
from memprof.sources.ebpf import records as R
from tests.factories import churn

# Recursion misses the kernel counted, per program (each has its own fd in the stand-in).
MISSES = {"mp_kmem_cache_alloc": 124, "mp_kmalloc": 7, "mp_page_alloc": 2, "mp_kmem_cache_free": 30, "mp_kfree": 5,
          "mp_kmem_cache_free_nested": 0, "mp_kfree_nested": 0}
PLAN = [("kmem_cache_alloc", "mp_kmem_cache_alloc"), ("kmalloc", "mp_kmalloc"), ("kmalloc_node", "mp_kmalloc"),
        ("mm_page_alloc", "mp_page_alloc"), ("kmem_cache_free", "mp_kmem_cache_free"),
        ("kmem_cache_free", "mp_kmem_cache_free_nested"), ("kfree", "mp_kfree"), ("kfree", "mp_kfree_nested")]


class _Bpf:
    RAW_TRACEPOINT = 17

    def __init__(self):
        self.fds = {name: fd for fd, name in enumerate(MISSES, start=100)}

    def load_func(self, name, kind):
        return SimpleNamespace(fd=self.fds[name])


class _Counters(dict):
    """The per-CPU counters map: slot -> one value per CPU."""

    def __getitem__(self, key):
        return self.get(key.value, [0, 0])


@pytest.fixture
def skips(monkeypatch):
    bpf = _Bpf()
    by_fd = {fd: MISSES[name] for name, fd in bpf.fds.items()}
    monkeypatch.setattr(loading, "prog_stats", lambda fd: SimpleNamespace(recursion_misses=by_fd[fd]))
    tracepoints = loading.Tracepoints()
    tracepoints.attached = list(PLAN)
    seen = R.CNT_NESTED_FREES + R.FREE_TRACEPOINTS.index("kmem_cache_free")
    counters = _Counters({seen: [20, 8]})  # the kmem_cache_free backup saw 28 nested frees
    detail = {}
    return tracepoints.missed(bpf, counters, detail), detail


def test_only_frees_no_program_saw_are_missed(skips):
    missed, detail = skips
    assert missed == {"kmem_cache_free": 2, "kfree": 5}  # 30 - 28 seen; 5 - 0
    assert detail["nested_frees_recovered"] == {"kmem_cache_free": 28, "kfree": 0}


def test_allocations_made_inside_the_program_are_kept_apart(skips):
    missed, detail = skips
    # kmalloc and kmalloc_node share one program: its skips are counted once.
    assert detail["nested_allocations"] == {"kmem_cache_alloc": 124, "kmalloc": 7, "mm_page_alloc": 2}
    assert not set(missed) & set(detail["nested_allocations"])


def test_a_recording_from_before_lists_allocation_skips_and_no_loss_is_warned_of_for_them():
    old = SourceStats(missed={"kmem_cache_alloc": 124, "kmalloc": 7, "kfree": 3})
    assert skipped_frees(old) == {"kfree": 3}
    warnings = loss_warnings(RecordingMeta(sources={"ebpf": old}), pair_lifetimes(_one_freed_allocation()))
    assert warnings == ["ebpf: 3 frees were skipped by the kernel (kfree: 3): allocations shown as live may have "
                        "been freed"]
    only_allocations = SourceStats(missed={"kmem_cache_alloc": 124})
    assert loss_warnings(RecordingMeta(sources={"ebpf": only_allocations}), pair_lifetimes(_one_freed_allocation())) == []


def _one_freed_allocation():
    return churn(1)  # nothing sampled, nothing live: only the skips can warn
