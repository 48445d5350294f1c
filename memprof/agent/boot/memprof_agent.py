"""memprof's agent inside a Python target: what only PyTorch knows, onto memprof's timeline.

Started by sitecustomize.py (beside this file) once the process imports torch, or by hand
for `record --pid` (`import memprof.agent; memprof.agent.install()`). Standalone on purpose:
the target's interpreter may be another Python than memprof's, with only the standard
library and torch.

What it records, as JSON lines in $MEMPROF_AGENT_DIR/<pid>.jsonl (one file per process):
  {"kind": "step", "ts_ns", "pid", "tid", "step", "source"}   a step began (source: below)
  {"kind": "mark", "ts_ns", "pid", "tid", "step", "label"}    memprof.mark(label)
  {"kind": "values", "ts_ns", "pid", "tid", "values": {NAME: number}}   quantities at that
       moment: memprof.mark(label, tokens=…)'s, and each outermost forward's first tensor
       input's batch and seq_len, with `tokens`, the seq_len summed over those forwards
       since the last prompt (a forward of several tokens: a new sequence)
  {"kind": "model_state", "ts_ns", "pid", "tid", "tensors": [[role, name, data_ptr,
       bytes, device], …]}   the tensors that are model state (parameters, buffers,
       gradients, optimizer state) of the modules seen and the optimizers hooked, at each
       step and before exit, only those new or changed since the last record
  {"kind": "modules", "ts_ns", "pid", "tid", "paths": {index: path}, "spans": [[index,
       enter_ns, exit_ns], …], "dropped"?}   when an outermost nn.Module forward ends: each
       module call inside it (itself included, path ""; in the order they began), with the
       instance paths (`transformer.h.3.attn`) not named in an earlier record of the process;
       `dropped`: calls past MAX_SPANS, not kept. Only with the option torch_modules
       (`record --torch-modules`): it costs a small training step ~3%
  {"kind": "cuda_trace", "device", "entry"}                   one entry of the CUDA caching
       allocator's history (torch.cuda.memory._record_memory_history), drained every
       MEMPROF_AGENT_DRAIN_S seconds and at exit
  {"kind": "allocator_settings", …}, {"kind": "info", …}, {"kind": "profile", …}
and failures in <pid>.errors.jsonl. Lines are buffered in the process and written every
FLUSH_S (0.5 s) and at exit, so a crash loses at most that much. Times are time.monotonic_ns(): CLOCK_MONOTONIC, the
clock of memprof's eBPF events. Nothing is written anywhere else; the target is never
stopped by a failure here.

Steps: the first of these sources that fires becomes the step clock of the process — an
optimizer's step() (a global post-hook), torch.profiler's profile.step(), or memprof.mark()
when nothing else counts steps; the others still leave mark events. When none of them has
fired, each outermost nn.Module forward on a thread is a step (a global forward pre-hook at
depth 0 → 1): in `generate`, one decode step, one token; the first of the others to fire
then takes over from the forwards (an optimizer or profiler also quiets the forward hooks:
see _quiet_forwards).
"""
import atexit
import functools
import json
import math
import os
import sys
import threading
import time
import traceback
import weakref

_lock = threading.Lock()
_state = {"installed": False, "step": 0, "step_source": None, "file": None, "cuda_last": {},
          "track_modules": False}


# Where a process sits in a distributed job, by launcher: (variable, field) pairs, first found
# wins per field. torchrun (and torch.distributed.launch) set RANK, LOCAL_RANK, WORLD_SIZE;
# Slurm's srun SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS; Open MPI OMPI_COMM_WORLD_*; MPICH
# and Intel MPI PMI_*, PMIx PMIX_RANK; MVAPICH MV2_COMM_WORLD_*.
RANK_VARIABLES = (
    ("RANK", "rank"), ("LOCAL_RANK", "local_rank"), ("WORLD_SIZE", "world_size"),
    ("LOCAL_WORLD_SIZE", "local_world_size"), ("GROUP_RANK", "node_rank"),
    ("SLURM_PROCID", "rank"), ("SLURM_LOCALID", "local_rank"), ("SLURM_NTASKS", "world_size"),
    ("SLURM_NODEID", "node_rank"),
    ("OMPI_COMM_WORLD_RANK", "rank"), ("OMPI_COMM_WORLD_LOCAL_RANK", "local_rank"),
    ("OMPI_COMM_WORLD_SIZE", "world_size"),
    ("PMI_RANK", "rank"), ("PMI_SIZE", "world_size"), ("PMIX_RANK", "rank"),
    ("MV2_COMM_WORLD_RANK", "rank"), ("MV2_COMM_WORLD_LOCAL_RANK", "local_rank"), ("MV2_COMM_WORLD_SIZE", "world_size"),
)
JOB_VARIABLES = (("SLURM_JOB_ID", "job_id"), ("TORCHELASTIC_RUN_ID", "job_id"))


