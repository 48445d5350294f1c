"""The kernel source: kmem tracepoints (slab + page allocator) through eBPF (bcc).

Raw tracepoints (not classic ones: no trace record is built per event) with argument
layouts confirmed against the running kernel's BTF. See bpf/README.md for the cost model
and the trade-offs (stack sampling, address filter for frees)."""
from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import pandas as pd

from memprof.errors import SourceUnavailableError
from memprof.model import Action, Layer, SourceStats
from memprof.model.schema import Mark
from memprof.sources import records as R
from memprof.sources.bpfinfo import prog_stats
from memprof.sources.procs import ProcessTable
from memprof.sources.ringbuf import RingBufferConsumer
from memprof.sources.stacks import StackInterner
from memprof.sources.symbolize import KernelSymbols

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
# Tracepoints we attach when present, with the program for each (see bpf/kmem.bpf.c).
# kmem_cache_alloc's program depends on its prototype (chosen in _plan_attach).
SLAB_TRACEPOINTS = ("kmalloc", "kmalloc_node", "kmem_cache_alloc", "kmem_cache_alloc_node", "kfree", "kmem_cache_free")
PAGE_TRACEPOINTS = ("mm_page_alloc", "mm_page_free", "mm_page_free_batched")
ALL_TRACEPOINTS = SLAB_TRACEPOINTS + PAGE_TRACEPOINTS
_GFP_MOVABLE = 0x08  # ___GFP_MOVABLE_BIT is 3 on every kernel with these tracepoints


