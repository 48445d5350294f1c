"""When `record` stops listening after the target's tree has exited."""
from memprof.capture.session import TEARDOWN_GRACE_S, TEARDOWN_MAX_S, TEARDOWN_QUIET_S, _teardown_over


def test_waits_the_grace_even_when_quiet():
    assert not _teardown_over(TEARDOWN_GRACE_S / 2, since_free_s=10)


def test_goes_on_while_frees_still_arrive():
    assert not _teardown_over(TEARDOWN_GRACE_S * 2, since_free_s=TEARDOWN_QUIET_S / 4)
    assert _teardown_over(TEARDOWN_GRACE_S * 2, since_free_s=TEARDOWN_QUIET_S)


def test_stops_at_the_most_whatever_arrives():
    assert _teardown_over(TEARDOWN_MAX_S, since_free_s=0)