def placement(environ=None):
    """This process's place in a distributed job, from its launcher's variables: rank,
    local_rank, world_size, local_world_size, node_rank (ints), job_id, the launcher's
    variable the rank came from (`rank_from`), and the host. Only what is set and valid."""
    environ = os.environ if environ is None else environ
    found = {}
    for variable, name in RANK_VARIABLES:
        value = environ.get(variable, "").strip()
        if name not in found and value.isdigit() and len(value) < 10:
            found[name] = int(value)
            if name == "rank":
                found["rank_from"] = variable
    for variable, name in JOB_VARIABLES:
        value = environ.get(variable, "").strip()
        if name not in found and value and len(value) <= 128:
            found[name] = value
    found["host"] = os.uname().nodename[:255]  # what gethostname() returns; the recorder's meta.host too (platform.node())
    return found


def _dir():
    """The agent folder ("": none), cached: read on every write. _attach_now changes it."""
    directory = _state.get("dir")
    if directory is None:
        directory = _state["dir"] = os.environ.get("MEMPROF_AGENT_DIR", "")
    return directory


def _options():
    """MEMPROF_AGENT_OPTIONS, parsed once."""
    if "options" not in _state:
        try:
            _state["options"] = json.loads(os.environ.get("MEMPROF_AGENT_OPTIONS", "{}"))
        except ValueError:
            _state["options"] = {}
    return _state["options"]


# ---- writing ----
# Records are kept as dicts and serialized by a daemon thread every FLUSH_S, and at exit: a
# write (a syscall, and kernel allocations memprof itself records) per training step would
# cost the target more than the step marks are worth, and so would JSON-encoding in the
# training thread (~2 µs a step, several times that with the loop's caches cold). A crash
# loses at most FLUSH_S of marks.
FLUSH_S = 0.5
_pending = []


def _pid():
    """This process's pid, cached: os.getpid() is a system call, and a step mark must cost
    the training loop next to nothing. Refreshed in a forked child (_after_fork)."""
    pid = _state.get("pid")
    if pid is None:
        pid = _state["pid"] = os.getpid()
    return pid


def _after_fork():
    """In a forked child: its own pid, and none of the parent's pending records (the parent
    writes those); its flusher thread did not survive the fork."""
    _state["pid"] = os.getpid()
    _state["flusher_pid"] = None
    del _pending[:]
    global _paths_lock
    _paths_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    _resend_paths()  # the child's file is new: it has none of the names


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _write(record):
    if not _dir():
        return
    _pending.append(record)
    if _state.get("flusher_pid") != _pid():
        _start_flusher()


def _start_flusher():
    _state["flusher_pid"] = _pid()
    threading.Thread(target=_flush_loop, name="memprof-agent-flush", daemon=True).start()
    if not _state.get("flush_at_exit"):  # marks of a process without torch (no install()) too
        _state["flush_at_exit"] = True
        atexit.register(flush)


def _open_output():
    """This process's file in the current agent folder (reopened after a fork or when a new
    recording attached)."""
    key = (_pid(), _dir())
    if _state["file"] is None or _state.get("file_key") != key:
        _state["file"] = _open_append(os.path.join(_dir(), "%d.jsonl" % _pid()))
        _state["file_key"] = key
    return _state["file"]