@dataclass
class KmemOptions:
    """Tuning of the kernel source. Stacks are taken for one slab allocation in
    `slab_stack_every` and one page allocation in `page_stack_every` (powers of two; 1 =
    every allocation); the others reuse their call site's latest stacks."""

    slab_stack_every: int = 64
    page_stack_every: int = 8
    ringbuf_bytes: int = 128 << 20
    stack_entries: int = 32768
    addr_filter_bits_log2: int = 26
    include_user_pages: bool = False

    def validate(self) -> None:
        from memprof.errors import UsageError
        for name in ("slab_stack_every", "page_stack_every", "ringbuf_bytes"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise UsageError(f"{name.replace('_', '-')} must be a power of two, got {v}")


def tracefs_root() -> str | None:
    for d in TRACEFS_DIRS:
        if os.path.isdir(os.path.join(d, "events", "kmem")):
            return d
    return None


def tracepoint_exists(category: str, name: str) -> bool:
    root = tracefs_root()
    return bool(root) and os.path.isdir(os.path.join(root, "events", category, name))


def tracepoint_has_field(category: str, name: str, field_name: str) -> bool:
    root = tracefs_root()
    try:
        with open(os.path.join(root or "", "events", category, name, "format")) as f:
            return f" {field_name};" in f.read()
    except OSError:
        return False


def bpf_source_dir() -> str:
    return str(resources.files("memprof.bpf"))


@dataclass
class EventBatch:
    """Decoded memory events as columns of the events table (no `seq`: the session adds it)."""

    columns: dict
    rows: int


@dataclass
class KmemSource:
    """Attach, poll, and account for the kernel probes. Use: start(pids) → poll()… → stop()."""

    options: KmemOptions = field(default_factory=KmemOptions)
    name: str = "kmem"

    def __post_init__(self):
        self.processes = ProcessTable()
        self.stats = SourceStats(stack_sample_every=self.options.slab_stack_every)
        self._bpf = None
        self._ring: RingBufferConsumer | None = None
        self._stacks: StackInterner | None = None
        self._attached: list[tuple[str, str]] = []
        self._link_fds: list[int] = []
        self._finalize_probes: set[str] = set()
        self.exit_marks: dict[int, tuple[int, int]] = {}  # tgid -> (ts_ns, why)

    # ---- start ----
    def start(self, pids: list[int]) -> None:
        """Compile, attach, and begin following `pids` and their future descendants."""
        self._bpf = self._compile()
        self._attach_all()
        self._ring = RingBufferConsumer(self._bpf["events"].map_fd, self.options.ringbuf_bytes, R.EVENT_DTYPE)
        # kallsyms is read at the first flush, not here: the command waits for start() to return.
        self._stacks = StackInterner(self._read_stack, self.processes.maps_of, KernelSymbols.load)
        for pid in pids:
            self.track(pid)

    def track(self, pid: int) -> None:
        table = self._bpf["tracked"]
        key = ctypes.c_int(pid >> 6)
        table[key] = ctypes.c_ulonglong(table[key].value | (1 << (pid & 63)))
        self.processes.add(pid, None, None)
        self._refresh_processes(only_stale=True)

    def _compile(self):
        try:
            from bcc import BPF
        except ImportError as e:
            raise SourceUnavailableError("bcc is not importable", "install python3-bpfcc (make setup), and run memprof from a Python that sees it") from e
        if tracefs_root() is None:
            raise SourceUnavailableError("tracefs is not mounted (no kmem tracepoints found)", "mount -t tracefs nodev /sys/kernel/tracing")
        src_dir = bpf_source_dir()
        with open(os.path.join(src_dir, "kmem.bpf.c")) as f:
            text = f.read()
        cflags = [f"-I{src_dir}", *self._cflags()]
        with _captured_stderr() as diagnostics:
            try:
                return BPF(text=text, cflags=cflags)
            except Exception as e:  # bcc raises bare Exception on compile failure
                failure = e
        first_error = next((l for l in diagnostics.text().splitlines() if "error" in l), str(failure))
        raise SourceUnavailableError(f"could not compile the kernel probes: {first_error}",
                                     "run `memprof doctor`: bcc needs kernel headers at /lib/modules/$(uname -r)/build")

    def _cflags(self) -> list[str]:
        from memprof.sources.btf import BtfError, load_cached
        o = self.options
        try:
            btf = load_cached()
            size_off = btf.member_offset("kmem_cache", "size")
            objsize_off = btf.member_offset("kmem_cache", "object_size")
        except BtfError as e:
            raise SourceUnavailableError(f"cannot read struct kmem_cache from BTF: {e.message}", e.hint) from e
        pid_max = int(open("/proc/sys/kernel/pid_max").read())
        skip = 0 if o.include_user_pages else _GFP_MOVABLE
        flags = [
            f"-DRINGBUF_PAGES={o.ringbuf_bytes // mmap.PAGESIZE}",
            f"-DSTACK_ENTRIES={o.stack_entries}",
            f"-DSTACK_SAMPLE_MASK={o.slab_stack_every - 1}",
            f"-DPAGE_STACK_SAMPLE_MASK={o.page_stack_every - 1}",
            f"-DTRACKED_WORDS={pid_max // 64 + 1}",
            f"-DADDR_BITS_LOG2={o.addr_filter_bits_log2}",
            f"-DKMEM_CACHE_SIZE_OFF={size_off}",
            f"-DKMEM_CACHE_OBJSIZE_OFF={objsize_off}",
            f"-DPAGE_SKIP_GFP={skip:#x}",
            f"-DPAGE_SHIFT_BYTES={mmap.PAGESIZE.bit_length() - 1}",
        ]
        if tracepoint_has_field("sched", "sched_process_exit", "group_dead"):
            flags.append("-DHAVE_EXIT_GROUP_DEAD=1")
        return flags

    def _attach_all(self) -> None:
        # bcc's attach_raw_tracepoint allows one program per tracepoint; the free
        # tracepoints take two (main + backup), so attach through libbcc directly.
        from bcc.libbcc import lib
        for tp, fn in plan_attach():
            prog = self._bpf.load_func(fn, self._bpf.RAW_TRACEPOINT)
            fd = lib.bpf_attach_raw_tracepoint(prog.fd, tp.encode())
            if fd < 0:
                raise SourceUnavailableError(f"could not attach to tracepoint kmem:{tp} (error {-fd})", "run `memprof doctor`")
            self._attached.append((tp, fn))
            self._link_fds.append(fd)
        self.stats.detail["tracepoints"] = sorted({tp for tp, _ in self._attached})

    # ---- polling ----
    def poll(self) -> EventBatch | None:
        """Drain the ring buffer: memory events as columns; lifecycle events applied here."""
        recs = self._ring.drain()
        if recs.size == 0:
            return None
        self.stats.events += int(recs.size)
        self._apply_lifecycle(recs)
        return self._decode_memory(recs)

    def _apply_lifecycle(self, recs: np.ndarray) -> None:
        kinds = recs["kind"]
        for r in recs[kinds >= R.PROC_FORK]:  # rare: one Python step each is fine
            kind, pid, ts = int(r["kind"]), int(r["pid"]), int(r["ts_ns"])
            if kind == R.PROC_FORK:
                self.processes.add(pid, int(r["tid"]), ts)
            elif kind == R.PROC_EXEC:
                self.processes.exec_(pid)
            elif kind == R.PROC_EXIT:
                self.processes.exit_(pid, ts)
            elif kind == R.EXIT_MARK and pid not in self.exit_marks:
                self.exit_marks[pid] = (ts, int(r["requested"]))
        if (kinds == R.PROC_EXEC).any() or (kinds == R.PROC_FORK).any():
            self._refresh_processes(only_stale=True)

    def _decode_memory(self, recs: np.ndarray) -> EventBatch:
        """Columns of the events table, built with array operations only."""
        kinds = recs["kind"]
        mem = recs[(kinds <= R.PAGE_FREE) | (kinds == R.EXIT_MARK)]
        k = mem["kind"]
        is_alloc = (k == R.SLAB_ALLOC) | (k == R.PAGE_ALLOC)
        is_mark = k == R.EXIT_MARK
        size = mem["size"].astype(np.int64)
        stack_ids = np.zeros(mem.size, dtype=np.int64)
        stack_ids[is_alloc] = self._stacks.intern(
            mem["kstack_id"][is_alloc], mem["ustack_id"][is_alloc], mem["pid"][is_alloc], mem["call_site"][is_alloc])
        columns = {
            "ts_ns": mem["ts_ns"].astype(np.int64),
            "layer": _categorical(_KIND_LAYER[k], LAYER_NAMES),
            "action": _categorical(_KIND_ACTION[k], ACTION_NAMES),
            "addr": mem["addr"],
            "size_bytes": _masked(size, (~is_alloc & (size == 0)) | is_mark),
            "requested_bytes": _masked(mem["requested"].astype(np.int64), ~is_alloc),
            "device": _categorical(np.zeros(mem.size, dtype=np.int8), ["cpu"]),
            "pid": mem["pid"].astype(np.int32),
            "tid": mem["tid"].astype(np.int32),
            "stack_id": _masked(stack_ids, ~is_alloc),
            "category": _categorical(np.where(is_mark, 0, -1).astype(np.int8), [Mark.EXIT.value]),
        }
        return EventBatch(columns, int(mem.size))

    def _read_stack(self, bpf_stack_id: int) -> list[int]:
        return list(self._bpf["stacks"].walk(bpf_stack_id))

    def _refresh_processes(self, only_stale: bool) -> None:
        for info in self.processes.refresh(only_stale=only_stale):
            self._probe_finalize(info.maps)

    def _probe_finalize(self, maps) -> None:
        """Python targets: a uprobe on Py_FinalizeEx marks the start of interpreter teardown."""
        for path in {m.path for m in maps if m.path and _is_python(m.path)}:
            if path in self._finalize_probes:
                continue
            self._finalize_probes.add(path)
            try:
                self._bpf.attach_uprobe(name=path, sym="Py_FinalizeEx", fn_name="mp_py_finalize")
            except Exception:
                continue  # no such symbol in this file (e.g. python linked against libpython)

    def periodic(self) -> None:
        """Called about once a second: keep maps of live processes current."""
        self._refresh_processes(only_stale=False)

    def drain_stack_tables(self) -> tuple[dict, dict]:
        return self._stacks.drain_tables()

    # ---- accounting ----
    def update_stats(self) -> SourceStats:
        counters = self._bpf["counters"]
        self.stats.lost = int(sum(counters[ctypes.c_int(R.CNT_RINGBUF_FULL)]))
        self.stats.detail["stack_failures"] = int(sum(counters[ctypes.c_int(R.CNT_STACK_FAIL)]))
        self.stats.detail["site_cache_full"] = int(sum(counters[ctypes.c_int(R.CNT_SITE_FULL)]))
        self.stats.detail["page_stack_sample_every"] = self.options.page_stack_every
        self.stats.detail["user_pages"] = self.options.include_user_pages
        missed, counted = {}, set()
        for tp, fn in self._attached:
            if fn in counted or fn.endswith("_nested"):  # shared (kmalloc/_node) or a backup
                continue
            counted.add(fn)
            try:
                fd = self._bpf.load_func(fn, self._bpf.RAW_TRACEPOINT).fd  # cached by bcc: no reload
                prog = prog_stats(fd)
            except Exception:
                continue
            skipped = prog.recursion_misses
            if prog.run_cnt:  # only with sysctl kernel.bpf_stats_enabled=1 (bench/)
                self.stats.detail.setdefault("prog_ns_per_run", {})[fn] = round(prog.run_time_ns / prog.run_cnt, 1)
            if tp in R.FREE_TRACEPOINTS:
                caught = int(sum(counters[ctypes.c_int(R.CNT_NESTED_FREES + R.FREE_TRACEPOINTS.index(tp))]))
                self.stats.detail.setdefault("nested_frees_recovered", {})[tp] = caught
                skipped = max(0, skipped - caught)
            missed[tp] = missed.get(tp, 0) + skipped
        self.stats.missed = missed
        return self.stats

    def exits(self) -> list[dict]:
        return [{"pid": pid, "ts_ns": ts, "reason": _exit_reason(why)} for pid, (ts, why) in sorted(self.exit_marks.items())]

    def live_tgids(self) -> list[int]:
        return self.processes.live()

    def stop(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for fd in self._link_fds:
            os.close(fd)  # detaches the raw tracepoint program
        self._link_fds = []
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None


def _exit_reason(why: int) -> str:
    if why == R.EXIT_WHY_FINALIZE:
        return "python finalize"
    return f"signal {why}" if why else "exit_group"


class _captured_stderr:
    """Clang, inside bcc, writes diagnostics to fd 2 (header warnings on every compile);
    keep them off the user's terminal and show them only when compilation fails."""

    def __enter__(self):
        import tempfile
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        return False

    def text(self) -> str:
        self._file.seek(0)
        return self._file.read().decode(errors="replace")


def _is_python(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith("libpython3") or (base.startswith("python3") and "." not in base.replace("python3.", "", 1))


LAYER_NAMES = [layer.value for layer in Layer]
ACTION_NAMES = [action.value for action in Action]
# Record kind -> category code (-1 = null), as lookup tables indexed by kind.
_KIND_LAYER = np.full(256, -1, dtype=np.int8)
_KIND_LAYER[[R.SLAB_ALLOC, R.SLAB_FREE]] = LAYER_NAMES.index(Layer.KERNEL_SLAB.value)
_KIND_LAYER[[R.PAGE_ALLOC, R.PAGE_FREE]] = LAYER_NAMES.index(Layer.KERNEL_PAGE.value)
_KIND_ACTION = np.full(256, ACTION_NAMES.index(Action.FREE.value), dtype=np.int8)
_KIND_ACTION[[R.SLAB_ALLOC, R.PAGE_ALLOC]] = ACTION_NAMES.index(Action.ALLOC.value)
_KIND_ACTION[R.EXIT_MARK] = ACTION_NAMES.index(Action.MARK.value)


def _categorical(codes: np.ndarray, categories: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=categories)


def _masked(values: np.ndarray, null_mask: np.ndarray) -> pd.arrays.IntegerArray:
    """Nullable int64 column: `values` where `null_mask` is False, null elsewhere."""
    return pd.arrays.IntegerArray(values.astype(np.int64), null_mask.astype(bool))


def plan_attach() -> list[tuple[str, str]]:
    """(tracepoint, program) pairs for the tracepoints this kernel has."""
    from memprof.sources.btf import load_cached
    btf = load_cached()
    plan = []
    for tp in ALL_TRACEPOINTS:
        if not tracepoint_exists("kmem", tp):
            continue
        plan.append((tp, _program_for(tp, btf.raw_tracepoint_params(tp))))
        if tp in R.FREE_TRACEPOINTS:
            plan.append((tp, f"mp_{tp}_nested"))  # the backup for frees nested in the main one
    return plan


def _program_for(tp: str, params: list[str]) -> str:
    if tp in R.FREE_TRACEPOINTS:
        return f"mp_{tp}"
    if tp in ("kmalloc", "kmalloc_node"):
        return "mp_kmalloc"
    if tp.startswith("kmem_cache_alloc"):
        # Since 6.0 the cache pointer replaced the sizes in the prototype.
        return "mp_kmem_cache_alloc" if "struct kmem_cache *" in params[2] else "mp_kmem_cache_alloc_sized"
    if tp == "mm_page_alloc":
        return "mp_page_alloc"
    raise ValueError(f"no program for tracepoint {tp}")
