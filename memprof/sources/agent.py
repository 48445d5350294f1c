"""The torch agent's source: what memprof's agent writes inside Python targets, onto the timeline.

`record -- CMD` copies the agent's boot folder (memprof/agent/boot/) into the recording's
`agent/` folder — owned by the user the command runs as, who may not read memprof's own
install — and hands the command PYTHONPATH and MEMPROF_AGENT_* variables (`child_env`).
Every Python process of the tree then starts the agent when it imports torch; each writes
JSON lines into `agent/<pid>.jsonl` (see memprof_agent.py). At every flush this source reads
the lines added since the last one (complete lines only) and turns them into event rows:
step and mark rows now (CLOCK_MONOTONIC already: the agent stamps time.monotonic_ns()),
CUDA caching-allocator history through memprof/sources/torch_snapshot.py, with its epoch
times converted once here through the clock anchors. Failures the agent logged go to
meta.json, never to the target.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from memprof.model import ClockAnchor, SourceStats
from memprof.model.schema import Action, Layer, Mark

# `category` of a profiler-window tensor annotation: "tensor:parameter", "tensor:activation", …
TENSOR_PREFIX = "tensor:"

AGENT_FOLDER = "agent"
BOOT_FILES = ("sitecustomize.py", "memprof_agent.py")
MAX_ERRORS_KEPT = 20


def boot_dir() -> Path:
    from memprof.agent import BOOT
    return Path(BOOT)


@dataclass
class AgentOptions:
    """`profile_steps`: (first, last) steps of a torch.profiler window, or None; `drain_s`:
    seconds between drains of the CUDA history; `cuda_max_entries`: its ring buffer's size."""

    enabled: bool = True
    profile_steps: tuple[int, int] | None = None
    drain_s: float = 2.0
    cuda_max_entries: int = 100_000