def _open_append(path):
    """`path` to append text to: created 0600 if new, never through a symlink or into a FIFO."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        import stat
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("%s is not a regular file" % path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a")
    except BaseException:
        os.close(fd)
        raise


# The file the recorder leaves in the agent folder when its recording ends (AgentSource.
# mark_closed): a `record --pid` that stopped, a `record --duration` whose command runs on.
CLOSED = "closed"


def flush():
    """Write the pending records as JSON lines (called by the flusher thread and at exit).
    Records appended while this runs stay pending for the next flush. Once the recording
    has ended (CLOSED), nothing more is written: _detach."""
    with _lock:
        records = _pending[:]
        if not records or not _dir():  # no recording to write into (any more)
            return
        if os.path.lexists(os.path.join(_dir(), CLOSED)):
            _detach()
            return
        del _pending[:len(records)]  # not `_pending[:] = []`: that would drop a concurrent append
        f = _open_output()
        f.write("".join(_json_line(r) for r in records))
        f.flush()


def _detach():
    """The recording ended: write no more into it (a server attached to wrote ~180 bytes a
    request into a finished recording for as long as it ran, before 2026-12-07). The hooks
    stay, writing nothing, until a new `record --pid` attaches (_attach_now); a process
    forked from now on inherits no folder either. Called with _lock held."""
    del _pending[:]
    _state["dir"] = ""
    os.environ["MEMPROF_AGENT_DIR"] = ""
    if _state["file"] is not None:
        try:
            _state["file"].close()
        except OSError:
            pass
    _state["file"] = _state["file_key"] = None


def _json_line(record):
    """`record` as one JSON line the recorder reads: a string holding a lone surrogate (a
    file name's undecodable bytes, as os.fsdecode gives them) is no text to it, and it
    drops such a line whole, so those characters are written as "\\xff" (or "\\ud800")."""
    line = json.dumps(record, separators=(",", ":"))
    if "\\ud" in line:  # rare: a character past U+FFFF, or a lone surrogate
        line = json.dumps(_storable(record), separators=(",", ":"))
    return line + "\n"


def _storable(value):
    """`value` with every string made UTF-8 text (_storable_text), keys included."""
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable(v) for v in value]
    return value


def _storable_text(text):
    if _is_text(text):
        return text
    return "".join(_escaped(c) if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def _is_text(text):
    """Whether UTF-8 can hold `text`: not when it holds a lone surrogate (os.fsdecode gives
    them for a file name's undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escaped(surrogate):
    code = ord(surrogate)
    return "\\x%02x" % (code - 0xDC00) if 0xDC80 <= code <= 0xDCFF else "\\u%04x" % code


def _flush_loop():
    while True:
        time.sleep(FLUSH_S)
        try:
            flush()
        except Exception as e:
            log_failure("flush", e)


MAX_FAILURES_PER_PLACE = 5  # a hook failing at every step must not fill the disk


def log_failure(where, error):
    """Record a failure inside the agent (never raises): the target goes on. The first
    MAX_FAILURES_PER_PLACE of each place are written; later ones are only counted."""
    try:
        directory = _dir()
        counts = _state.setdefault("failures", {})
        counts[where] = counts.get(where, 0) + 1
        if not directory or counts[where] > MAX_FAILURES_PER_PLACE:
            return
        record = {"ts_ns": time.monotonic_ns(), "pid": os.getpid(), "where": where,
                  "error": "%s: %s" % (type(error).__name__, error),
                  "traceback": traceback.format_exc(limit=8)}
        with _open_append(os.path.join(directory, "%d.errors.jsonl" % os.getpid())) as f:
            f.write(_json_line(record))
    except Exception:
        pass


def _guarded(where):
    """Decorator: a failure in `where` is logged, never raised into the target."""
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                log_failure(where, e)
                return None
        return run
    return wrap


# ---- steps and marks ----

def _event(kind, ts_ns=None, **fields):
    """Write a record of `kind` stamped `ts_ns` (now, by default: CLOCK_MONOTONIC)."""
    record = {"kind": kind, "ts_ns": time.monotonic_ns() if ts_ns is None else ts_ns, "pid": _pid(),
              "tid": threading.get_native_id()}
    record.update(fields)
    _write(record)


FORWARD = "forward"  # the step source of last resort: outermost nn.Module forwards


def _advance(source):
    """A step boundary from `source` (optimizer.step, profiler.step); only the process's
    first step source counts steps (forwards count only until another source fires: then
    the forward hooks go quiet, see _quiet_forwards)."""
    if _state["step_source"] in (None, FORWARD):
        _state["step_source"] = source
        _quiet_forwards()
    if _state["step_source"] != source:
        _event("mark", step=_state["step"], label=source)
        return
    _new_step(source)


def _new_step(source, label=None, ts_ns=None):
    _state["step"] += 1
    fields = {"step": _state["step"], "source": source}
    if label is not None:
        fields["label"] = label
    _event("step", ts_ns, **fields)
    _profile_window_at(_state["step"])
    if _state_walk_due(_state["step"]):
        _write_model_state()


def mark(label="mark", **values):
    """A named moment on the timeline, with numbers (`tokens=512, batch=8`) that `report
    growth --against NAME` can plot memory against. Counts steps too when nothing else does."""
    try:
        # The numbers and the mark share one time: they are the mark's (`report regions`
        # pairs them by it; a checkpoint reads the values at or before its mark).
        now, numbers = time.monotonic_ns(), _numbers(values)
        if numbers:
            _event("values", now, values=numbers)
        if _state["step_source"] in (None, "mark", FORWARD):
            _state["step_source"] = "mark"
            _new_step("mark", str(label), now)
        else:
            _event("mark", now, step=_state["step"], label=str(label))
    except Exception as e:
        log_failure("mark", e)


MAX_VALUES = 16


def _numbers(values):
    """The finite int and float values among `values` (bool is not a number here)."""
    kept = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        kept[str(name)[:64]] = value
        if len(kept) >= MAX_VALUES:
            break
    return kept


# ---- outermost forwards: steps when nothing else counts them, and input sizes ----
_forward = threading.local()  # .depth: nn.Module forwards running on this thread
_modules = weakref.WeakSet()  # modules whose forward was outermost: their state is model state


def _on_forward_pre(module, args):
    """The global forward pre-hook: nothing once the forwards are quiet (_quiet_forwards)."""
    if not _state.get("forwards_quiet"):
        _forward_began(module, args)


def _on_forward(module, args, output):
    """The global forward hook (also when forward raises): nothing once quiet."""
    if not _state.get("forwards_quiet"):
        _forward_ended()


@_guarded("forward pre-hook")
def _forward_began(module, args):
    depth = getattr(_forward, "depth", 0)
    _forward.depth = depth + 1
    if _state["track_modules"]:
        _enter_module(module, depth)
    if depth:
        return
    if module not in _modules:
        _modules.add(module)
        # Named at its first call, not only at the first step: a recording that ends before
        # the first optimizer step (--duration, Ctrl-C, a long first step) still knows the
        # model's weights from a leak. Once per outermost module; its gradients once its
        # first backward has made them.
        _write_model_state()
        _name_first_gradients(module)
    source, now = _state["step_source"], time.monotonic_ns()
    values = _input_sizes(args, source in (None, FORWARD))
    if values:  # stamped with the step's time: its checkpoint reads the values at or before it
        _event("values", now, values=values)
    if source == FORWARD:
        _new_step(FORWARD, ts_ns=now)
    elif source is None:
        _forward_may_count(module, now)


def _forward_may_count(module, now):
    """Forwards become the step clock when the same outermost module runs twice with no
    optimizer, profiler or mark step in between, and no backward either: then its first run
    began step 1 (stamped then) and this one step 2. A training loop's first optimizer step
    comes before its model's second forward, or, with gradient accumulation, a backward
    does (_name_first_gradients sees it): its steps stay the optimizer's, numbered as
    without forwards; `generate` calls its model once a token, under no_grad."""
    first = _state.get("first_forward")
    if _state.get("backward_seen"):
        return
    if first is None:
        _state["first_forward"] = (id(module), now)
    elif first[0] == id(module):
        _state["step_source"] = FORWARD
        _new_step(FORWARD, ts_ns=first[1])
        _new_step(FORWARD, ts_ns=now)


@_guarded("forward hook")
def _forward_ended():
    depth = _forward.depth = max(0, getattr(_forward, "depth", 1) - 1)
    if _state["track_modules"]:
        _exit_module(depth)


def _input_sizes(args, counting=True):
    """{batch, seq_len, tokens} of the first tensor input of an outermost forward: its first
    two dimensions (the second only where it is a sequence: _has_sequence), and `tokens`, the seq_len summed over this process's earlier outermost
    forwards since the last one of more than one token (in `generate`: the length of the
    sequence the KV cache holds as this forward begins; a forward of several tokens is a
    prompt, a new sequence whose cache begins empty, so a server's requests each count from
    0; without a cache every forward has the whole sequence, and `tokens` stays 0). Where
    forwards do not count the steps (`counting` False: an optimizer does),
    {batch, seq_len} only, and only when they differ from the last written: a training loop
    of one shape writes them once, not a line per forward."""
    import torch
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        # Called with keywords only (`model(**inputs)`, as `generate` does): a global
        # forward pre-hook sees positional inputs only; Module._call_impl, its caller, holds
        # the keywords.
        kwargs = _call_impl_kwargs(sys._getframe(1))
        first = next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        return {}
    values = {"batch": int(first.shape[0])}
    if _has_sequence(first):
        values["seq_len"] = int(first.shape[1])
    if not counting and values == _state.get("sizes_written"):
        return {}
    _state["sizes_written"] = dict(values)
    if counting and "seq_len" in values:
        values["tokens"] = _state.get("tokens", 0) if values["seq_len"] == 1 else 0
        _state["tokens"] = values["tokens"] + values["seq_len"]
    return values


def _has_sequence(tensor):
    """Whether the tensor's second dimension is a sequence: token ids (batch, seq_len) of an
    integer type, or (batch, seq_len, hidden) and more. A (batch, features) float input, an
    MLP's, has none: its width is no length."""
    return tensor.dim() >= 3 or (tensor.dim() == 2 and not tensor.is_floating_point() and not tensor.is_complex())


def _call_impl_kwargs(frame, up_to=6):
    """The keyword arguments of the nn.Module call running the hooks: Module._call_impl's
    `kwargs`, a few frames up ({} when it is not found)."""
    for _ in range(up_to):
        if frame is None:
            break
        if frame.f_code.co_name == "_call_impl":
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        frame = frame.f_back
    return {}


# ---- which module: the nn.Module instance path running on each thread ----
# Every module call is a span [path index, enter ns, exit ns] (time.monotonic_ns), kept in a
# per-thread list and written as one `modules` record when the thread's outermost forward
# ends: a JSON line (a dict and a pending-list append) per module call would cost a step of
# a 1,000-module model 1,000 records; a span is one small list. Paths are numbered per
# process, and a record carries only the names new since the last one. The paths of an
# outermost module's tree are computed once per root (named_modules(), the root ""), so a
# nested call costs a dict lookup, a clock read and two list appends.
MAX_SPANS = 1 << 18  # spans kept per outermost forward (~30 MB); later ones are counted, not kept
_paths_lock = threading.Lock()
_path_number = {}  # dotted path -> its index in this process's `modules` records
_new_paths = {}  # index -> path, not yet written
_root_paths = weakref.WeakKeyDictionary()  # outermost module -> {id(module): path index}


def _modules_wanted():
    """Whether every module's forward is tracked (MEMPROF_AGENT_OPTIONS' torch_modules; off
    unless asked: examples/train.py's step costs 1.03x with it, the records' writing included)."""
    return bool(_options().get("torch_modules", False))


def _enter_module(module, depth):
    """A module's forward begins on this thread (`depth`: forwards running before it)."""
    f = _forward
    if not depth:
        f.root, f.index, f.open, f.spans, f.dropped = module, _root_index(module), [], [], 0
    elif getattr(f, "root", None) is None:  # tracking began inside this thread's forward (attach)
        return
    elif len(f.spans) >= MAX_SPANS:
        f.dropped += 1
        f.open.append(None)  # keeps the exits paired with their enters
        return
    index = f.index.get(id(module))
    if index is None:
        index = _unlisted(module, f)
    span = [index, time.monotonic_ns(), 0]
    f.open.append(span)
    f.spans.append(span)


def _exit_module(depth):
    """A module's forward ended on this thread; `depth`: forwards still running (0: the
    outermost ended, its record is written)."""
    f = _forward
    open_spans = getattr(f, "open", None)
    if not open_spans:  # hooked in the middle of a forward (record --pid): its enter was not seen
        return
    span = open_spans.pop()
    if span is not None:
        span[2] = time.monotonic_ns()
    if not depth:
        _write_spans(f)


def _write_spans(f):
    """The outermost forward's spans as one `modules` record; spans still open (a forward
    that raised on a torch without always_call) end now."""
    now = time.monotonic_ns()
    for span in f.spans:
        if not span[2]:
            span[2] = now
    fields = {"spans": f.spans}
    if f.dropped:
        fields["dropped"] = f.dropped
    f.spans, f.open, f.root = [], [], None
    with _paths_lock:  # the names go out no later than the first record that uses them
        fields["paths"] = dict(_new_paths)
        _new_paths.clear()
        _event("modules", **fields)


def _root_index(root):
    """{id(module): path index} of every module under `root` (itself ""), computed once per root."""
    index = _root_paths.get(root)
    if index is None:
        index = _root_paths[root] = {id(m): _numbered(name) for name, m in root.named_modules()}
    return index


def _unlisted(module, f):
    """The path index of a module that was not in its root's tree when the tree was named:
    named again once (a submodule added since); one still absent (called from a forward
    without being a submodule) is PARENT.<ClassName>, PARENT the module running around it."""
    _root_paths.pop(f.root, None)
    f.index = _root_index(f.root)
    index = f.index.get(id(module))
    if index is None:
        parent = next((s for s in reversed(f.open) if s is not None), None)
        prefix = _path_name(parent[0]) + "." if parent is not None and _path_name(parent[0]) else ""
        index = f.index[id(module)] = _numbered("%s<%s>" % (prefix, type(module).__name__))
    return index


def _numbered(path):
    with _paths_lock:
        index = _path_number.get(path)
        if index is None:
            index = _path_number[path] = len(_path_number)
            _new_paths[index] = path
        return index


def _path_name(index):
    return next((p for p, i in _path_number.items() if i == index), "")


def _resend_paths():
    """Every path name goes out again with the next record: a new recording (record --pid
    attached) or a forked child's file has not seen them."""
    with _paths_lock:
        _new_paths.update({i: p for p, i in _path_number.items()})


# The warning torch.compile's module gives at every call while any global module hook is
# registered (torch/_dynamo/eval_frame.py, OptimizedModule.__call__): memprof's are, so every
# compiled model warned under memprof of hooks its program never registered.
COMPILE_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def _hook_forwards(torch):
    """The global forward hooks (_on_forward_pre, _on_forward), and torch.compile's warning
    of them kept quiet (COMPILE_HOOKS_WARNING): a program's own global hooks would have
    warned too, and under memprof do not."""
    import warnings
    from torch.nn.modules import module as nn_module
    warnings.filterwarnings("ignore", message=COMPILE_HOOKS_WARNING, category=UserWarning)
    handles = _state.setdefault("forward_hooks", [])
    handles.append(nn_module.register_module_forward_pre_hook(_on_forward_pre))
    try:
        handles.append(nn_module.register_module_forward_hook(_on_forward, always_call=True))  # also when forward raises
    except TypeError:  # a torch without always_call
        handles.append(nn_module.register_module_forward_hook(_on_forward))


def _quiet_forwards():
    """Once an optimizer or torch.profiler counts the steps (and unless every module is
    tracked, record --torch-modules), the forward hooks return at once: their work cost 4 %
    of a millisecond training step (bench/RESULTS.md) for what the first step has already
    given, the outermost modules whose tensors are model state. Input sizes are then no
    longer recorded: memprof.mark(seq_len=…) gives them. The hooks stay registered: torch
    calls a module's forward through a frame of its own (`Module._call_impl.<locals>.inner`)
    while any hook is, and taking them off would split every chain through a module into the
    first step's and the others'."""
    if not _state.get("track_modules"):
        _state["forwards_quiet"] = True


def remove_hooks():
    """Take off the global hooks install() put on torch (tests load the agent many times in
    one process; a program never needs this)."""
    for handle in _state.pop("hooks", []) + _state.pop("forward_hooks", []):
        handle.remove()
    _remove_gradient_hooks()


# ---- model state ----
# Which tensors are the model's own memory: parameters, buffers, gradients and optimizer
# state, by name, so that reports can tell them from leaks. Written at each step and before
# exit, only what is new or changed since the last record (a step of a 100-tensor model
# costs a walk of its tensors, ~100 µs, and a few bytes when nothing changed).
_optimizers = weakref.WeakSet()
_state_written = {}  # (role, name, id(tensor)) -> (data_ptr, bytes, device) last written


def _model_state():
    """[(role, name, data_ptr, bytes, device, key)] of the model state known now; `key`
    tells two tensors of one name apart (see _root_prefix)."""
    tensors, names = [], {}
    modules = list(_modules)
    for module in modules:
        prefix = _root_prefix(module, modules)
        for name, p in module.named_parameters(remove_duplicate=True):
            names[id(p)] = prefix + name
            tensors.append(("parameter", prefix + name, p))
            if p.grad is not None:
                tensors.append(("gradient", prefix + name, p.grad))
        for name, b in module.named_buffers(remove_duplicate=True):
            tensors.append(("buffer", prefix + name, b))
    for optimizer in list(_optimizers):
        for index, (p, slots) in enumerate(optimizer.state.items()):
            base = names.get(id(p), "param%d" % index)
            for key, value in slots.items():
                if hasattr(value, "untyped_storage"):
                    tensors.append(("optimizer_state", "%s.%s" % (base, key), value))
    return [(role, name, *_where(t), id(t)) for role, name, t in tensors]


def _root_prefix(module, roots):
    """'' for the one outermost module of a model called whole (`model(x)`: names read
    `transformer.h.3.attn.c_attn.weight`); its class name where several modules are called
    on their own (`model.fc1(x)`, then `model.fc2(…)`: `Linear.weight`), so a name says
    which kind of module holds it even where no enclosing module was ever called."""
    return "" if len(roots) == 1 else type(module).__name__ + "."


def _where(tensor):
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes(), str(tensor.device)


STATE_WALK_EVERY = 256


def _state_walk_due(step):
    """Whether model state is looked at this step: steps 1, 2, 4, 8, … and every
    STATE_WALK_EVERY-th, then before exit. A model's tensors are made in its first steps
    (optimizer state at the first step) and kept; a walk costs ~100 µs for a few dozen
    tensors, which every step of a millisecond would feel (bench/RESULTS.md). Gradients
    freed and made again each step are named at the steps looked at; the model state's peak
    (the totals reports give) is one of those."""
    return step & (step - 1) == 0 or step % STATE_WALK_EVERY == 0


@_guarded("model state")
def _write_model_state():
    if not _modules and not _optimizers:
        return
    changed = []
    for role, name, ptr, size, device, key in _model_state():
        if ptr and _state_written.get((role, name, key)) != (ptr, size, device):
            _state_written[(role, name, key)] = (ptr, size, device)
            changed.append([role, name, ptr, size, device])
    if changed:
        _event("model_state", tensors=changed)


_gradient_hooks = []  # handles of _name_first_gradients' hooks not yet removed


@_guarded("first gradients")
def _name_first_gradients(module):
    """Walk model state once every parameter of `module` that takes a gradient has one (its
    first backward): gradients are otherwise named at steps, and a recording that ends
    between the first backward and the first optimizer step took them for a leak. One
    post-accumulate-grad hook per parameter, all removed at that walk or at the first
    optimizer step (which walks anyway), whichever comes first: nothing stays on later steps."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params or not hasattr(params[0], "register_post_accumulate_grad_hook"):
        return  # inference, or a torch before 2.1
    waiting = {id(p) for p in params}

    def accumulated(param):
        _state["backward_seen"] = True  # training: forwards are micro-batches, not steps
        waiting.discard(id(param))
        if not waiting:
            _remove_gradient_hooks()
            _write_model_state()

    _gradient_hooks.extend(p.register_post_accumulate_grad_hook(_guarded("gradient hook")(accumulated))
                           for p in params)


def _remove_gradient_hooks():
    while _gradient_hooks:
        _gradient_hooks.pop().remove()


@_guarded("optimizer step hook")
def _on_optimizer_step(optimizer, args, kwargs):
    _remove_gradient_hooks()
    _optimizers.add(optimizer)
    _advance("optimizer.step")


# ---- torch.profiler window (--torch-profile-steps A-B) ----

def _profile_window_at(step):
    window = _options().get("profile_steps")
    if not window or step < window[0] or step > window[1] + 1:
        return
    first, last = window
    try:
        if step == first and _state.get("profiler") is None:
            _start_profiler()
        elif step == last + 1 and _state.get("profiler") is not None:
            _stop_profiler()
    except Exception as e:
        log_failure("profiler window", e)


def _start_profiler():
    import torch
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with_stack = _python_files_are_text()
    if not with_stack:
        log_failure("profiler window", ValueError("a Python file's name is not UTF-8 text: the window is "
                                                  "profiled without Python stacks (with_stack=False)"))
    prof = torch.profiler.profile(activities=activities, profile_memory=True, with_stack=with_stack,
                                  record_shapes=True)
    began = (time.monotonic_ns(), time.time_ns())
    prof.__enter__()
    # Kept only once started: a start that raised (torch cannot encode a frame's file name
    # that is not UTF-8, say) is logged, and its profiler never exited, which killed the
    # program (SIGSEGV) at the window's end.
    _state["profiler"], _state["profiler_began"] = prof, began
    _event("mark", step=_state["step"], label="profiler window start")


def _python_files_are_text():
    """Whether torch.profiler's Python tracer can take every Python file name here: it
    cannot encode one that is not UTF-8 (its bytes read as lone surrogates), and its start
    then fails half done, leaving a tracer installed that crashed the program (SIGSEGV) at
    its next call. The running frames' files and the loaded modules' files are checked."""
    names = [module.__dict__.get("__file__") for module in list(sys.modules.values())]
    for frame in sys._current_frames().values():
        while frame is not None:
            names.append(frame.f_code.co_filename)
            frame = frame.f_back
    return all(_is_text(name) for name in names if isinstance(name, str))


def _stop_profiler():
    prof = _state.pop("profiler")
    prof.__exit__(None, None, None)
    path = os.path.join(_dir(), "%d.profile.%d.json" % (os.getpid(), _state["step"]))
    prof.export_chrome_trace(path)
    _write_tensor_roles(prof)
    _event("mark", step=_state["step"], label="profiler window end")
    _event("profile", path=os.path.basename(path), began_monotonic_ns=_state["profiler_began"][0],
           began_realtime_ns=_state["profiler_began"][1])


def _write_tensor_roles(prof):
    """Each tensor allocation of the window with the operator that made it and the role
    PyTorch's memory profiler gives it (parameter, activation, gradient, …). Uses the
    profiler's private memory-profile API: a torch without it leaves a logged failure."""
    try:
        from torch.profiler._memory_profiler import TensorKey, _EventType
        profile = prof._memory_profile()
        for event in profile._op_tree.dfs():
            if event.typed[0] != _EventType.Allocation:
                continue
            fields = event.typed[1]
            if fields.alloc_size <= 0:
                continue
            key = TensorKey.from_allocation(fields)
            role = profile._categories.get(key, 0) if key is not None else None
            _write({"kind": "tensor", "epoch_ns": event.start_time_ns, "pid": os.getpid(),
                    "tid": threading.get_native_id(), "addr": fields.ptr, "size": fields.alloc_size,
                    "device": str(fields.device), "role": role.name.lower() if role is not None else None,
                    "op": event.parent.name if event.parent is not None else None})
    except Exception as e:
        log_failure("tensor roles", e)


# ---- CUDA caching allocator history ----

def _start_cuda_history(torch):
    if not torch.cuda.is_available():
        return False
    entries = int(_options().get("cuda_max_entries", 100000))
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=entries)
    _write({"kind": "info", "ts_ns": time.monotonic_ns(), "pid": os.getpid(), "cuda_history": True,
            "max_entries": entries, "devices": torch.cuda.device_count()})
    return True


def drain_cuda(snapshot=None):
    """Write the history entries newer than the last drain (per device). `snapshot` is for
    tests: without a GPU, a stand-in snapshot dict (named so in the test) is passed in."""
    try:
        if snapshot is None:
            import torch
            snapshot = torch.cuda.memory._snapshot()
        last = _state["cuda_last"]
        settings = snapshot.get("allocator_settings")
        if settings and not _state.get("settings_written"):
            _write({"kind": "allocator_settings", "ts_ns": time.monotonic_ns(), "pid": os.getpid(), "settings": settings})
            _state["settings_written"] = True
        for device, trace in enumerate(snapshot.get("device_traces") or []):
            # Entries are in time order; several can share a microsecond. Remember the last
            # time written and how many entries at that time were: write only what is newer.
            seen_t, seen_n = last.get(device, (-1, 0))
            at_t = 0
            for entry in trace:
                t = entry.get("time_us", 0)
                if t < seen_t:
                    continue
                at_t = at_t + 1 if t == seen_t else 1
                if t == seen_t and at_t <= seen_n:
                    continue
                _write({"kind": "cuda_trace", "device": device, "pid": os.getpid(), "entry": _plain(entry)})
                seen_t, seen_n = t, at_t
            last[device] = (seen_t, seen_n)
    except Exception as e:
        log_failure("cuda drain", e)


def _plain(entry):
    """A history entry as JSON-safe data (frames as {filename, line, name})."""
    out = {k: v for k, v in entry.items() if k != "frames" and isinstance(v, (int, float, str, bool, type(None)))}
    out["frames"] = [{"filename": f.get("filename"), "line": f.get("line"), "name": f.get("name")}
                     for f in (entry.get("frames") or [])]
    return out


def _drain_loop(period):
    while True:
        time.sleep(period)
        drain_cuda()


# ---- installation ----

def install():
    """Start recording what PyTorch knows (idempotent; never raises)."""
    if _state["installed"] or not _dir():
        return
    _state["installed"] = True
    try:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        _state.setdefault("hooks", []).append(register_optimizer_step_post_hook(_on_optimizer_step))
        _patch_profiler_step(torch)
        _hook_forwards(torch)
        _hook_process_group(torch)
        _state["track_modules"] = _modules_wanted()
        _write(dict({"kind": "info", "ts_ns": time.monotonic_ns(), "pid": os.getpid(), "agent": "installed",
                     "torch": torch.__version__, "python": sys.version.split()[0]}, **placement()))
        _event("step", step=0, source="start")  # step 0: everything before the first step
        atexit.register(flush)  # registered first: runs last, after the final CUDA drain
        atexit.register(_at_exit)
        if _start_cuda_history(torch):
            period = float(_options().get("drain_s", 2.0))
            threading.Thread(target=_drain_loop, args=(period,), name="memprof-agent-drain", daemon=True).start()
            atexit.register(drain_cuda)
    except Exception as e:
        log_failure("install", e)


def _hook_process_group(torch):
    """Say this process's rank once it joins a process group, where no launcher variable
    said it (placement): torch.multiprocessing.spawn, for one, gives the rank to
    init_process_group itself, and its processes were "no rank" in every report."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or "rank" in placement():
        return
    original = dist.init_process_group
    if getattr(original, "_memprof", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        _say_group_rank(dist)
        return result

    init_process_group._memprof = True
    dist.init_process_group = init_process_group


@_guarded("process group rank")
def _say_group_rank(dist):
    _write({"kind": "info", "ts_ns": time.monotonic_ns(), "pid": os.getpid(), "rank": dist.get_rank(),
            "world_size": dist.get_world_size(), "rank_from": "init_process_group"})


def _patch_profiler_step(torch):
    profile = torch.profiler.profile
    original = profile.step
    if getattr(original, "_memprof", False):
        return

    def step(self, *args, **kwargs):
        try:
            _advance("profiler.step")
        except Exception as e:
            log_failure("profiler step", e)
        return original(self, *args, **kwargs)

    step._memprof = True
    profile.step = step


@_guarded("exit")
def _at_exit():
    if _state.get("profiler") is not None:
        _stop_profiler()
    _write_model_state()


class _TorchWatcher:
    """A sys.meta_path finder that starts the agent right after `torch` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or "torch" in sys.modules:
            return None
        sys.meta_path.remove(self)  # let the normal finders locate torch
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            install()

        loader.exec_module = exec_module
        return spec


# ---- attaching (`memprof record --pid`) ----
# A process opts in with `import memprof.agent; memprof.agent.install()` (no recording yet).
# It makes a private folder, tempfile.mkdtemp(prefix="memprof-agent-<pid>-") (0700, its own
# uid: no one else can put anything in it, and its name cannot be guessed), and writes a
# ready file there naming itself. A `record --pid` that verifies folder and file (see
# memprof/sources/agent_reader/attach.py) writes a request file into the folder, as this process's
# user, and sends ATTACH_SIGNAL; the handler reads the request relative to the folder's fd
# (a regular file of this uid only, no symlink followed) and points the agent at the
# recording. Nothing is ever opened by a predictable name in a shared folder.
ATTACH_SIGNAL = "SIGUSR2"
READY, REQUEST = "ready", "request.json"
MAX_REQUEST_BYTES = 65536
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _start_time():
    """This process's start time in clock ticks after boot (/proc/self/stat, field 22)."""
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[19])


