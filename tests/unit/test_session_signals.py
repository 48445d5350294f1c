"""A signal for the recorder that the kernel hands to a thread other than the main one (one
started before the recorder blocked its signals, as OpenBLAS's is at numpy's import) stops the
recording like any other: the loop takes it, no KeyboardInterrupt in the middle of a flush, no
SIGTERM killing memprof before the recording is finished."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from memprof.capture import session as S

    started, stop = threading.Event(), threading.Event()
    def idle():
        started.set()
        stop.wait()
    thread = threading.Thread(target=idle, daemon=True)
    thread.start()  # before the block: it does not block the signal, the main thread will
    started.wait()

    class NoCommand:
        child = None

    with S._BlockedSignals():
        os.kill(os.getpid(), int(sys.argv[1]))  # the kernel hands it to the idle thread
        got, deadline = None, time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            sum(range(100_000))  # busy in Python, as a flush is
            got = S.Session._take_signal(NoCommand(), 0.01)
    stop.set()
    thread.join()
    print("taken", got)
""")


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_another_thread_was_handed_is_taken_by_the_loop(signo):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(int(signo))], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"taken {int(signo)}"), done.stderr


def test_the_handlers_are_restored_after_the_block():
    from memprof.capture import session as S
    before = signal.getsignal(signal.SIGINT)
    with S._BlockedSignals():
        assert signal.getsignal(signal.SIGINT) is S._queue_signal
    assert signal.getsignal(signal.SIGINT) is before


STOPPED_SCRIPT = textwrap.dedent("""
    import os, signal, time
    from memprof.capture import session as S

    class NoCommand:
        child = None

    with S._BlockedSignals():
        if os.fork() == 0:  # stops and continues the recorder three times, as Ctrl-Z and fg would
            for _ in range(3):
                time.sleep(0.1)
                os.kill(os.getppid(), signal.SIGSTOP)
                time.sleep(0.1)
                os.kill(os.getppid(), signal.SIGCONT)
            os._exit(0)
        strays, deadline = [], time.monotonic() + 1.0
        while time.monotonic() < deadline:
            got = S.Session._take_signal(NoCommand(), 0.02)
            if got is not None:
                strays.append(got)
        os.wait()
        os.kill(os.getpid(), signal.SIGUSR1)
        taken = S.Session._take_signal(NoCommand(), 0.02)
    print("strays", strays, "taken", int(taken))
""")


def test_a_stop_and_continue_of_the_recorder_is_not_a_signal_for_the_command():
    """CPython's sigtimedwait, interrupted by a stop whose continue comes after its timeout,
    returns a siginfo it never filled in; the loop took it for a signal (si_signo 0 or stack
    garbage) and passing it on to the command failed with EINVAL: an internal error."""
    done = subprocess.run([sys.executable, "-c", STOPPED_SCRIPT], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"strays [] taken {int(signal.SIGUSR1)}"), done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="RunAs reads sudo's variables only as root")
@pytest.mark.parametrize("environ", [{"SUDO_UID": "abc"}, {"SUDO_UID": "1000", "SUDO_GID": "x"}])
def test_sudo_variables_that_name_no_user_are_one_clear_error(environ):
    """Not an internal error (ValueError) before anything starts: one line and a hint."""
    from memprof.capture.target import RunAs
    from memprof.errors import MemprofError
    with pytest.raises(MemprofError) as err:
        RunAs.from_sudo(environ)
    assert "name no user" in err.value.message and "SUDO_UID" in err.value.hint


@pytest.mark.skipif(os.geteuid() != 0, reason="RunAs reads sudo's variables only as root")
def test_sudo_by_root_itself_runs_as_root():
    from memprof.capture.target import RunAs
    assert RunAs.from_sudo({"SUDO_UID": "0", "SUDO_GID": "0"}) is None


def test_the_wait_ends_when_the_command_exits_not_a_poll_period_later():
    """The loop's wait between polls ends at the command's exit (its pidfd polls readable):
    the exit, and the teardown after it, begin at once. The child is reaped once, and its
    descriptor is gone after."""
    from memprof.capture import session as S
    from memprof.capture.target import GatedChild
    child = GatedChild(["/bin/true"], "/bin/true", None)
    fd = child.exit_fd()
    if fd is None:
        pytest.skip("no pidfds on this kernel (before 5.3): the wait keeps its period")
    child.release()
    t0 = time.monotonic()
    assert S._next_signal((signal.SIGUSR2,), 30, fd) is None
    assert time.monotonic() - t0 < 15  # the exit, not the 30 s timeout, ended it
    assert child.wait() == 0 and child.exit_fd() is None
