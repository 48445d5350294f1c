"""One recording: sources attached, target started (or attached to), events flushed to
disk at least once a second, and everything finalized however the recording stops."""
from __future__ import annotations

import os
import platform
import select
import signal
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from memprof import __version__, preload
from memprof.errors import MemprofError, TargetError, UsageError
from memprof.model import ClockAnchor, RecordingMeta
from memprof.proc_text import own_peak_rss_bytes
from memprof.quiet_threads import FORWARDED_SIGNALS
from memprof.asuser import Owner, UserThread
from memprof.capture.deferred_frees import RcuBarrier
from memprof.capture.livebytes import LiveBytes
from memprof.capture.may_record import require_recording_privileges
from memprof.capture.sampling import SamplerThread
from memprof.capture.target import GatedChild, RunAs, resolve_executable
from memprof.sources.agent_reader.source import AgentOptions, AgentSource
from memprof.sources.ebpf.source import EbpfOptions, EbpfSource
from memprof.sources.cpython.interp import python_file_in_maps
from memprof.sources.symbols import files as target_files
from memprof.sources.symbols.procs import descendants, pid_alive, process_uids, read_comm

POLL_S = 0.02          # ring buffer drain period
# A flush starts every FLUSH_S (or as soon as the one before it ends, when it ran longer).
# A SIGKILL loses what came in since the data of the last completed flush was taken: up to
# FLUSH_S plus one flush's duration, so 0.5 s while a flush takes under 0.25 s (README:
# what was measured under load).
FLUSH_S = 0.25
# After the target's tree has exited, the kernel still frees what it held: RCU callbacks
# above all. At the exit the session asks the kernel for an rcu_barrier()
# (capture/deferred_frees.py), and listens until the barrier has returned, a drain of the
# ring buffer has followed it, and TEARDOWN_QUIET_AFTER_BARRIER_S pass without a free of a
# kernel allocation the target still held (MP_FLAG_HELD, bpf/kmem.bpf.c): work the kernel
# defers otherwise. Where no barrier can be had, it listens at least TEARDOWN_GRACE_S after
# the exit (the kernel's stamp of it: _tree_exit_time) and on until TEARDOWN_QUIET_S pass
# without such a free (a loaded machine runs deferred work late). Either way TEARDOWN_MAX_S
# in all. Other frees are not counted: other processes' frees of addresses the target once
# had, which the address filter lets through by the thousand, kept this waiting up to a
# second for nothing (bench/RESULTS.md).
TEARDOWN_GRACE_S = 0.3
TEARDOWN_QUIET_S = 0.2
TEARDOWN_QUIET_AFTER_BARRIER_S = 0.05
TEARDOWN_MAX_S = 2.0

if TYPE_CHECKING:  # imported where --max-size asks for it (its folding, at a first fold, brings pandas)
    from memprof.capture.compactor import Compactor

_SI_KERNEL = 0x80  # si_code of signals the terminal driver sends (Ctrl-C): the child got its own


class RecordingWriteError(MemprofError):
    """The recording could not be written (disk full, permissions). What was written
    before stays readable: complete parts and the last complete meta.json."""


@dataclass
class RecordRequest:
    command: list[str] | None = None
    pid: int | None = None
    output: Path | None = None
    duration_s: float | None = None
    force: bool = False
    host: str | None = None  # meta.host (`record --host-label`); None: platform.node()
    output_tag: str = ""  # in the default output name: a job's id and host (cli/record.py)
    max_size_bytes: int | None = None  # record --max-size: fold old events past it (capture/compactor.py)
    ebpf: EbpfOptions = field(default_factory=EbpfOptions)
    agent: AgentOptions = field(default_factory=AgentOptions)


@dataclass
class Status:
    """What the status line shows; rates are per second over the last interval."""

    elapsed_s: float
    events: int
    events_per_s: float
    bytes_by_layer: dict
    lost: int
    path: Path


# Phase.name: what a recording is doing, in order.
LOADING, RECORDING, STOPPING, FINALIZING = "loading probes", "recording", "stopping", "finalizing"


@dataclass(frozen=True)
class Phase:
    """A phase of the recording as it begins (`on_phase`). LOADING: compiling and attaching
    the probes (seconds, usually). RECORDING: the target runs; `seconds` is how long LOADING
    took. STOPPING: `why` it stops ("the command exited", "--duration reached", "interrupted");
    when the target exited, the kernel's last frees are collected for at most `seconds`
    (TEARDOWN_MAX_S). FINALIZING: the last events
    and chains are written; `frames` is how many frames the recording's chains have,
    symbolized (kernel, native and Python)."""

    name: str
    seconds: float | None = None
    why: str | None = None
    frames: int | None = None


