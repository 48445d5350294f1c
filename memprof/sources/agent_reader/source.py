"""The torch agent's source: what memprof's agent writes inside Python targets, onto the timeline.

`record -- CMD` copies the agent's boot folder (memprof/agent/boot/) into the recording's
`agent/` folder — owned by the user the command runs as, who may not read memprof's own
install; see agent_folder.py for how it is made safe — and hands the command PYTHONPATH and
MEMPROF_AGENT_* variables (`child_env`), all absolute. Every Python process of the tree then
starts the agent when it imports torch; each writes JSON lines into `agent/<pid>.jsonl` (see
memprof_agent.py). At every flush this source reads the lines added since the last one
(complete lines only) and turns them into event rows: step and mark rows now
(CLOCK_MONOTONIC already: the agent stamps time.monotonic_ns(); a `memprof.mark` that counts
the steps gives a step row and a row with its label), CUDA caching-allocator
history through memprof/sources/torch_import/snapshot.py, with its epoch times converted once here
through the clock anchors. Failures the agent logged go to meta.json, never to the target.

The folder is the target user's, and the recorder reads it as root: every file is opened
relative to a fd of the folder with O_NOFOLLOW|O_NONBLOCK, and only a regular file of the
agent's uid is read (a FIFO, symlink, device or someone else's file is skipped and counted
in `skipped_files`); every line is checked (agent_lines.py), and one that cannot be used is
skipped and counted (`unreadable_lines`: not JSON; `malformed_lines`: fields wrong).
What root reads at one poll is bounded (MAX_READ_BYTES a file, MAX_POLL_BYTES in all, from
MAX_FILES files); the rest waits for the next poll, which begins where this one stopped, so
every file has its turn. After the command's exit up to MAX_FINAL_POLLS more polls read what
the last ones left (drain()), and what is left even then is counted (`unread_bytes_at_end`).
"""
from __future__ import annotations

import bisect
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from memprof.model import ClockAnchor, SourceStats
from memprof.model.schema import MARK_LABELS, QUANTITY_DEVICE, QUANTITY_PREFIX, STATE_PREFIX, TENSOR_PREFIX, Action, Layer, Mark
from memprof.asuser import Owner, UntrustedFileError, UserThread, open_untrusted_regular
from memprof.sources.agent_reader import attach as agent_attach
from memprof.sources.agent_reader import lines as agent_lines
from memprof.sources.agent_reader import modules as agent_modules
from memprof.sources.agent_reader.folder import absolute_boot_path, make_attach_folder, make_boot_folder

AGENT_FOLDER = "agent"
CLOSED = "closed"  # the agent's name for it (memprof_agent.CLOSED): the recording has ended
MAX_ERRORS_KEPT = 20
MAX_READ_BYTES = 16 << 20   # of one file at one poll; the rest comes at the next
# Of all files at one poll, and how many files are looked at: the command writes this folder,
# and each file's limit alone let hard links (or many files) multiply what root reads and
# parses at a poll (an audit: 12 links to one 16 MiB file took the recorder to 1.6 GB).
MAX_POLL_BYTES = 32 << 20
MAX_FILES = 4096
# Polls drain() makes after the command's exit for what the last poll left for later: up to
# this many times MAX_POLL_BYTES more (the lines' rows wait in memory for the last flush).
MAX_FINAL_POLLS = 4
MAX_PROCESSES_KEPT = 4096   # processes described in meta.json


@dataclass
class AgentOptions:
    """`profile_steps`: (first, last) steps of a torch.profiler window, or None; `drain_s`:
    seconds between drains of the CUDA history; `cuda_max_entries`: its ring buffer's size;
    `torch_modules`: record every nn.Module forward (which module runs on each thread), not
    only the outermost ones."""

    enabled: bool = True
    profile_steps: tuple[int, int] | None = None
    drain_s: float = 2.0
    cuda_max_entries: int = 100_000
    torch_modules: bool = False


