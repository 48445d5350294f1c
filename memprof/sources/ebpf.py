"""The eBPF source: one BPF object (bpf/memprof.bpf.c) with the kernel probe family (kmem
tracepoints) and the user-space allocator families (uprobes on libc10, libcuda, libc),
sharing one ring buffer, one stack map and one process filter. Records are decoded in bulk
into event-table columns; stacks are interned and symbolized at each flush."""
from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import pandas as pd

from memprof.errors import NoPrivilegeError, SourceUnavailableError
from memprof.model import Action, Layer, SourceStats
from memprof.model.schema import Mark
from memprof.sources import kmem as K
from memprof.sources import records as R
from memprof.sources import uprobes as U
from memprof.sources.addrkey import AddressKey
from memprof.sources.bpfinfo import prog_stats
from memprof.sources.bpfload import captured_stderr, is_load_failure, load_failure, load_program
from memprof.sources.procs import ProcessTable
from memprof.sources.python import PythonFrames, PythonOptions, python_cflags, python_runtimes
from memprof.sources.ringbuf import RingBufferConsumer
from memprof.sources.stacks import StackInterner
from memprof.sources.symbolize import KernelSymbols, SymbolPrewarm, UserSymbolizer, parse_maps, snapshot_maps

DEFAULT_FAMILIES = ("kmem", "torch", "cuda")
ALL_FAMILIES = ("kmem", "torch", "cuda", "native")
USER_STACK_DEPTH = 127  # frames kept per user stack (the kernel's perf_event_max_stack default)
# When a library's probes were placed (meta.json sources.ebpf.detail.uprobes[path].placed):
BEFORE_START = "before the command started"    # found by path (the command's Python environment, …)
ON_MAPPING = "when the target mapped it"       # seen in the target's mappings (dlopen, lazy loading)
# torch/lib files read ahead (SymbolPrewarm): where nearly every frame of a PyTorch chain lies.
_TORCH_SYMBOL_FILES = ("libc10.so", "libtorch_cpu.so", "libtorch_python.so")


def attach_place(bpf, path: str, symbol: str, place: U.Place, program: str | None = None) -> None:
    """Attach one uprobe (or uretprobe) of `symbol` in `path`, running `place.program`, or
    `program` instead (bench/train_overhead.py attaches an empty one in the same places)."""
    fn_name = program or place.program
    if place.kind == U.RETURN:
        bpf.attach_uretprobe(name=path, sym=symbol, fn_name=fn_name)
    else:
        bpf.attach_uprobe(name=path, sym=symbol, sym_off=place.offset, fn_name=fn_name)