@dataclass
class RecordResult:
    path: Path
    exit_status: int | None  # the command's, when there was one
    events: int
    lost: int
    missed: int
    interrupted: bool
    folds: int = 0  # times old events were folded to keep under --max-size
    size_bytes: int = 0  # what the recording takes on disk, measured only under --max-size
    max_size_bytes: int | None = None  # --max-size, None: no limit
    passed_limit: bool = False  # the recording passed --max-size at some moment (its notes say why)


def default_output(name: str, pid: int, directory: Path = Path("."), tag: str = "") -> Path:
    """./memprof-NAME-PID.memprof, or ./memprof-TAG-NAME-PID.memprof (TAG: a job's id and host).
    Both come from what the target and its environment control (its name, SLURM_JOB_ID,
    --host-label): each is reduced to one file name's characters, so the path stays in `directory`."""
    safe = _file_name_characters(os.path.basename(name)) or "target"
    tag = _file_name_characters(tag)
    return directory / f"memprof-{tag + '-' if tag else ''}{safe}-{pid}.memprof"


def _file_name_characters(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _yield_to_target() -> None:
    """Run the calling thread, and the threads it starts from now on, as SCHED_BATCH.

    The recorder wakes often (the ring buffer poll every POLL_S, the samplers, the flush
    thread); on a machine with few CPUs, a normal thread waking where the target runs may
    preempt it on the spot. A batch thread never preempts on wake-up, and keeps its fair
    share of CPU time under contention (same nice value), so the ring buffer is drained as
    before. The command was started before this and keeps its own policy. Where the kernel
    refuses (a seccomp filter, say), the recorder runs as it was."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _next_signal(signals: tuple[int, ...], timeout_s: float,
                 wake_fd: int | None = None) -> signal.struct_siginfo | None:
    """One pending signal of `signals` (all blocked), waiting up to `timeout_s` seconds for
    it; None when none came. It may come up to `timeout_s` late. The wait ends early when
    `wake_fd` polls readable (the command's pidfd: its exit is then seen at once, not up to
    a poll period later).

    It sleeps, then takes the signal with a zero timeout, rather than blocking in
    sigtimedwait: CPython's sigtimedwait returns a siginfo it never filled in (si_signo 0, or
    whatever its stack held) when a stop and continue interrupt the wait (Ctrl-Z then `fg`;
    SIGSTOP then SIGCONT) and its timeout has run out meanwhile. memprof then passed a signal
    nobody sent on to the command, and os.kill's EINVAL ended the recording as an internal
    error. A zero timeout never sleeps, so no stop can interrupt it."""
    info = signal.sigtimedwait(signals, 0)
    if info is None:
        if wake_fd is None:
            time.sleep(timeout_s)
        else:
            select.select([wake_fd], [], [], timeout_s)
        info = signal.sigtimedwait(signals, 0)
    return info


def _asked_for_uprobes(options: EbpfOptions) -> str | None:
    """Why the options themselves keep the libc heap on uprobes, in words; None when they
    leave it to the command's circumstances (memprof/preload's why_not)."""
    if options.native_probes == preload.UPROBES:
        return "--native-probes uprobes"
    if options.allocator_prefix:
        return "--allocator-prefix: only uprobes reach a prefixed allocator's own functions"
    return None


def _teardown_over(since_exit_s: float, since_free_s: float, barrier_drained: bool = False) -> bool:
    """Stop listening after the tree exited: the kernel's deferred frees are in and the
    target's frees stopped coming (or the most we wait passed). `since_free_s`: since the
    last free of a kernel allocation the target still held. `barrier_drained`: the
    rcu_barrier() asked at the exit returned before the latest drain of the ring buffer
    began; without one, a grace from the exit stands in for it."""
    if since_exit_s >= TEARDOWN_MAX_S:
        return True
    if barrier_drained:
        return since_free_s >= TEARDOWN_QUIET_AFTER_BARRIER_S
    return since_exit_s >= TEARDOWN_GRACE_S and since_free_s >= TEARDOWN_QUIET_S


def _last_held_free(last_free_s: float, held_free_ns: int | None) -> float:
    """When the target's last held kernel allocation was freed, as far as the drains
    so far tell (time.monotonic() seconds): the kernel's stamp of the latest such free, not
    when a drain found it (up to a poll period and a flush later), so that the quiet after
    it is counted from the free. `last_free_s`: the answer so far (the loop's start at
    first)."""
    return last_free_s if held_free_ns is None else max(last_free_s, held_free_ns / 1e9)


def _teardown_wait_s(now_s: float, last_free_s: float, barrier_ended_s: float | None) -> float:
    """How long the loop waits for the next drain once the tree has exited: a poll period,
    but once the rcu_barrier() has returned, no longer than until the quiet after it is over
    (TEARDOWN_QUIET_AFTER_BARRIER_S from the last held free, _teardown_over), so that the
    teardown ends when it may, not up to a poll period later. At least 1 ms."""
    if barrier_ended_s is None:
        return POLL_S
    return min(POLL_S, max(0.001, last_free_s + TEARDOWN_QUIET_AFTER_BARRIER_S - now_s))


def _tree_exit_time(seen_s: float, last_exit_ns: int | None) -> float:
    """When the tree exited (time.monotonic() seconds), which the teardown's grace counts
    from: the kernel's stamp of its last process's exit when the source has one, else
    `seen_s`, when the session noticed. A torch process's exit was noticed 37-111 ms after
    its stamp (bench/RESULTS.md, "After the command's exit")."""
    return seen_s if last_exit_ns is None else min(seen_s, last_exit_ns / 1e9)


def _cpu_phases(marks: list[int]) -> dict[str, int]:
    """meta.recorder_cpu_ns from `marks`, the process CPU clock read at the loop's start and
    where the tree's exit was seen (absent where the recording stopped otherwise: then
    "during" runs to now, and there is no "after"), and from the clock now. {} where the
    loop never began."""
    if not marks:
        return {}
    now = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
    loop_start = marks[0]
    if len(marks) == 1:
        return {"before": loop_start, "during": now - loop_start}
    exit_seen = marks[1]
    return {"before": loop_start, "during": exit_seen - loop_start, "after": now - exit_seen}


def anchor() -> ClockAnchor:
    return ClockAnchor(monotonic_ns=time.monotonic_ns(), realtime_ns=time.time_ns())


class Session:
    """Runs one recording. `on_status` is called about four times a second."""

    def __init__(self, request: RecordRequest, on_status: Callable[[Status], None] | None = None,
                 on_notice: Callable[[str], None] | None = None, on_phase: Callable[[Phase], None] | None = None):
        """`on_notice(text)` hears of trouble the moment it happens (a recording that can no
        longer be written, while the command runs on); `on_phase(phase)` of each Phase as it
        begins, once each, in order (STOPPING and FINALIZING only once the target ran)."""
        self.request = request
        self.on_status = on_status or (lambda s: None)
        self.on_notice = on_notice or (lambda text: None)
        self.on_phase = on_phase or (lambda phase: None)
        self._loading_since = time.monotonic()
        self._frames = 0  # rows of the frames table written so far
        self.source = EbpfSource(request.ebpf)
        self.sampler = SamplerThread()
        # Live bytes feed only the status line: without one, save the recorder's CPU
        # (on a small machine it is the target's CPU too).
        self.live = LiveBytes() if on_status is not None else None
        self.writer = None
        self.compactor: Compactor | None = None  # made at the first flush (_compactor_now)
        self._fold_origin_ns = 0  # the recording's start, once _open_writer knows it
        self.child: GatedChild | None = None
        self.agent: AgentSource | None = None
        self.run_as = RunAs.from_sudo()
        # Whose the recording is. Every file operation on it (create, flush, finalize, the
        # agent's folder) runs on `files`, with that user's filesystem credentials, which
        # is also the flush thread (docs/SECURITY.md).
        self.owner = Owner(self.run_as.uid, self.run_as.gid, tuple(self.run_as.groups)) if self.run_as else None
        self.files = UserThread(self.owner, name="memprof-files")
        self._seq = 0
        self._flushing: Future | None = None
        self._interrupted = False
        self._stop_requested = False
        self._cpu_marks: list[int] = []  # the process CPU clock at the loop's start and the tree's exit

    # ---- entry points ----
    def run(self) -> RecordResult:
        req = self.request
        if (req.command is None) == (req.pid is None):
            raise UsageError("give either a command (after --) or --pid", "memprof record -- python train.py  |  memprof record --pid 4242")
        require_recording_privileges()
        # The target's executables and libraries are read for their symbols, which go into
        # the owner's recording: read them as the owner (symbols/files.py), on a thread of
        # their own (`files` writes the flushes, which the symbolizing main loop must not wait
        # behind). Root itself reads them as root.
        opener = UserThread(self.owner, name="memprof-target-files") if self.owner is not None else None
        target_files.read_target_files_with(opener)
        try:
            return self._run_checked()
        finally:
            target_files.read_target_files_with(None)
            if opener is not None:
                opener.close()

    def _run_checked(self) -> RecordResult:
        req = self.request
        if req.command is not None:
            path = resolve_executable(req.command)
            self.source.command_path = path  # its Python environment tells where torch lives
            self.source.command_run_as = self.run_as  # ... asked as the user the command runs as
            self._check_output_free()
            return self._record_command(path)
        self._check_pid(req.pid)
        self._check_pid_is_users(req.pid)
        self._check_output_free()
        return self._record_pid(req.pid)

    def _check_output_free(self) -> None:
        """Before anything starts: an existing -o path needs --force (checked as the user:
        root does not tell the user what exists where they cannot look)."""
        out = self.request.output
        if out is not None and self.files.run(os.path.lexists, out) and not self.request.force:
            from memprof.recording.writer import existing_output_error, why_not_replaceable
            owner_uid = self.owner.uid if self.owner else os.geteuid()
            raise existing_output_error(out, self.files.run(why_not_replaceable, out, owner_uid))

    @staticmethod
    def _check_pid(pid: int) -> None:
        if pid <= 0 or not pid_alive(pid):
            raise TargetError(f"no running process with pid {pid}", "check the pid with `ps`")
        if pid == os.getpid():
            raise TargetError("memprof cannot record itself", "give the pid of another process")

    def _check_pid_is_users(self, pid: int) -> None:
        """Under sudo, `--pid` reaches only the invoking user's own processes (real,
        effective and saved uid all theirs, as ptrace asks): a site that allows `sudo
        memprof` does not thereby let every user watch everyone's memory (docs/SECURITY.md)."""
        if self.run_as is None:
            return
        uids = process_uids(pid)
        if uids is None:
            raise TargetError(f"no running process with pid {pid}", "check the pid with `ps`")
        if set(uids) != {self.run_as.uid}:
            raise TargetError(
                f"pid {pid} runs as uid {'/'.join(map(str, uids))}, not as you (uid {self.run_as.uid}): "
                "under sudo, memprof attaches only to your own processes",
                "record it as its owner, or as root itself (not through sudo)")

    def _record_command(self, path: str) -> RecordResult:
        self._begin_loading()
        native_env = self._choose_native_probes()
        self.source.start([])
        self.child = GatedChild(self.request.command, path, self.run_as)
        try:
            self.source.track(self.child.pid, before_exec=True)
            self._open_writer(self.request.command[0], self.child.pid)
        except BaseException:
            self.child.abort()
            self.source.stop()
            raise
        with _BlockedSignals():
            try:
                self.child.release({**self._agent_env(), **native_env})
            except TargetError:
                self._abandon("the command could not be executed: nothing of it ran")
                raise
            self._begin_recording()
            return self._loop(root=self.child.pid)

    def _choose_native_probes(self) -> dict[str, str]:
        """With the native family on: give the command memprof's LD_PRELOAD interposer
        (memprof/preload) where `record --native-probes` and preload.why_not() allow, else
        probe libc with uprobes. Returns the variables the command's environment needs ({}
        for uprobes); meta.json's sources.ebpf.detail.native_probes says which, and why not
        the interposer. UsageError when --native-probes preload cannot be had."""
        options = self.source.options
        if "native" not in options.families:
            return {}
        uid = self.owner.uid if self.owner is not None else os.geteuid()  # the command's user
        library = preload.library_path()
        asked = _asked_for_uprobes(options)  # the options' own reason: no warning for it
        why = asked or preload.why_not(os.environ, uid, library,
                                       can_read=lambda path: self.files.run(preload.opens, path))
        if why is not None:
            if options.native_probes == preload.PRELOAD:
                raise UsageError(f"--native-probes preload: {why}", "fix that, or record with --native-probes uprobes")
            self.source.stats.detail["native_probes"] = {"via": preload.UPROBES, "why_not_preload": why}
            if asked is None:
                self.on_notice(f"native: probing libc with uprobes, which cost several times more, because {why}")
            return {}
        options.native_preload = str(library)
        self.source.stats.detail["native_probes"] = {"via": preload.PRELOAD, "library": str(library)}
        return preload.child_env(library, options.native_sample_bytes)

    def _begin_loading(self) -> None:
        self._loading_since = time.monotonic()
        self.on_phase(Phase(LOADING))

    def _begin_recording(self) -> None:
        self.on_phase(Phase(RECORDING, seconds=time.monotonic() - self._loading_since))

    def _agent_env(self) -> dict[str, str]:
        """Variables that start memprof's agent in the command's Python processes. None when
        the agent is off, or when a folder on the way to its code could be written by someone
        other than root and the command's user, or its folder cannot be made: a note in
        meta.json and a warning say so (memprof/sources/agent_reader/folder.py)."""
        from memprof.sources.agent_reader.folder import unsafe_ancestor
        if not self.request.agent.enabled:
            return {}
        uid = self.owner.uid if self.owner is not None else os.geteuid()  # the command's user
        why = unsafe_ancestor(self.writer.path, uid)
        try:
            if why is None:
                agent = AgentSource(self.writer.path, self.request.agent, agent_uid=uid)
                agent.prepare(self.files)
                self.agent = agent
                return agent.child_env()
        except OSError as e:
            why = f"its folder could not be made ({e.strerror or e})"
        text = (f"memprof's agent was not started: {why}; another user could change the code it would run in the "
                "command. Training steps, marks and the CUDA history are not recorded (eBPF layers are); record "
                "into a folder that only you and root can write to")
        self.writer.meta.notes.append(text)
        self.on_notice(text)
        return {}

    def _attach_agents(self, pids: list[int]) -> None:
        """`--pid`: reach the agents of processes that opted in (memprof.agent.install();
        memprof/sources/agent_reader/attach.py: only verified agents of the recording's user are
        signalled); say which Python processes have none (their steps and CUDA history are
        not seen), and which were not reached, and why."""
        from memprof.sources.agent_reader.attach import NoAgent, Refused
        if not self.request.agent.enabled:
            return
        self.agent = AgentSource(self.writer.path, self.request.agent)
        without = []
        for pid in pids:
            try:
                self.agent.attach(pid, self.files, self.owner)
            except NoAgent:
                if python_file_in_maps(self.source.processes.maps_of(pid)):
                    without.append(pid)
            except Refused as e:
                if python_file_in_maps(self.source.processes.maps_of(pid)):
                    self.writer.meta.notes.append(str(e))
            except (OSError, MemprofError) as e:
                self.agent.note(f"could not reach the agent of pid {pid}: {e}")
        if without:
            self.writer.meta.notes.append(
                f"no memprof agent in Python process(es) {', '.join(map(str, without))}: training steps and the "
                "CUDA caching-allocator history are not recorded (eBPF layers are); to have them on attach, run "
                "`import memprof.agent; memprof.agent.install()` in the program")

    def _ingest_agent(self) -> None:
        """What the agents wrote since the last flush: marks, steps, CUDA history."""
        if self.agent is None:
            return
        self._append_agent_rows(self.agent.poll(self.writer.meta.clock_anchors[-1]))

    def _drain_agent(self) -> None:
        """At the end: what the agents wrote that the last polls left for later (a poll's
        bounds, sources/agent_reader/source.py), read by a few more; the rest is counted."""
        if self.agent is None:
            return
        for tables in self.agent.drain(self.writer.meta.clock_anchors[-1]):
            self._append_agent_rows(tables)

    def _note_agent_never_started(self) -> None:
        """`record -- CMD`: torch ran in the command's tree, yet no agent wrote a line. Its
        Python ignored PYTHONPATH, through which the agent starts (-I, -E, or an environment
        of its own): steps, marks, model state and the CUDA history are missing, which a
        report would otherwise not say."""
        if self.child is None or self.agent is None or self.agent.heard_from_any():
            return
        torch_pids = self.source.processes.pids_mapping("libtorch_python.so")
        if torch_pids:
            self.writer.meta.notes.append(
                f"memprof's agent did not start in the Python process(es) that imported torch "
                f"({', '.join(map(str, torch_pids[:8]))}{', …' if len(torch_pids) > 8 else ''}): training steps, "
                "marks, model state and the CUDA caching-allocator history are not recorded (eBPF layers are). "
                "The agent starts through PYTHONPATH, which `python -I` or `-E`, or an environment of the "
                "program's own, leaves out; run Python without them, or call `import memprof.agent; "
                "memprof.agent.install()` in the program")

    def _append_agent_rows(self, tables) -> None:
        """A poll's samples, and its (events, stacks, frames) tables unless None."""
        samples = self.agent.take_samples()
        if samples["ts_ns"]:
            self.writer.append("samples", samples)
        if tables is None:
            return
        events, stacks, frames = tables
        rows = len(events["ts_ns"])
        if rows:
            events["seq"] = range(self._seq, self._seq + rows)
            self._seq += rows
            self.writer.append("events", events)
        self._append_chains(stacks, frames)

    def _append_chains(self, stacks: dict, frames: dict) -> None:
        """New rows of the stacks and frames tables, from a source's interner (either may be empty)."""
        if len(stacks["stack_id"]):
            self.writer.append("stacks", stacks)
        if len(frames["frame_id"]):
            self.writer.append("frames", frames)
            self._frames += len(frames["frame_id"])

    def _abandon(self, why: str) -> None:
        """Finalize a recording that never began (so no half-written one is left behind)."""
        self.source.stop()
        self.writer.meta.notes.append(why)
        self.files.run(self.writer.finalize, time.monotonic_ns())

    def _record_pid(self, pid: int) -> RecordResult:
        if "native" in self.source.options.families:
            self.source.stats.detail["native_probes"] = {
                "via": preload.UPROBES, "why_not_preload": "attached to a running process (--pid): its libraries are loaded"}
        tree = descendants(pid)
        self._begin_loading()
        self.source.start(tree)
        self._open_writer(read_comm(pid) or "pid", pid)
        self._attach_agents(tree)
        with _BlockedSignals():
            self._begin_recording()
            return self._loop(root=pid)

    def _open_writer(self, name: str, pid: int) -> None:
        from memprof.recording.writer import RecordingWriter
        req = self.request
        # Absolute: the agent's folder inside it goes on the command's PYTHONPATH, and a
        # relative entry there would follow the command into any folder it changes to.
        out = Path(os.path.abspath(req.output or default_output(name, pid, tag=req.output_tag)))
        meta = RecordingMeta(
            memprof_version=__version__, command=req.command, pid=pid, host=req.host or platform.node(),
            kernel=platform.release(), start_ns=self._start_ns(), clock_anchors=[anchor()],
            sources={self.source.name: self.source.stats},
        )
        owner_uid = self.owner.uid if self.owner else os.geteuid()
        self.writer = self.files.run(RecordingWriter, out, meta, force=req.force, owner_uid=owner_uid,
                                     read_back=bool(req.max_size_bytes))
        self._fold_origin_ns = meta.start_ns  # for the --max-size compactor, made at the first flush

    def _compactor_now(self) -> Compactor | None:
        """On `files`: the --max-size compactor (None without --max-size), made at its first
        use, off the way to the command (issue 24: start-up)."""
        if self.compactor is None and self.request.max_size_bytes:
            from memprof.capture.compactor import Compactor
            self.compactor = Compactor(self.writer, self.request.max_size_bytes, origin_ns=self._fold_origin_ns)
        return self.compactor

    def _start_ns(self) -> int:
        """The recording's start: when the source began to follow the target (its events are
        no older), or now where it follows none yet."""
        since = self.source.tracking_since_ns
        return since if since is not None else time.monotonic_ns()

    # ---- the loop ----
    def _loop(self, root: int) -> RecordResult:
        self._cpu_marks = [time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)]  # meta.recorder_cpu_ns
        _yield_to_target()  # before the sampler thread starts: it inherits it
        self.files.run(_yield_to_target)  # the file thread runs already
        self.source.prefetch_kernel_symbols()  # for the first flush, at SCHED_BATCH like the rest
        self.sampler.pids = (root,)
        self.sampler.start()
        start = time.monotonic()
        deadline = start + self.request.duration_s if self.request.duration_s else None
        next_flush = next_status = start
        tree_gone_at = None
        barrier = None
        write_error = None
        try:
            last_free = start
            self._ingest()  # at once: what the target did since its release (a dlopen to probe, say)
            while True:
                self._wait_signal(POLL_S if tree_gone_at is None else _teardown_wait_s(
                    time.monotonic(), last_free, barrier.ended_s if barrier is not None else None))
                now = time.monotonic()
                stopping = self._stop_requested or (deadline is not None and now >= deadline)
                # The ring is drained at each poll; its events are decoded for the flush (or
                # the stop) that comes next, not each 20 ms: see DECODE_MAX_RECORDS.
                self._ingest(decode=now >= next_flush or stopping)
                last_free = _last_held_free(last_free, self.source.last_held_free_ns)
                # The exit is looked for before the status line and the flush: the barrier and
                # the detach then begin at once, not after a flush's symbolizing (31 ms in a
                # `record -- true`, bench/RESULTS.md), and the teardown ends that much sooner.
                if tree_gone_at is None and not stopping and self._tree_exited(root):
                    tree_gone_at = _tree_exit_time(now, self.source.last_exit_ns())
                    barrier = self._begin_teardown()
                if now >= next_status:
                    self._report_status(now - start)
                    next_status = now + 0.25
                if now >= next_flush and self._flush():
                    next_flush = now + FLUSH_S
                if stopping:
                    if tree_gone_at is None:
                        self.on_phase(Phase(STOPPING, why="interrupted" if self._stop_requested else "--duration reached"))
                    break
                if tree_gone_at is not None and _teardown_over(
                        now - tree_gone_at, now - last_free, barrier is not None and barrier.drained_by(now)):
                    self._note_teardown(barrier, time.monotonic() - tree_gone_at)
                    break
        except RecordingWriteError as e:
            write_error = e
            self.on_notice(f"{e.message}; recording stopped, the command runs on and memprof waits for it")
        finally:
            write_error = self._finish() or write_error
        status = self._wait_child_after_recording()
        self._keep_exit_status(status)
        self.files.close()
        if write_error is not None:
            raise write_error
        meta = self.writer.meta
        return RecordResult(self.writer.path, status, self.source.stats.events, meta.lost_events, meta.missed_events,
                            self._interrupted, int(meta.folds[-1].get("n", len(meta.folds))) if meta.folds else 0,
                            self.compactor.final_bytes if self.compactor else 0, self.request.max_size_bytes,
                            bool(self.compactor and self.compactor.said_over))

    def _begin_teardown(self) -> RcuBarrier | None:
        """The tree has exited: say so, ask for the barrier, detach the probes only its
        processes reach, and mark the recorder's CPU clock. Returns the barrier (see
        _begin_rcu_barrier)."""
        why = "the command exited" if self.child else "the process exited"
        self.on_phase(Phase(STOPPING, seconds=TEARDOWN_MAX_S, why=why))
        barrier = self._begin_rcu_barrier()
        self.source.detach_process_probes()  # the kernel's last frees still come through kmem
        self._cpu_marks.append(time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID))
        return barrier

    def _begin_rcu_barrier(self) -> RcuBarrier | None:
        """The rcu_barrier() that lets the teardown wait for the kernel's deferred frees rather
        than for silence; None where no kernel allocation is recorded."""
        return RcuBarrier() if self.source.options.enabled("kmem") else None

    def _note_teardown(self, barrier: RcuBarrier | None, exit_to_stop_s: float) -> None:
        """meta.teardown: how the wait after the tree's exit went."""
        self.writer.meta.teardown = {**(barrier.detail() if barrier is not None else {}),
                                     "exit_to_stop_s": round(exit_to_stop_s, 4)}

    def _tree_exited(self, root: int) -> bool:
        if self.child is not None:
            if self.child.poll() is None:
                return False
        elif pid_alive(root):
            return False
        return not [p for p in self.source.live_tgids() if pid_alive(p)]

    def _wait_signal(self, timeout_s: float) -> None:
        signo = self._take_signal(timeout_s)
        if signo in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._interrupted = True
            self._stop_requested = True

    def _take_signal(self, timeout_s: float) -> int | None:
        """Wait up to `timeout_s` for a signal, or for the command's exit; pass a signal on to
        the command (unless the terminal sent it, which reached the command already). Returns
        it; None for SIGCHLD, the exit or a timeout. A signal another thread was handed (see
        _BlockedSignals) comes first, and is not passed on: who sent it cannot be told there."""
        if _QUEUED_SIGNALS:
            return _QUEUED_SIGNALS.pop(0)
        wake_fd = self.child.exit_fd() if self.child is not None else None
        info = _next_signal(FORWARDED_SIGNALS + (signal.SIGCHLD,), timeout_s, wake_fd)
        if info is None or info.si_signo == signal.SIGCHLD:
            return None
        if self.child is not None and info.si_code != _SI_KERNEL:
            self.child.signal(info.si_signo)
        return info.si_signo

    def _ingest(self, decode: bool = True) -> int:
        """Decoded events of the ring buffer into the writer; returns how many. `decode`
        False: the source may keep what it drained undecoded for a later call."""
        batch = self.source.poll(decode)
        if batch is None or batch.rows == 0:
            return 0
        cols = batch.columns
        cols["seq"] = range(self._seq, self._seq + batch.rows)
        self._seq += batch.rows
        if self.live is not None:
            self.live.update(cols)
        self.writer.append("events", cols)
        return batch.rows

    def _flush(self) -> bool:
        """Hand buffered rows to the flush thread; False while the previous flush still runs.

        Parts are compressed and written on another thread (pyarrow releases the GIL), so
        the kernel's ring buffer keeps being drained meanwhile. `meta` is only changed here,
        while no flush is in flight."""
        if self._flushing is not None:
            if not self._flushing.done():
                return False
            self._collect_flush()
        self._prepare_flush()
        self._flushing = self.files.submit(self._write_and_fold)
        return True

    def _write_and_fold(self) -> None:
        """On `files`: write the flush, then fold old events if --max-size asks (the main loop
        changes `meta` only once this is done, see _flush)."""
        self.writer.flush()
        if self._compactor_now() is not None:
            self.compactor.after_flush()

    def _prepare_flush(self) -> None:
        self.source.periodic()
        self.sampler.pids = tuple(self.source.live_tgids())
        samples = self.sampler.take_rows()
        if samples["ts_ns"]:
            self.writer.append("samples", samples)
        self._ingest_agent()
        self._append_chains(*self.source.drain_stack_tables())
        meta = self.writer.meta
        meta.sources[self.source.name] = self.source.update_stats()
        meta.sources["samplers"] = self.sampler.stats()
        if self.agent is not None:
            meta.sources[self.agent.name] = self.agent.stats()
        meta.note_clock_anchor(anchor())
        meta.processes = self.source.processes.summary()
        meta.exits = self.source.exits()

    def _collect_flush(self) -> None:
        future, self._flushing = self._flushing, None
        try:
            future.result()
        except OSError as e:
            raise _write_error(self.writer.path, e) from e

    def _report_status(self, elapsed: float) -> None:
        events = self.source.stats.events
        rate = events / elapsed if elapsed > 0 else 0.0
        live = dict(self.live.bytes_by_layer) if self.live is not None else {}
        self.on_status(Status(elapsed, events, rate, live, self.source.stats.lost, self.writer.path))

    def _finish(self) -> RecordingWriteError | None:
        """Whatever stopped us (tree exited, duration, Ctrl-C, an error): finalize. A write
        error (disk full) is returned, not raised: the command must still be waited for, and
        the recording on disk stays readable up to its last complete part."""
        error = None
        try:
            if self._flushing is not None:
                self._collect_flush()
            self.sampler.stop()
            self._ingest()
            self._drain_agent()
            self._note_agent_never_started()
            self._prepare_flush()
            self.on_phase(Phase(FINALIZING, frames=self._frames))
        except RecordingWriteError as e:
            error = e
        finally:
            meta = self.writer.meta
            meta.end_ns = time.monotonic_ns()
            meta.recorder_cpu_ns = _cpu_phases(self._cpu_marks)
            meta.recorder_peak_rss_bytes = own_peak_rss_bytes()
            meta.note_clock_anchor(anchor())
            if self.child is not None:
                meta.exit_status = self.child.poll()
            if self._interrupted:
                meta.notes.append("recording stopped by a signal (Ctrl-C)")
            self.source.stop()
            try:
                self.files.run(self._finalize_files, meta.end_ns)
            except OSError as e:
                error = error or _write_error(self.writer.path, e)
        return error

    def _finalize_files(self, end_ns: int) -> None:
        """On `files`: finalize the recording; then, under --max-size, say if it ended over
        the limit (capture/compactor.py)."""
        self.writer.finalize(end_ns)
        if self.agent is not None:
            self.agent.mark_closed()  # an attached process, or a command that runs on, writes no more
        if self._compactor_now() is not None and self.compactor.at_end():
            self.writer.rewrite_meta()

    def _keep_exit_status(self, status: int | None) -> None:
        """The command's exit status, known only once it was waited for (after a Ctrl-C it
        is still exiting when the recording is finalized), into meta.json."""
        if status is None or status == self.writer.meta.exit_status or not self.writer.finalized:
            return
        self.writer.meta.exit_status = status
        try:
            self.files.run(self.writer.rewrite_meta)
        except OSError as e:
            self.on_notice(f"could not write the command's exit status {status} into {self.writer.path}: {e.strerror or e}")

    def _wait_child_after_recording(self) -> int | None:
        """The recording is safe on disk; a command still running is the user's job: wait for it."""
        if self.child is None:
            return None
        with _BlockedSignals():
            while self.child.poll() is None:
                self._take_signal(0.2)
        return self.child.status