@dataclass
class AgentSource:
    """Reads the agent's files under `<recording>/agent/` (`recording`: an absolute path).
    `agent_uid`: the uid the agents run as, the only owner whose files are read. Use:
    prepare() → child_env() (or attach()) → poll()… → stats()."""

    recording: Path
    options: AgentOptions = field(default_factory=AgentOptions)
    agent_uid: int = field(default_factory=os.geteuid)
    name: str = "agent"
    _offsets: dict = field(default_factory=dict)    # file name -> bytes read
    _poll_budget: int = MAX_POLL_BYTES               # bytes left to read at this poll
    _resume_at: str = ""                            # the file the next poll begins with (names in order, wrapping)
    _left_lines: bool = False                       # the last poll left lines it saw for a later one
    _drained: bool = False                          # drain() ran: the command has exited
    _cut: set = field(default_factory=set)          # files whose read stopped inside an overlong line
    _skipped: set = field(default_factory=set)      # names of files not read (not the agent's regular files)
    _errors: list = field(default_factory=list)     # failures the agents logged, the first MAX_ERRORS_KEPT
    _stats: SourceStats = field(default_factory=lambda: SourceStats(timestamp_precision_ns=1))
    _processes: dict = field(default_factory=dict)  # pid -> what the agent said of itself
    _cuda_state: object = None  # torch_trace.LiveTraces: ids and mapped pages across polls
    _attach_folder_made: bool = False
    _samples: dict = field(default_factory=lambda: _no_samples())  # quantities since take_samples()
    _module_paths: agent_modules.ModulePaths = field(default_factory=lambda: agent_modules.ModulePaths())

    @property
    def folder(self) -> Path:
        return Path(self.recording) / AGENT_FOLDER

    def __post_init__(self):
        from memprof.sources.torch_import.snapshot import LiveTraces
        self._cuda_state = LiveTraces()
        self._stats.detail.update(unreadable_lines=0, malformed_lines=0, skipped_files=0, failures=0)

    def prepare(self, files: UserThread) -> None:
        """Create agent/ and agent/boot/ with copies of the boot files on `files`, the thread
        with the credentials of the command's user (see agent_folder.py). Raises OSError."""
        make_boot_folder(files, self.folder)

    def child_env(self, environ: dict | None = None) -> dict[str, str]:
        """The variables that make the command's Python processes start the agent (absolute
        paths, symlinks resolved: a relative one would follow a process that changes folder)."""
        environ = os.environ if environ is None else environ
        boot = absolute_boot_path(self.folder)
        path = environ.get("PYTHONPATH")
        return {
            "PYTHONPATH": boot + (os.pathsep + path if path else ""),
            "MEMPROF_AGENT_DIR": os.path.dirname(boot),
            "MEMPROF_AGENT_OPTIONS": json.dumps(self._agent_options()),
        }

    def _agent_options(self) -> dict:
        options = {"drain_s": self.options.drain_s, "cuda_max_entries": self.options.cuda_max_entries,
                   "torch_modules": self.options.torch_modules}
        if self.options.profile_steps:
            options["profile_steps"] = list(self.options.profile_steps)
        return options

    def attach(self, pid: int, files: UserThread, owner: Owner | None) -> None:
        """`record --pid`: have `pid`'s agent, if the process opted in beforehand
        (`memprof.agent.install()`), record into this recording (agent_attach.py: the
        protocol). `files`: the thread with the recording owner's credentials; `owner`: that
        user (None: root's own recording). Raises agent_attach.NoAgent (none waits),
        agent_attach.Refused (why it is not reached), or OSError."""
        pidfd = agent_attach.open_process(pid)
        try:
            target = agent_attach.read_target(pid)
            why = agent_attach.may_attach(target, owner)
            if why:
                raise agent_attach.Refused(why)
            self._attach_checked(target, pidfd, files)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        self._stats.detail.setdefault("attached", []).append(pid)

    def _attach_checked(self, target: agent_attach.Target, pidfd: int | None, files: UserThread) -> None:
        if not target.handles_attach_signal:
            raise agent_attach.NoAgent(f"pid {target.pid} has no {agent_attach.ATTACH_SIGNAL.name} handler")
        with UserThread(target.owner, name="memprof-target-files") as as_target:
            folder_fd = agent_attach.find_agent_folder(as_target, target)
            try:
                self._make_folder_for(target, files)
                agent_attach.send_request(as_target, folder_fd, {"dir": os.path.realpath(self.folder),
                                                                 "options": self._agent_options()})
            finally:
                os.close(folder_fd)
        agent_attach.signal_agent(target.pid, pidfd, target)

    def _make_folder_for(self, target: agent_attach.Target, files: UserThread) -> None:
        """agent/, the first time: writable by the target's user only (given to them by
        fchown when the recording is root's and the target is not). Later targets must be
        that same user. Raises OSError (FileExistsError: something is at agent/ already)."""
        if not self._attach_folder_made:
            mine = files.owner.uid if files.owner is not None else os.geteuid()
            chown_to = None if mine == target.owner.uid else (target.owner.uid, target.owner.gid)
            make_attach_folder(files, self.folder, chown_to)
            self._attach_folder_made = True
            self.agent_uid = target.owner.uid
        elif self.agent_uid != target.owner.uid:
            raise agent_attach.Refused(f"the agent of pid {target.pid} was not reached: it runs as uid "
                                       f"{target.owner.uid}, and the recording's agent folder is uid {self.agent_uid}'s")

    def mark_closed(self) -> None:
        """Tell the agents the recording has ended: an empty agent/closed (the agent's CLOSED),
        made relative to agent/'s fd, never through a symlink; the agents stop writing at
        their next flush. Called on the thread with the recording owner's credentials, once
        the last lines were read. Nothing where there is no agent folder."""
        try:
            folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.close(os.open(CLOSED, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=folder))
        except OSError:
            pass  # there already, or the folder is not writable: the agent writes on, unread
        finally:
            os.close(folder)

    # ---- reading ----
    def poll(self, anchor: ClockAnchor) -> tuple[dict, dict, dict] | None:
        """Rows added since the last poll: (events, stacks, frames) columns, or None.
        Epoch times (CUDA history, profiler windows) go onto CLOCK_MONOTONIC through `anchor`
        (the recording's latest clock anchor). Never raises for what is in the files."""
        rows = AgentRows(anchor.realtime_ns - anchor.monotonic_ns, self._cuda_state)
        for record in self._new_records():
            try:
                self._take(record, rows)
            except agent_lines.BadLine:
                self._count("malformed_lines")
        if not rows.count:
            return None
        self._stats.events += rows.count
        return rows.tables()

    def _count(self, counter: str, n: int = 1) -> None:
        self._stats.detail[counter] = self._stats.detail.get(counter, 0) + n

    def _take(self, record, rows: "AgentRows") -> None:
        """One parsed line into `rows` or the stats, once checked. Raises agent_lines.BadLine."""
        kind = agent_lines.kind(record)
        if kind in ("step", "mark"):
            ts_ns, pid, tid, label, step = agent_lines.mark_fields(record)
            if kind == "step":
                rows.mark(ts_ns, pid, tid, Mark.STEP.value, step)
                self._take_step_source(pid, agent_lines.step_source(record))
            if kind == "mark" or label:  # memprof.mark("epoch 1") that began a step: its label too
                rows.mark(ts_ns, pid, tid, user_label(label), step)
        elif kind == "tensor":
            rows.tensor(agent_lines.tensor_fields(record))
        elif kind == "values":
            self._take_values(*agent_lines.values_fields(record))
        elif kind == "model_state":
            rows.model_state(*agent_lines.model_state_fields(record))
        elif kind == "modules":
            self._take_modules(record, rows)
        elif kind == "cuda_trace":
            device, pid, entry = agent_lines.cuda_trace_fields(record)
            rows.cuda_trace(entry, device, pid)
        elif kind == "info":
            self._take_info(*agent_lines.info_fields(record))
        elif kind == "allocator_settings":
            self._stats.detail["allocator_settings"] = agent_lines.settings_fields(record)
        elif kind == "profile":
            self._stats.detail.setdefault("profiles", []).append(agent_lines.profile_name(record))
        else:
            raise agent_lines.BadLine("no known kind")

    def _take_modules(self, record: dict, rows: "AgentRows") -> None:
        """A `modules` record: its module boundaries as mark rows (agent_modules), all or
        none; calls the agent did not keep are counted in `module_calls_dropped`."""
        ts_ns, pid, tid, paths, spans, dropped = agent_lines.modules_fields(record)
        try:
            marks = agent_modules.boundaries(spans, self._module_paths.learn(pid, paths))
        except agent_modules.UnknownPath as e:
            raise agent_lines.BadLine(str(e)) from None
        for ts, category in marks:
            rows.mark(ts, pid, tid, category, None)
        if dropped:
            self._count("module_calls_dropped", dropped)

    def _take_step_source(self, pid: int, source: str | None) -> None:
        """meta.json's `step_sources`: what counts each process's steps (the latest source
        that began one: forwards until an optimizer, profiler or mark takes over)."""
        if source and source not in ("start", "attach"):
            sources = self._stats.detail.setdefault("step_sources", {})
            if str(pid) in sources or len(sources) < MAX_PROCESSES_KEPT:
                sources[str(pid)] = source

    def _take_values(self, ts_ns: int, pid: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._samples["ts_ns"].append(ts_ns)
            self._samples["metric"].append(QUANTITY_PREFIX + name)
            self._samples["device"].append(QUANTITY_DEVICE)
            self._samples["value"].append(value)

    def take_samples(self) -> dict:
        """The quantities read by the polls since the last call, as `samples` columns (metric
        quantity:NAME, device "", the value at ts_ns: memprof.mark's keywords, and each
        outermost forward's batch, seq_len and tokens)."""
        samples, self._samples = self._samples, _no_samples()
        return samples

    def _take_info(self, pid: int, info: dict) -> None:
        if pid in self._processes or len(self._processes) < MAX_PROCESSES_KEPT:
            self._processes.setdefault(pid, {}).update(info)

    def heard_from_any(self) -> bool:
        """Whether any agent wrote a file this source read."""
        return bool(self._offsets)

    def drain(self, anchor: ClockAnchor):
        """After the command's exit: the rows of what the agents wrote since the last poll and
        of what that poll left for later (its bounds), one poll's worth at a time, up to
        MAX_FINAL_POLLS polls: the first always (the last poll may have found the file short
        of a bound, and the process wrote on until its exit), the others while a poll left
        lines. What the last leaves even so is counted, from then on, by stats()
        (`unread_bytes_at_end`). Yields poll()'s tables."""
        self._drained = True
        for n in range(MAX_FINAL_POLLS):
            if n and not self._left_lines:
                return
            tables = self.poll(anchor)
            if tables is not None:
                yield tables

    def _new_records(self, errors_only: bool = False):
        """Parsed JSON values of the lines added to the agents' files since the last call,
        within one poll's bounds (module docstring), from where the last poll stopped;
        failures' lines (<pid>.errors.jsonl) are gathered on the way (only they, with
        `errors_only`, which leaves the polls' turn as it was)."""
        folder = self._open_folder()
        if folder is None:
            return
        self._poll_budget = MAX_POLL_BYTES
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".jsonl"))
            if errors_only:
                order = [name for name in names if name.endswith(".errors.jsonl")]
            else:
                order = _beginning_with(names, self._resume_at)
                self._left_lines, self._resume_at = False, ""
            for n, name in enumerate(order):
                if n == MAX_FILES:
                    self._stopped_at(name, errors_only)
                    break
                lines = self._read_new_lines(folder, name)
                if name.endswith(".errors.jsonl"):
                    self._take_errors(lines)
                else:
                    yield from self._parsed(lines)
                if self._poll_budget <= 0:  # this one may have more: it begins the next poll
                    self._stopped_at(name, errors_only)
                    break
        finally:
            os.close(folder)

    def _stopped_at(self, name: str, errors_only: bool) -> None:
        """This poll stopped at its bounds: the next one begins with `name`."""
        if not errors_only:
            self._left_lines, self._resume_at = True, name

    def _unread_bytes(self) -> int:
        """Bytes of the agent's files (those read) past what was read of them."""
        folder = self._open_folder()
        if folder is None:
            return 0
        try:
            total = 0
            for name, offset in self._offsets.items():
                try:
                    total += max(0, os.stat(name, dir_fd=folder, follow_symlinks=False).st_size - offset)
                except OSError:
                    pass
            return total
        finally:
            os.close(folder)

    def _open_folder(self) -> int | None:
        """An fd of agent/, if it is a real folder of the agent's uid (not a symlink put in its place)."""
        try:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == self.agent_uid:
            return fd
        os.close(fd)
        return None

    def _parsed(self, lines: list[bytes]):
        for line in lines:
            if not line.strip():
                continue
            try:
                yield agent_lines.parse(line)
            except agent_lines.BadLine:
                self._count("unreadable_lines")

    def _read_new_lines(self, folder: int, name: str) -> list[bytes]:
        """The complete lines of `name` after what was read before (at most MAX_READ_BYTES
        this time); [] when the file is not the agent's regular file (counted once). A line
        longer than MAX_READ_BYTES is skipped and counted as unreadable."""
        try:
            fd = open_untrusted_regular(name, dir_fd=folder, owner_uid=self.agent_uid)
            if os.fstat(fd).st_nlink != 1:  # the agent never links its files: one file's lines, read twice
                os.close(fd)
                raise UntrustedFileError(f"{name} has other links")
        except UntrustedFileError:
            if name not in self._skipped:
                self._skipped.add(name)
                self._count("skipped_files")
            return []
        start = self._offsets.get(name, 0)
        want = min(MAX_READ_BYTES, self._poll_budget)
        try:
            data = os.pread(fd, want, start) if want > 0 else b""
        except OSError:
            return []
        finally:
            os.close(fd)
        self._poll_budget -= len(data)
        if len(data) == MAX_READ_BYTES:  # a file's own bound: it may have more, for the next poll
            self._left_lines = True
        return self._complete_lines(name, start, data)

    def _complete_lines(self, name: str, start: int, data: bytes) -> list[bytes]:
        end = data.rfind(b"\n") + 1  # complete lines only: the agent may be mid-write
        if end == 0 and len(data) == MAX_READ_BYTES:  # no line end in a whole read: an overlong line
            end = len(data)
            if name not in self._cut:
                self._count("unreadable_lines")
            self._cut.add(name)
            self._offsets[name] = start + end
            return []
        lines = data[:end].splitlines()
        if name in self._cut and lines:  # the rest of the overlong line read before
            self._cut.discard(name)
            lines = lines[1:]
        self._offsets[name] = start + end
        return lines

    def _take_errors(self, lines: list[bytes]) -> None:
        for line in filter(bytes.strip, lines):
            try:
                error = agent_lines.error_fields(agent_lines.parse(line))
            except agent_lines.BadLine:
                self._count("unreadable_lines")
                continue
            self._count("failures")
            if len(self._errors) < MAX_ERRORS_KEPT:
                self._errors.append(error)

    def note(self, text: str) -> None:
        self._stats.detail.setdefault("notes", []).append(text)

    def stats(self) -> SourceStats:
        """What the agents said: processes, failures (the first few, with where), settings,
        and what was not read (`skipped_files`, `unreadable_lines`, `malformed_lines`, and after
        drain() `unread_bytes_at_end`)."""
        for _ in self._new_records(errors_only=True):  # failures logged since; records wait for poll()
            pass
        self._stats.detail["processes"] = {str(pid): info for pid, info in sorted(self._processes.items())}
        self._stats.detail["failures_first"] = list(self._errors)
        if self._drained and self._left_lines:  # as of the last poll, which may follow drain()
            self._stats.detail["unread_bytes_at_end"] = self._unread_bytes()
        self._stats.enabled = self.options.enabled
        return self._stats