@dataclass
class AgentSource:
    """Reads the agent's files under `<recording>/agent/`. Use: prepare() → child_env() →
    poll()… → stats()."""

    recording: Path
    options: AgentOptions = field(default_factory=AgentOptions)
    name: str = "agent"
    _offsets: dict = field(default_factory=dict)    # file name -> bytes read
    _stats: SourceStats = field(default_factory=lambda: SourceStats(timestamp_precision_ns=1))
    _processes: dict = field(default_factory=dict)  # pid -> what the agent said of itself
    _cuda_state: object = None  # torch_trace.LiveTraces: ids and mapped pages across polls

    @property
    def folder(self) -> Path:
        return Path(self.recording) / AGENT_FOLDER

    def __post_init__(self):
        from memprof.sources.torch_snapshot import LiveTraces
        self._cuda_state = LiveTraces()

    def prepare(self, uid: int | None = None, gid: int | None = None) -> None:
        """Create agent/ with a copy of the boot files, owned by the command's user."""
        boot = self.folder / "boot"
        boot.mkdir(parents=True, exist_ok=True)
        for name in BOOT_FILES:
            shutil.copyfile(boot_dir() / name, boot / name)
        if uid is not None:
            for path in (self.folder, boot, *(boot / n for n in BOOT_FILES)):
                os.chown(path, uid, gid if gid is not None else -1)

    def child_env(self, environ: dict | None = None) -> dict[str, str]:
        """The variables that make the command's Python processes start the agent."""
        environ = os.environ if environ is None else environ
        boot = str(self.folder / "boot")
        path = environ.get("PYTHONPATH")
        options = {"drain_s": self.options.drain_s, "cuda_max_entries": self.options.cuda_max_entries}
        if self.options.profile_steps:
            options["profile_steps"] = list(self.options.profile_steps)
        return {
            "PYTHONPATH": boot + (os.pathsep + path if path else ""),
            "MEMPROF_AGENT_DIR": str(self.folder),
            "MEMPROF_AGENT_OPTIONS": json.dumps(options),
        }

    def attach(self, pid: int) -> bool:
        """`record --pid`: signal `pid`'s agent, if the process opted in beforehand
        (`memprof.agent.install()` left its ready file), to record into this recording.
        False when it has no agent."""
        import signal
        import tempfile
        base = os.path.join(tempfile.gettempdir(), f"memprof-agent-{pid}")
        if not os.path.exists(base + ".ready"):
            return False
        uid, gid = _owner(pid)
        self.prepare(uid, gid)
        request = base + ".request.json"
        options = json.loads(self.child_env({})["MEMPROF_AGENT_OPTIONS"])
        with open(request, "w") as f:
            json.dump({"dir": str(self.folder), "options": options}, f)
        os.chown(request, uid, gid)
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            return False
        self._stats.detail.setdefault("attached", []).append(pid)
        return True

    # ---- reading ----
    def poll(self, anchor: ClockAnchor) -> tuple[dict, dict, dict] | None:
        """Rows added since the last poll: (events, stacks, frames) columns, or None.
        Epoch times (CUDA history, profiler windows) go onto CLOCK_MONOTONIC through `anchor`
        (the recording's latest clock anchor)."""
        records = list(self._new_records())
        if not records:
            return None
        rows = AgentRows(anchor.realtime_ns - anchor.monotonic_ns, self._cuda_state)
        for record in records:
            self._take(record, rows)
        self._stats.events += rows.count
        return rows.tables()

    def _take(self, record: dict, rows) -> None:
        kind = record.get("kind")
        if kind in ("step", "mark"):
            label = Mark.STEP.value if kind == "step" else str(record.get("label") or "mark")
            rows.mark(int(record["ts_ns"]), int(record.get("pid", 0)), int(record.get("tid", 0)),
                      label, record.get("step"))
        elif kind == "tensor":
            rows.tensor(record)
        elif kind == "cuda_trace":
            rows.cuda_trace(record.get("entry") or {}, int(record.get("device", 0)), int(record.get("pid", 0)))
        elif kind == "info":
            self._processes.setdefault(int(record.get("pid", 0)), {}).update(
                {k: v for k, v in record.items() if k not in ("kind", "pid")})
        elif kind == "allocator_settings":
            self._stats.detail["allocator_settings"] = record.get("settings")
        elif kind == "profile":
            self._stats.detail.setdefault("profiles", []).append(record.get("path"))

    def _new_records(self):
        folder = self.folder
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.jsonl")):
            if path.name.endswith(".errors.jsonl"):
                continue
            yield from self._read_new_lines(path)

    def _read_new_lines(self, path: Path):
        start = self._offsets.get(path.name, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # complete lines only: the agent may be mid-write
        self._offsets[path.name] = start + end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                self._stats.detail["unreadable_lines"] = self._stats.detail.get("unreadable_lines", 0) + 1
                continue
            if isinstance(record, dict):
                yield record

    def note(self, text: str) -> None:
        self._stats.detail.setdefault("notes", []).append(text)

    def stats(self) -> SourceStats:
        """What the agents said: processes, failures (the first few, with where), settings."""
        self._stats.detail["processes"] = {str(pid): info for pid, info in sorted(self._processes.items())}
        errors = self._errors()
        self._stats.detail["failures"] = len(errors)
        self._stats.detail["failures_first"] = errors[:MAX_ERRORS_KEPT]
        self._stats.enabled = self.options.enabled
        return self._stats

    def _errors(self) -> list[dict]:
        found = []
        for path in sorted(self.folder.glob("*.errors.jsonl")) if self.folder.is_dir() else []:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                found.append({"pid": e.get("pid"), "where": e.get("where"), "error": e.get("error")})
        return found


def _owner(pid: int) -> tuple[int, int]:
    """(uid, gid) a process runs as, from /proc (effective ids)."""
    uid = gid = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[2])
            elif line.startswith("Gid:"):
                gid = int(line.split()[2])
    return uid, gid


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

    def mark(self, ts_ns: int, pid: int, tid: int, label: str, step) -> None:
        self._marks.append((ts_ns, pid, tid, label, None if step is None else int(step)))
        self.count += 1

    def tensor(self, record: dict) -> None:
        """A profiler-window tensor allocation: a `mark` row in its layer, at its address,
        `category` = "tensor:<role>", its chain = the operator that made it. timeline() hands
        the role to the allocation another source recorded at that address (within 1 ms)."""
        device = str(record.get("device") or "cpu")
        layer = Layer.TORCH_CPU.value if device == "cpu" else Layer.CUDA_BLOCK.value
        op = record.get("op")
        stack_id = None
        if op and self.cuda_state is not None:
            stack_id = self.cuda_state.interner.intern([{"filename": None, "line": None, "name": str(op)}])
        ts = int(record["epoch_ns"]) - self.realtime_offset_ns
        self._tensors.append((ts, int(record.get("pid", 0)), int(record.get("tid", 0)), layer,
                              int(record.get("addr", 0)), int(record.get("size", 0)), device,
                              f"{TENSOR_PREFIX}{record.get('role') or 'unknown'}", stack_id, record.get("step")))
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
            from memprof.sources.torch_snapshot import agent_trace_tables
            cuda_events, stacks, frames = agent_trace_tables(self._cuda, self.epoch_us_to_ns, self.cuda_state)
            events = _joined(events, cuda_events)
        elif self._tensors and self.cuda_state is not None:
            stacks, frames = self.cuda_state.interner.drain_tables()
        return events, stacks, frames


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