def _write_error(path: Path, e: OSError) -> RecordingWriteError:
    return RecordingWriteError(f"cannot write the recording {path}: {e.strerror or e}",
                               "free disk space or choose another -o path; what was written so far is kept and opens")


# Signals a thread other than the main one was handed while _BlockedSignals was in force
# (queued by _queue_signal, taken first by Session._take_signal).
_QUEUED_SIGNALS: list[int] = []


def _queue_signal(signo, frame) -> None:
    _QUEUED_SIGNALS.append(signo)


class _BlockedSignals:
    """Signals are taken synchronously with sigtimedwait in the loop, never by handlers, so
    a Ctrl-C cannot interrupt a flush halfway.

    Blocking is per thread, and the kernel hands a process's signal to any thread that does
    not block it: OpenBLAS starts one at numpy's import, before this block. CPython then runs
    the Python-level handler in the main thread at its next instruction — by default a
    KeyboardInterrupt in the middle of a flush (seen: `record --pid` stopped by SIGINT while
    busy exited 130), or, for SIGTERM and SIGHUP, memprof killed with the recording unfinished.
    So, while blocked, the handlers only queue the signal for the loop."""

    def __enter__(self):
        self._old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS + (signal.SIGCHLD,))
        self._old_handlers = {signo: signal.signal(signo, _queue_signal) for signo in FORWARDED_SIGNALS}
        return self

    def __exit__(self, *exc):
        for signo, handler in self._old_handlers.items():
            signal.signal(signo, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        return False