class AgentRows:
    """Event rows built from agent records (columns of the events table, no `seq`), and the
    CUDA history entries gathered for torch_snapshot's converter."""

    def __init__(self, realtime_offset_ns: int, cuda_state=None):
        """`realtime_offset_ns`: CLOCK_REALTIME − CLOCK_MONOTONIC (ns), from a clock anchor."""
        self.realtime_offset_ns = realtime_offset_ns
        self.cuda_state = cuda_state
        self._tensors: list[tuple] = []
        self.count = 0
        self._marks: list[tuple] = []
        self._cuda: list[tuple[int, int, dict]] = []  # (device, pid, entry)

    def mark(self, ts_ns: int, pid: int, tid: int, label: str, step: int | None) -> None:
        self._marks.append((ts_ns, pid, tid, label, step))
        self.count += 1

    def tensor(self, record: dict) -> None:
        """A profiler-window tensor allocation (agent_lines.tensor_fields): a `mark` row in
        its layer, at its address, `category` = "tensor:<role>", its chain = the operator that
        made it. timeline() hands the role to the allocation another source recorded at that
        address (within 1 ms)."""
        device = record["device"]
        layer = Layer.TORCH_CPU.value if device == "cpu" else Layer.CUDA_BLOCK.value
        op = record["op"]
        stack_id = None
        if op and self.cuda_state is not None:
            stack_id = self.cuda_state.interner.intern([{"filename": None, "line": None, "name": op}])
        ts = record["epoch_ns"] - self.realtime_offset_ns
        self._tensors.append((ts, record["pid"], record["tid"], layer, record["addr"], record["size"], device,
                              f"{TENSOR_PREFIX}{record['role']}", stack_id, record["step"]))
        self.count += 1

    def model_state(self, ts_ns: int, pid: int, tid: int, tensors: list[tuple[str, str, int, int, str]]) -> None:
        """Model-state notes (agent_lines.model_state_fields): `mark` rows in the tensor's
        layer at its data pointer, category "state:ROLE:NAME"; timeline() hands that to the
        allocation live there."""
        for role, name, ptr, size, device in tensors:
            layer = Layer.TORCH_CPU.value if device == "cpu" else Layer.CUDA_BLOCK.value
            self._tensors.append((ts_ns, pid, tid, layer, ptr, size, device, f"{STATE_PREFIX}{role}:{name}", None, None))
            self.count += 1

    def cuda_trace(self, entry: dict, device: int, pid: int) -> None:
        self._cuda.append((device, pid, entry))
        self.count += 1

    def epoch_us_to_ns(self, epoch_us: float) -> int:
        """CUDA history times (epoch µs) → CLOCK_MONOTONIC ns."""
        return int(epoch_us * 1000) - self.realtime_offset_ns

    def tables(self) -> tuple[dict, dict, dict]:
        events = _mark_columns(self._marks)
        events = _joined(events, _tensor_columns(self._tensors))
        stacks: dict = {"stack_id": [], "depth": [], "frame_id": []}
        frames: dict = {"frame_id": [], "kind": [], "function": [], "module": [], "file": [], "line": []}
        if self._cuda:
            from memprof.sources.torch_import.snapshot import agent_trace_tables
            cuda_events, stacks, frames = agent_trace_tables(self._cuda, self.epoch_us_to_ns, self.cuda_state)
            events = _joined(events, cuda_events)
        elif self._tensors and self.cuda_state is not None:
            stacks, frames = self.cuda_state.interner.drain_tables()
        return events, stacks, frames