def enable_attach():
    """Wait for a `memprof record --pid` (idempotent; never raises)."""
    try:
        if _state.get("attach_pid") == os.getpid():
            return
        import signal
        import tempfile
        _set_attach_handler(signal)
        folder = tempfile.mkdtemp(prefix="memprof-agent-%d-" % os.getpid())
        fd = os.open(folder, _DIR_FLAGS)
        _state.update(attach_pid=os.getpid(), attach_folder=folder, attach_fd=fd)
        ready = {"pid": os.getpid(), "start_time": _start_time(), "python": sys.version.split()[0]}
        _write_new(READY, json.dumps(ready).encode(), fd)
        atexit.register(_remove_attach_folder)
    except Exception as e:
        log_failure("enable attach", e)


def _set_attach_handler(signal):
    previous = signal.getsignal(getattr(signal, ATTACH_SIGNAL))
    if getattr(previous, "_memprof", False):
        return

    def on_attach(signum, frame):
        _attach_now()
        if callable(previous):
            previous(signum, frame)

    on_attach._memprof = True
    signal.signal(getattr(signal, ATTACH_SIGNAL), on_attach)


def _write_new(name, data, dir_fd):
    fd = os.open(name, _NEW_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_request(dir_fd):
    """The request in the attach folder: a regular file of this process's uid (never a
    symlink, FIFO or another user's file), removed once read. Raises on anything else."""
    import stat
    fd = os.open(REQUEST, _READ_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > MAX_REQUEST_BYTES:
            raise ValueError("the attach request is not a small regular file of uid %d" % os.geteuid())
        data = os.read(fd, MAX_REQUEST_BYTES)
    finally:
        os.close(fd)
        os.unlink(REQUEST, dir_fd=dir_fd)
    wanted = json.loads(data)
    if not isinstance(wanted.get("dir"), str) or not os.path.isabs(wanted["dir"]):
        raise ValueError("the attach request names no absolute folder")
    if not isinstance(wanted.get("options") or {}, dict):
        raise ValueError("the attach request's options are not an object")
    return wanted


def _attach_now():
    try:
        if _state.get("attach_pid") != os.getpid():  # a forked child: the request is its parent's
            return
        wanted = _read_request(_state["attach_fd"])
        flush()  # what was buffered belongs to the previous recording
        os.environ["MEMPROF_AGENT_DIR"] = wanted["dir"]
        _state.pop("dir", None)
        os.environ["MEMPROF_AGENT_OPTIONS"] = json.dumps(wanted.get("options") or {})
        _state.pop("options", None)
        _state["track_modules"] = _state["installed"] and _modules_wanted()
        if _state["track_modules"]:
            _state["forwards_quiet"] = False  # a recording that tracks modules needs the hooks' work
        _resend_paths()
        if _state["installed"]:
            _event("step", step=_state["step"], source="attach")  # the step in progress
        watch_for_torch()
    except Exception as e:
        log_failure("attach", e)


def _remove_attach_folder():
    """At exit: the ready file and the private folder go (not in a forked child: its parent's)."""
    if _state.get("attach_pid") != os.getpid():
        return
    for name in (READY, REQUEST):
        try:
            os.unlink(name, dir_fd=_state["attach_fd"])
        except OSError:
            pass
    try:
        os.rmdir(_state["attach_folder"])
    except OSError:
        pass


def watch_for_torch():
    """Install the agent when this process imports torch (now, if it already has)."""
    if "torch" in sys.modules:
        install()
    elif not any(isinstance(f, _TorchWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchWatcher())
