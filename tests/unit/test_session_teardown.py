"""When `record` stops listening after the target's tree has exited."""
from memprof.capture.session import (POLL_S, TEARDOWN_GRACE_S, TEARDOWN_MAX_S, TEARDOWN_QUIET_AFTER_BARRIER_S,
                                     TEARDOWN_QUIET_S, _cpu_phases, _last_held_free, _teardown_over, _teardown_wait_s,
                                     _tree_exit_time)


def test_waits_the_grace_even_when_quiet():
    assert not _teardown_over(TEARDOWN_GRACE_S / 2, since_free_s=10)


def test_goes_on_while_frees_still_arrive():
    assert not _teardown_over(TEARDOWN_GRACE_S * 2, since_free_s=TEARDOWN_QUIET_S / 4)
    assert _teardown_over(TEARDOWN_GRACE_S * 2, since_free_s=TEARDOWN_QUIET_S)


def test_stops_at_the_most_whatever_arrives():
    assert _teardown_over(TEARDOWN_MAX_S, since_free_s=0)
    assert _teardown_over(TEARDOWN_MAX_S, since_free_s=0, barrier_drained=True)


def test_a_drained_rcu_barrier_stands_for_the_grace():
    """The kernel's RCU callbacks have all run and their frees are read: listen only until
    the target's frees pause, however soon after the exit."""
    assert _teardown_over(TEARDOWN_GRACE_S / 4, since_free_s=TEARDOWN_QUIET_AFTER_BARRIER_S, barrier_drained=True)
    assert not _teardown_over(TEARDOWN_GRACE_S / 4, since_free_s=TEARDOWN_QUIET_AFTER_BARRIER_S / 2,
                              barrier_drained=True)
    assert TEARDOWN_QUIET_AFTER_BARRIER_S < TEARDOWN_QUIET_S


def test_the_quiet_counts_from_the_kernels_stamp_of_the_last_held_free():
    """A free found by a drain 30 ms after it happened has been quiet 30 ms already."""
    assert _last_held_free(10.0, held_free_ns=10_470_000_000) == 10.47
    assert _last_held_free(10.5, held_free_ns=None) == 10.5  # none in this drain: as before
    assert _last_held_free(10.5, held_free_ns=10_400_000_000) == 10.5  # never earlier than known


def test_after_the_barrier_the_wait_ends_when_the_quiet_would():
    """Before the barrier returns the loop polls as usual; after it, it wakes when the quiet
    after the last held free is over, not up to a poll period later (but never spins)."""
    quiet = TEARDOWN_QUIET_AFTER_BARRIER_S
    assert _teardown_wait_s(now_s=10.0, last_free_s=9.99, barrier_ended_s=None) == POLL_S
    assert abs(_teardown_wait_s(now_s=10.0, last_free_s=10.0 - quiet + 0.005, barrier_ended_s=9.9) - 0.005) < 1e-9
    assert _teardown_wait_s(now_s=10.0, last_free_s=10.0, barrier_ended_s=9.9) == min(POLL_S, quiet)
    assert _teardown_wait_s(now_s=10.0, last_free_s=5.0, barrier_ended_s=9.9) == 0.001


def test_an_rcu_barrier_waits_for_the_kernel_and_says_when(tmp_path):
    """RcuBarrier writes 1 to the parameter on a thread, and notes when the write returned;
    where it cannot, it says why and is never drained."""
    import time
    from memprof.capture.deferred_frees import RcuBarrier
    param = tmp_path / "do_rcu_barrier"
    param.write_text("")
    barrier = RcuBarrier(str(param))
    deadline = time.monotonic() + 10
    while barrier.ended_s is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert param.read_text() == "1"
    assert barrier.drained_by(time.monotonic()) and not barrier.drained_by(barrier.began_s - 1)
    detail = barrier.detail()
    assert detail["rcu_barrier_ended_ns"] >= detail["rcu_barrier_began_ns"] > 0

    missing = RcuBarrier(str(tmp_path / "no-such-kernel" / "do_rcu_barrier"))
    while missing.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not missing.drained_by(time.monotonic() + 100)
    assert "No such file or directory" in missing.detail()["rcu_barrier_error"]


def test_the_grace_counts_from_the_kernels_stamp_of_the_exit():
    assert _tree_exit_time(10.5, last_exit_ns=10_400_000_000) == 10.4
    assert _tree_exit_time(10.5, last_exit_ns=None) == 10.5  # no exit polled: when it was noticed
    assert _tree_exit_time(10.5, last_exit_ns=11_000_000_000) == 10.5  # never later than noticed


def test_the_last_exit_is_the_latest_stamp_of_the_tree():
    from memprof.sources.ebpf.source import EbpfSource
    source = EbpfSource()
    assert source.last_exit_ns() is None
    for pid, ppid, start in ((100, None, 1), (101, 100, 2), (102, 100, 3)):
        source.processes.add(pid, ppid, start)
    source.processes.exit_(101, 50)
    source.processes.exit_(100, 40)
    assert source.last_exit_ns() == 50


def test_the_recorders_cpu_phases_come_from_its_marks():
    """meta.recorder_cpu_ns: "before" is the clock at the loop's start, "during" to the exit's
    mark, "after" from it to now; with no exit mark "during" runs to now; no loop, nothing."""
    import time
    now = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
    phases = _cpu_phases([now - 300, now - 100])
    assert phases["before"] == now - 300 and phases["during"] == 200 and phases["after"] >= 100
    stopped = _cpu_phases([now - 300])
    assert set(stopped) == {"before", "during"} and stopped["during"] >= 300
    assert _cpu_phases([]) == {}