def user_label(label: str | None) -> str:
    """The label a user's mark is stored under: its own ("mark" when it has none), or, for a
    label that memprof's own marks use ("exit", "exec", "step"), that label with " (mark)"
    added, so that `memprof.mark("exit")` neither ends the process's allocations nor counts
    a step in the analyses."""
    label = label or "mark"
    return f"{label} (mark)" if label in MARK_LABELS else label


def _no_samples() -> dict:
    return {"ts_ns": [], "metric": [], "device": [], "value": []}


def _joined(a: dict, b: dict) -> dict:
    return {k: list(a[k]) + list(b[k]) for k in a}


def _tensor_columns(tensors: list[tuple]) -> dict:
    n = len(tensors)
    return {
        "ts_ns": [t[0] for t in tensors], "layer": [t[3] for t in tensors], "action": [Action.MARK.value] * n,
        "addr": [t[4] for t in tensors], "size_bytes": [t[5] for t in tensors], "requested_bytes": [None] * n,
        "device": [t[6] for t in tensors], "pid": [t[1] for t in tensors], "tid": [t[2] for t in tensors],
        "stack_id": [t[8] for t in tensors], "alloc_id": [None] * n, "step": [t[9] for t in tensors],
        "category": [t[7] for t in tensors], "weight": [None] * n,
    }


def _mark_columns(marks: list[tuple]) -> dict:
    return {
        "ts_ns": [m[0] for m in marks],
        "layer": [None] * len(marks),
        "action": [Action.MARK.value] * len(marks),
        "addr": [0] * len(marks),
        "size_bytes": [None] * len(marks),
        "requested_bytes": [None] * len(marks),
        "device": ["cpu"] * len(marks),
        "pid": [m[1] for m in marks],
        "tid": [m[2] for m in marks],
        "stack_id": [None] * len(marks),
        "alloc_id": [None] * len(marks),
        "step": [m[4] for m in marks],
        "category": [m[3] for m in marks],
        "weight": [None] * len(marks),
    }


def _beginning_with(names: list[str], first: str) -> list[str]:
    """`names` (sorted) in turn from the first that is not before `first`, wrapping round."""
    at = bisect.bisect_left(names, first)
    return names[at:] + names[:at]