@dataclass
class EbpfOptions:
    """What to probe and how. `families` ⊆ ALL_FAMILIES; torch and cuda probes attach only
    to processes that map libc10 / libcuda. `native_sample_bytes` 0 = every libc allocation."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    kmem: K.KmemOptions = field(default_factory=K.KmemOptions)
    native_sample_bytes: int = 0
    user_stack_every: int = 16  # user-space allocators: one in N takes its own user stack
    allocator_prefix: str = ""
    alloc_probes: str = U.CALL_SITE  # one of U.ALLOC_PROBES
    ringbuf_bytes: int = 128 << 20
    stack_entries: int = 32768      # kernel stacks (the kernel's stack map: ~1 KiB each, preallocated)
    user_stack_entries: int = 16384  # user stacks (least-recently-used, by frame hash: ~1 KiB each)
    addr_filter_bits_log2: int = 26
    python: PythonOptions = field(default_factory=PythonOptions)


@dataclass
class EventBatch:
    """Decoded memory events as columns of the events table (no `seq`: the session adds it)."""

    columns: dict
    rows: int


def bpf_source_dir() -> str:
    return str(resources.files("memprof.bpf"))


def program_text(src_dir: str, *, kmem: bool) -> str:
    """The BPF program: its parts joined in order (see bpf/common.bpf.c for why)."""
    parts = ["common.bpf.c", "python.bpf.c", *(["kmem.bpf.c"] if kmem else []), "uprobes.bpf.c", "memprof.bpf.c"]
    texts = []
    for name in parts:
        with open(os.path.join(src_dir, name)) as f:
            texts.append(f"#line 1 \"{name}\"\n" + f.read())
    return "\n".join(texts)


class EbpfSource:
    """Compile, attach, poll and account for every eBPF probe family.
    Use: start(pids) → poll()… (periodic() about once a second) → stop()."""

    name = "ebpf"

    def __init__(self, options: EbpfOptions | None = None, command_path: str | None = None):
        self.options = options or EbpfOptions()
        self.command_path = command_path
        self.processes = ProcessTable()
        self.stats = SourceStats(stack_sample_every=self.options.kmem.slab_stack_every,
                                 detail={"families": list(self.options.families)})
        self.exit_marks: dict[int, tuple[int, int]] = {}  # tgid -> (ts_ns, why)
        self._bpf = None
        self._ring: RingBufferConsumer | None = None
        self._stacks: StackInterner | None = None
        self._attached: list[tuple[str, str]] = []
        self._link_fds: list[int] = []
        self._probed: set[tuple[str, str]] = set()  # (library path, family) with uprobes on
        self._finalize_probes: set[str] = set()
        self._family_map: dict[str, U.Family] | None = None
        self._python: PythonFrames | None = None
        # Drawn per recording, never saved: kernel addresses reach the events table only as
        # their images under it (see addrkey.py).
        self._address_key = AddressKey.generate()

    def enabled(self, family: str) -> bool:
        return family in self.options.families

    # ---- start ----
    def start(self, pids: list[int]) -> None:
        """Compile, attach, and begin following `pids` and their future descendants."""
        known = self._known_libraries()
        # ELF symbol tables are read on a thread while bcc compiles, not at the first
        # flushes, which come while the target runs.
        self._symbols = SymbolPrewarm(UserSymbolizer(), self._prewarm_paths(known, pids))
        self._bpf = self._compile()
        if self.enabled("kmem"):
            self._attach_tracepoints()
        self._attach_known_libraries(known)
        self._verify_programs_of_late_families()
        self._ring = RingBufferConsumer(self._bpf["events"].map_fd, self.options.ringbuf_bytes, R.EVENT_DTYPE)
        self._python = PythonFrames(self._bpf, self.options.python)
        self._python.install()
        self._python.prewarm(self.command_path)
        # kallsyms is read at the first flush, not here: the command waits for start() to return.
        self._stacks = StackInterner(self._read_stack, self.processes.maps_of, KernelSymbols.load,
                                     python_frames=self._python.frames, read_user_stack=self._read_user_stack,
                                     user_symbols=self._symbols.user)
        for pid in pids:
            self.track(pid)

    def track(self, pid: int, before_exec: bool = False) -> None:
        """Follow `pid` (and its future children). `before_exec`: it is memprof's own gated
        child, still running memprof's interpreter: its Python frames wait for its exec."""
        if before_exec:
            self._python.defer(pid)
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
        if self.enabled("kmem") and K.tracefs_root() is None:
            raise SourceUnavailableError("tracefs is not mounted (no kmem tracepoints found)", "mount -t tracefs nodev /sys/kernel/tracing")
        src_dir = bpf_source_dir()
        text = program_text(src_dir, kmem=self.enabled("kmem"))
        cflags = [f"-I{src_dir}", *self._cflags()]
        with captured_stderr() as diagnostics:
            try:
                return BPF(text=text, cflags=cflags)
            except Exception as e:  # bcc raises bare Exception on compile failure
                failure = e
        if is_load_failure(failure):  # compiled; bcc then loads the classic tracepoint programs
            raise load_failure(failure) from failure
        first_error = next((line for line in diagnostics.text().splitlines() if "error" in line), str(failure))
        raise SourceUnavailableError(f"could not compile the eBPF probes: {first_error}",
                                     "run `memprof doctor`: bcc needs kernel headers at /lib/modules/$(uname -r)/build")

    def _cflags(self) -> list[str]:
        o = self.options
        pid_max = int(open("/proc/sys/kernel/pid_max").read())
        flags = [
            f"-DRINGBUF_PAGES={o.ringbuf_bytes // mmap.PAGESIZE}",
            f"-DSTACK_ENTRIES={o.stack_entries}",
            f"-DUSTACK_ENTRIES={o.user_stack_entries}",
            f"-DUSTACK_DEPTH={USER_STACK_DEPTH}",
            f"-DTRACKED_WORDS={pid_max // 64 + 1}",
            f"-DADDR_BITS_LOG2={o.addr_filter_bits_log2}",
            f"-DNATIVE_SAMPLE_BYTES={o.native_sample_bytes}ULL",
            f"-DUSER_STACK_SAMPLE_MASK={o.user_stack_every - 1}",
        ]
        if K.tracepoint_has_field("sched", "sched_process_exit", "group_dead"):
            flags.append("-DHAVE_EXIT_GROUP_DEAD=1")
        if self.enabled("kmem"):
            flags += K.kmem_cflags(o.kmem)
        flags += python_cflags(o.python)
        return flags

    def _attach_tracepoints(self) -> None:
        # bcc's attach_raw_tracepoint allows one program per tracepoint; the free
        # tracepoints take two (main + backup), so attach through libbcc directly.
        from bcc.libbcc import lib
        for tp, fn in K.plan_attach():
            prog = load_program(self._bpf, fn, self._bpf.RAW_TRACEPOINT)
            fd = lib.bpf_attach_raw_tracepoint(prog.fd, tp.encode())
            if fd < 0:
                raise SourceUnavailableError(f"could not attach to tracepoint kmem:{tp} (error {-fd})", "run `memprof doctor`")
            self._attached.append((tp, fn))
            self._link_fds.append(fd)
        self.stats.detail["tracepoints"] = sorted({tp for tp, _ in self._attached})

    # ---- user-space allocators ----
    def _families(self) -> dict[str, U.Family]:
        """The enabled user-space families by name (built once: native depends on options)."""
        if self._family_map is None:
            fams = {name: fam for name, fam in U.FAMILIES.items() if self.enabled(name)}
            if self.enabled("native"):
                fams["native"] = U.native_family(self.options.allocator_prefix)
            self._family_map = fams
        return self._family_map

    def _known_libraries(self) -> dict[str, list[str]]:
        """Family name -> the library files we can find before the command starts."""
        known = U.find_known_libraries(self.command_path)
        if self.enabled("native"):
            known["native"] = U.libc_paths()
        return known

    def _prewarm_paths(self, known: dict[str, list[str]], pids: list[int]) -> list[str]:
        """The files whose symbols nearly every chain of a PyTorch job needs: torch's main
        libraries (beside each libc10 found, or mapped by a process attached to), the Python
        runtime (the command's, or the one such a process maps), and libc."""
        attached = [_current_maps(pid) for pid in pids]
        paths = [os.path.join(os.path.dirname(libc10), name)
                 for libc10 in known.get("torch", []) for name in _TORCH_SYMBOL_FILES]
        paths += [m.path for maps in attached for m in maps if os.path.basename(m.path) in _TORCH_SYMBOL_FILES]
        paths += python_runtimes(self.command_path, attached)
        paths += U.libc_paths()
        return [p for p in dict.fromkeys(paths) if os.path.isfile(p)]

    def _attach_known_libraries(self, known: dict[str, list[str]]) -> None:
        """Probe the libraries we can find before the command starts."""
        for name, paths in known.items():
            if self.enabled(name):
                for path in paths:
                    self._probe_library(path, name, BEFORE_START)

    def _verify_programs_of_late_families(self) -> None:
        """Load (verify) now the programs of each enabled family none of whose libraries was
        found before the start, so that when one appears later (torch dlopens libcuda) it is
        probed with attach calls alone. Verifying the return program takes the kernel ~40-50 ms
        here (it reads Python frames); an allocation the target makes meanwhile is not seen.
        A refusal is left to the attach that needs the program, which reports it (mid-recording:
        in meta.json and the report's notes)."""
        probed = {family for _, family in self._probed}
        for name, family in self._families().items():
            if name in probed:
                continue
            for program in U.family_programs(family, self.options.alloc_probes):
                try:  # bcc keeps a loaded program for the attach
                    load_program(self._bpf, program, self._bpf.KPROBE, show_log=False)
                except SourceUnavailableError:
                    pass  # the attach that needs it loads it again, and shows why it is refused

    def _probe_library(self, path: str, family_name: str, placed: str) -> None:
        """Uprobes of one family on one library file (once). Missing optional symbols are
        skipped; a library lacking a required one is noted in meta.json, as is when the
        probes were placed (`placed`: BEFORE_START or ON_MAPPING)."""
        key = (os.path.realpath(path), family_name)
        if key in self._probed:
            return
        self._probed.add(key)
        family = self._families()[family_name]
        attached, missing_required, at_calls, refused = 0, [], {}, {}
        for probe in family.probes:
            try:
                how = self._attach_probe(key[0], probe)
                if how is not None:
                    at_calls[probe.symbol] = how
                attached += 1
            except SourceUnavailableError as e:  # the kernel refused the probe's program
                if placed == BEFORE_START:
                    raise  # at start-up: say so, before the command runs
                refused[probe.symbol] = str(e)  # mid-recording: keep recording, say which
            except Exception:  # bcc raises bare Exception for a symbol the file lacks
                if not probe.optional:
                    missing_required.append(probe.symbol)
        libs = self.stats.detail.setdefault("uprobes", {})
        libs[key[0]] = {"family": family_name, "layer": family.layer.value, "probes": attached,
                        "missing": missing_required, "placed": placed}
        if at_calls:
            libs[key[0]]["allocation_probes"] = at_calls
        if refused:
            libs[key[0]]["refused"] = refused

    def _attach_probe(self, path: str, probe: U.Probe) -> str | None:
        """Attach one probe where U.places() says; returns how an allocator with a call-site
        alternative was probed, in words (None for the others)."""
        found, how = U.places(path, probe, self.options.alloc_probes)
        for place in found:
            load_program(self._bpf, place.program, self._bpf.KPROBE)  # typed error; bcc caches it for the attach
            attach_place(self._bpf, path, probe.symbol, place)
        return how

    def _probe_new_mappings(self, maps) -> None:
        for m in maps:
            if not m.path or not m.path.startswith("/"):
                continue
            family = U.family_of_mapping(m.path)
            if family and self.enabled(family):
                self._probe_library(m.path, family, ON_MAPPING)
            elif self.enabled("native") and U.is_native_library(m.path, self.options.allocator_prefix):
                self._probe_library(m.path, "native", ON_MAPPING)
        for path in {m.path for m in maps if m.path and _is_python(m.path)}:
            self._probe_finalize(path)

    def _probe_finalize(self, path: str) -> None:
        """Python targets: a uprobe on Py_FinalizeEx marks the start of interpreter teardown."""
        if path in self._finalize_probes:
            return
        self._finalize_probes.add(path)
        try:
            self._bpf.attach_uprobe(name=path, sym="Py_FinalizeEx", fn_name="mp_py_finalize")
        except Exception:
            pass  # no such symbol in this file (e.g. python linked against libpython)

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
                self._python.forget(pid)
            elif kind == R.PROC_EXIT:
                self.processes.exit_(pid, ts)
                self._python.forget(pid)
            elif kind == R.EXIT_MARK and pid not in self.exit_marks:
                self.exit_marks[pid] = (ts, int(r["requested"]))
            elif kind == R.MAP_EXEC:
                self.processes.mark_stale(pid)
        if np.isin(kinds, (R.PROC_EXEC, R.PROC_FORK, R.MAP_EXEC)).any():
            self._refresh_processes(only_stale=True)

    def _decode_memory(self, recs: np.ndarray) -> EventBatch:
        """Columns of the events table, built with array operations only."""
        kinds = recs["kind"]
        mem = recs[(kinds <= R.USER_FREE) | (kinds == R.EXIT_MARK)]
        k, layer, flags = mem["kind"], mem["layer"], mem["flags"]
        is_alloc = np.isin(k, R.ALLOC_KINDS)
        is_mark = k == R.EXIT_MARK
        size = mem["size"].astype(np.int64)
        requested = np.where(k == R.USER_ALLOC, size, mem["requested"].astype(np.int64))
        stack_ids = np.zeros(mem.size, dtype=np.int64)
        stack_ids[is_alloc] = self._stacks.intern(
            mem["kstack_id"][is_alloc], mem["ustack"][is_alloc], mem["pid"][is_alloc], mem["call_site"][is_alloc],
            mem["py_stack"][is_alloc])
        is_device = (layer == R.LAYER_CODES.index(Layer.CUDA_DRIVER.value)) & ((flags & R.FLAG_HOST) == 0) & ~is_mark
        columns = {
            "ts_ns": mem["ts_ns"].astype(np.int64),
            "layer": _categorical(np.where(is_mark, -1, _LAYER_INDEX[layer]).astype(np.int8), LAYER_NAMES),
            "action": _categorical(_KIND_ACTION[k], ACTION_NAMES),
            "addr": self._keyed_addresses(k, mem["addr"]),
            "size_bytes": _masked(size, (~is_alloc & (size == 0)) | is_mark),
            "requested_bytes": _masked(requested, ~is_alloc),
            "device": _categorical(is_device.astype(np.int8), DEVICE_NAMES),
            "pid": mem["pid"].astype(np.int32),
            "tid": mem["tid"].astype(np.int32),
            "stack_id": _masked(stack_ids, ~is_alloc),
            "category": _categorical(np.where(is_mark, 0, -1).astype(np.int8), [Mark.EXIT.value]),
            "weight": self._weights(is_alloc, layer, size),
        }
        return EventBatch(columns, int(mem.size))

    def _keyed_addresses(self, kinds: np.ndarray, addrs: np.ndarray) -> np.ndarray:
        """The `addr` column: kernel addresses (slab objects, struct pages) replaced by their
        images under this recording's key, so that the user's files do not show the kernel's
        layout; user-space addresses (the target's own) as they are."""
        # KERNEL_KINDS are 1..4 (records.py checks): one uint8 comparison, where a table
        # lookup costs twice as much and np.isin four times (ns an event, bench/addrkey_cost.py).
        kernel = (kinds - np.uint8(R.SLAB_ALLOC)) < np.uint8(len(R.KERNEL_KINDS))
        if not kernel.any():
            return addrs
        if kernel.all():  # the kernel-heavy case: one pass, no gather and scatter
            return self._address_key.apply(addrs)
        keyed = addrs.copy()
        keyed[kernel] = self._address_key.apply(addrs[kernel])
        return keyed

    def _weights(self, is_alloc: np.ndarray, layer: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Sampled libc allocations stand for max(1, N/size) allocations; others: null (1)."""
        n = self.options.native_sample_bytes
        weight = np.full(size.size, np.nan)
        if n > 0:
            native = is_alloc & (layer == R.LAYER_CODES.index(Layer.NATIVE_HEAP.value))
            weight[native] = np.maximum(1.0, n / np.maximum(size[native], 1))
        return weight

    def _read_stack(self, bpf_stack_id: int) -> list[int]:
        return list(self._bpf["stacks"].walk(bpf_stack_id))

    def _read_user_stack(self, key: int) -> list[int]:
        """A user stack's addresses, innermost first (KeyError once evicted)."""
        trace = self._bpf["ustacks"][ctypes.c_uint64(key)]
        addrs = list(trace.ip)
        return addrs[:addrs.index(0)] if 0 in addrs else addrs

    def _refresh_processes(self, only_stale: bool) -> None:
        for info in self.processes.refresh(only_stale=only_stale):
            self._probe_new_mappings(info.maps)
            self._python.register(info.pid, info.maps)

    def periodic(self) -> None:
        """About once a second: keep maps of live processes current, probe new libraries."""
        self._refresh_processes(only_stale=False)

    def drain_stack_tables(self) -> tuple[dict, dict]:
        self._symbols.wait()
        self._python.refresh()
        return self._stacks.drain_tables()

    # ---- accounting ----
    def update_stats(self) -> SourceStats:
        counters = self._bpf["counters"]
        total = lambda slot: int(sum(counters[ctypes.c_int(slot)]))  # noqa: E731
        self.stats.lost = total(R.CNT_RINGBUF_FULL)
        self.stats.detail.update(
            stack_failures=total(R.CNT_STACK_FAIL), site_cache_full=total(R.CNT_SITE_FULL),
            nested_in_scratch=total(R.CNT_SCRATCH_BUSY),
            page_stack_sample_every=self.options.kmem.page_stack_every,
            user_pages=self.options.kmem.include_user_pages,
            native_sample_bytes=self.options.native_sample_bytes,
            user_stack_sample_every=self.options.user_stack_every)
        self.stats.missed = self._missed(counters)
        costs = self._program_costs()
        if costs:
            self.stats.detail["prog_ns_per_run"], self.stats.detail["prog_runs"] = costs
        if self._python is not None:
            self.stats.detail["python"] = {
                "enabled": self.options.python.enabled,
                "interpreters": self._python.interpreter_notes(),
                "events_without_thread_state": total(R.CNT_PY_NO_THREAD),
                "not_code_objects": total(R.CNT_PY_BAD_CODE),
                "map_full": total(R.CNT_PY_MAP_FULL),
                **self._python.stats}
        return self.stats

    def _program_costs(self) -> tuple[dict, dict] | None:
        """Mean ns per run and runs of every loaded program — counted by the kernel only with
        sysctl kernel.bpf_stats_enabled=1 (bench/ turns it on); None otherwise."""
        ns, runs = {}, {}
        for name, fn in sorted(self._bpf.funcs.items()):
            name = name.decode() if isinstance(name, bytes) else name
            try:
                prog = prog_stats(fn.fd)
            except Exception:
                continue
            if prog.run_cnt:
                ns[name], runs[name] = round(prog.run_time_ns / prog.run_cnt, 1), prog.run_cnt
        return (ns, runs) if ns else None

    def _missed(self, counters) -> dict[str, int]:
        """Per tracepoint: events the kernel skipped (recursion) less those a backup recovered."""
        missed, counted = {}, set()
        for tp, fn in self._attached:
            if fn in counted or fn.endswith("_nested"):  # shared (kmalloc/_node) or a backup
                continue
            counted.add(fn)
            try:
                prog = prog_stats(self._bpf.load_func(fn, self._bpf.RAW_TRACEPOINT).fd)  # cached by bcc
            except Exception:
                continue
            skipped = prog.recursion_misses
            if tp in R.FREE_TRACEPOINTS:
                caught = int(sum(counters[ctypes.c_int(R.CNT_NESTED_FREES + R.FREE_TRACEPOINTS.index(tp))]))
                self.stats.detail.setdefault("nested_frees_recovered", {})[tp] = caught
                skipped = max(0, skipped - caught)
            missed[tp] = missed.get(tp, 0) + skipped
        return missed

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


def _is_python(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith("libpython3") or (base.startswith("python3") and "." not in base.replace("python3.", "", 1))


LAYER_NAMES = [layer.value for layer in Layer]
ACTION_NAMES = [action.value for action in Action]
DEVICE_NAMES = ["cpu", "cuda"]
# The record's layer byte -> index in LAYER_NAMES; its kind -> index in ACTION_NAMES.
_LAYER_INDEX = np.full(256, -1, dtype=np.int8)
for _code, _name in enumerate(R.LAYER_CODES):
    _LAYER_INDEX[_code] = LAYER_NAMES.index(_name)
_KIND_ACTION = np.full(256, ACTION_NAMES.index(Action.FREE.value), dtype=np.int8)
_KIND_ACTION[list(R.ALLOC_KINDS)] = ACTION_NAMES.index(Action.ALLOC.value)
_KIND_ACTION[R.EXIT_MARK] = ACTION_NAMES.index(Action.MARK.value)


def _categorical(codes: np.ndarray, categories: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=categories)


def _masked(values: np.ndarray, null_mask: np.ndarray) -> pd.arrays.IntegerArray:
    """Nullable int64 column: `values` where `null_mask` is False, null elsewhere."""
    return pd.arrays.IntegerArray(values.astype(np.int64), null_mask.astype(bool))


def _current_maps(pid: int) -> list:
    """A running process's mappings now ([] when they cannot be read: it is then followed as
    any other, only without symbols read ahead)."""
    try:
        text = snapshot_maps(pid)
    except NoPrivilegeError:
        return []
    return parse_maps(text) if text else []
