"""The eBPF source: one BPF object (bpf/memprof.bpf.c) with the kernel probe family (kmem
tracepoints) and the user-space allocator families (uprobes on libc10, libcuda, libc),
sharing one ring buffer, one stack map and one process filter.

`EbpfSource` is the session's one handle on them; the work is in its parts:
loading.py compiles the program and attaches the tracepoints, library_probes.py places
uprobes on allocator libraries as they are found, decode.py turns drained records into
event-table columns, and the symbols subpackage interns and symbolizes stacks at each flush."""
from __future__ import annotations

import ctypes
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from memprof.lazy_import import numpy as np
from memprof.model import SourceStats
from memprof.sources.cpython.frames import PythonFrames, python_runtimes
from memprof.sources.ebpf import bpfinfo
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.decode import EventBatch, MemoryDecoder
from memprof.sources.ebpf.options import ALL_FAMILIES, DEFAULT_FAMILIES, DEFAULT_NATIVE_SAMPLE_BYTES, EbpfOptions  # noqa: F401 (theirs to import from here too)
from memprof.sources.ebpf.library_probes import LibraryProbes, current_maps, known_libraries, prewarm_paths
from memprof.sources.ebpf.kmem import read_unseen_tasks
from memprof.sources.ebpf.loading import USER_STACK_DEPTH, Tracepoints, compile_program, counter_total, program_costs
from memprof.sources.ebpf.probe_holder import Holder, hold
from memprof.sources.ebpf.ringbuf import RingBufferConsumer
from memprof.sources.symbols.procs import ProcessTable
from memprof.sources.symbols.stacks import StackInterner, UserStack
from memprof.sources.symbols.symbolize import KernelSymbols, SymbolPrewarm, UserSymbolizer, load_kernel_symbols

# Drained records wait undecoded until a poll asks for them, or until this many wait (4.7 MB
# of records; ~55 ms of kernel churn, the busiest workload here). Decoding each 20 ms drain
# cost a fixed ~0.7 ms of numpy and Arrow calls whatever its size: 0.70 s of the recorder's
# CPU on a GPT-2 generation of 600,000 events, against 0.20-0.22 s decoded at each flush
# (in-process timers, bench/RESULTS.md; issue 24).
DECODE_MAX_RECORDS = 65536
# The live processes' maps are re-read whole at most this often (periodic()); an executable
# mapping is announced at once (MAP_EXEC). Each flush (4 a second) re-read them: ~4 ms of the
# recorder's CPU a time beside a GPT-2 generation, 0.43 s of a 21 s run (issue 24).
PERIODIC_S = 1.0


class EbpfSource:
    """Compile, attach, poll and account for every eBPF probe family.
    Use: start(pids) → poll()… (periodic() at each flush) → stop()."""

    name = "ebpf"

    def __init__(self, options: EbpfOptions | None = None, command_path: str | None = None):
        self.options = options or EbpfOptions()
        self.command_path = command_path
        # Whom the command runs as (a capture.target.RunAs; None: memprof's own user): its
        # interpreter is asked for its site-packages as that user, never as root for them.
        self.command_run_as = None
        self.processes = ProcessTable()
        self.stats = SourceStats(stack_sample_every=self.options.kmem.slab_stack_every,
                                 detail={"families": list(self.options.families)})
        if self.options.left_out:  # families_for_this_host: why a default family is not probed
            self.stats.detail["left_out"] = dict(self.options.left_out)
        self.exit_marks: dict[int, tuple[int, int]] = {}  # tgid -> (ts_ns, why)
        self.tracking_since_ns: int | None = None  # when track() first ran: the recording's start
        self._bpf = None
        self._ring: RingBufferConsumer | None = None
        self._stacks: StackInterner | None = None
        self._tracepoints = Tracepoints()
        self._libraries: LibraryProbes | None = None
        self._python: PythonFrames | None = None
        self._kallsyms: Future | None = None  # prefetch_kernel_symbols()
        self._process_probes_detach: threading.Thread | Holder | None = None  # detach_process_probes()
        self.decoder = MemoryDecoder(self._intern, self.options.native_sample_bytes,
                                     kernel_sample_bytes=self.options.kernel_sample_bytes)
        # Kernel frees of allocations the target held (MP_FLAG_HELD, bpf/kmem.bpf.c), what
        # the teardown waits for: the latest one's stamp (CLOCK_MONOTONIC), and how many.
        self.last_held_free_ns: int | None = None
        self._held_frees = 0
        self._undecoded: list[np.ndarray] = []  # drained records a later poll decodes
        self._undecoded_rows = 0
        self._periodic_at_s: float | None = None  # time.monotonic() of periodic()'s last re-read
        self._mapped_again: set[int] = set()  # processes whose maps the next poll re-reads too

    def enabled(self, family: str) -> bool:
        return self.options.enabled(family)

    # ---- start ----
    def start(self, pids: list[int]) -> None:
        """Compile, attach, and begin following `pids` and their future descendants."""
        known = known_libraries(self.options, self.command_path, self.command_run_as)
        # ELF symbol tables are read on a thread while bcc compiles (begun by early.py, taken
        # by compile_program), not at the first flushes, which come while the target runs.
        attached = [current_maps(pid) for pid in pids]  # record --pid: what each maps now, read once
        self._symbols = SymbolPrewarm(UserSymbolizer(), prewarm_paths(known, self.command_path, attached))
        self._bpf = compile_program(self.options, self.enabled)
        self._libraries = LibraryProbes(self._bpf, self.options, self.stats.detail)
        # The libraries' uprobes are placed on a thread beside the rest of the start: the
        # first uprobe a process places waits out an RCU grace period in the kernel (the
        # uprobes' dup_mmap_sem, taken for writing: 11-42 ms in a record, up to ~100 ms
        # under load), which the tracepoints' attach, the ring buffer's mapping and the
        # Python probes (whose own uprobes then ride the same grace period) need not wait
        # for. They touch other parts of bcc's object (each program is loaded by one side).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="memprof-uprobes") as beside:
            runtimes = python_runtimes(self.command_path)  # the command's own (a #! script's interpreter's)
            libraries = beside.submit(self._attach_libraries, known, attached, runtimes)
            if self.enabled("kmem"):
                self._tracepoints.attach(self._bpf)
                self.stats.detail["tracepoints"] = self._tracepoints.names()
                self.stats.detail["interrupt_entry_text_found"] = any(self._tracepoints.interrupt_entry_text)
            self._ring = RingBufferConsumer(self._bpf["events"].map_fd, self.options.ringbuf_bytes, R.EVENT_BYTES,
                                            lambda: R.EVENT_DTYPE)
            self._python = PythonFrames(self._bpf, self.options.python)
            self._python.install()
            self._python.prewarm(runtimes)
            libraries.result()  # what it raised, raised here
        # kallsyms is read at the first flush, not here: the command waits for start() to return.
        self._stacks = StackInterner(self._read_stack, self.processes.maps_of, self._kernel_symbols,
                                     python_frames=self._python.frames, read_user_stack=self._read_user_stack,
                                     user_symbols=self._symbols.user)
        for pid in pids:
            self.track(pid)

    def _attach_libraries(self, known: dict[str, list[str]], attached: list[list], runtimes: list[str]) -> None:
        """The uprobes of the libraries known before the command starts (`known`), of those
        the processes attached to map (`attached`) and of the command's Python `runtimes`,
        and the later families' programs verified."""
        self._libraries.attach_known(known)
        self._libraries.attach_mapped(attached)
        self._libraries.probe_finalize_of(runtimes)
        self._libraries.verify_programs_of_late_families()

    def prefetch_kernel_symbols(self) -> None:
        """Read kallsyms on a thread of its own, from now: once the command runs, so that the
        first flush finds it read (~70 ms here; ~2 ms where its lasting part was kept,
        symbolize.load_kernel_symbols) and the command never waits for it. It must come
        after the start's programs are loaded: they top every kernel stack (dropped by name),
        and kallsyms, or their program info, names them only once they are."""
        if self._kallsyms is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memprof-kallsyms")
            self._kallsyms = pool.submit(load_kernel_symbols, _program_symbols)
            pool.shutdown(wait=False)

    def _kernel_symbols(self) -> KernelSymbols:
        """kallsyms, as prefetched (an error reading it is raised here, as a direct read's would be)."""
        return self._kallsyms.result() if self._kallsyms is not None else load_kernel_symbols(_program_symbols)

    def track(self, pid: int, before_exec: bool = False) -> None:
        """Follow `pid` (and its future children). `before_exec`: it is memprof's own gated
        child, still running memprof's interpreter: its Python frames wait for its exec.
        The first call sets `tracking_since_ns` (CLOCK_MONOTONIC): no event is older."""
        if before_exec:
            self._python.defer(pid)
        if self.tracking_since_ns is None:
            self.tracking_since_ns = time.monotonic_ns()
        table = self._bpf["tracked"]
        key = ctypes.c_int(pid >> 6)
        table[key] = ctypes.c_ulonglong(table[key].value | (1 << (pid & 63)))
        self.processes.add(pid, None, None)
        self._refresh_processes(only_stale=True, before_exec=before_exec)

    # ---- polling ----
    def poll(self, decode: bool = True) -> EventBatch | None:
        """Drain the ring buffer. Lifecycle events (forks, execs, exits, new executable
        mappings) and the held frees' count are applied at once; the memory events of this
        drain and of earlier ones left undecoded come back as columns, oldest first, where
        `decode` asks for them or DECODE_MAX_RECORDS wait. None where nothing comes back."""
        if self._mapped_again:
            self._reread_mapped()
        recs = self._ring.drain()
        held = (recs["flags"] & R.FLAG_HELD) != 0
        held_frees = int(np.count_nonzero(held))
        self._held_frees += held_frees
        if held_frees:
            self.last_held_free_ns = int(recs["ts_ns"][held].max())
        if recs.size:
            self.stats.events += int(recs.size)
            self._apply_lifecycle(recs)
            self._undecoded.append(recs)
            self._undecoded_rows += int(recs.size)
        if not self._undecoded or not (decode or self._undecoded_rows >= DECODE_MAX_RECORDS):
            return None
        waiting = self._undecoded[0] if len(self._undecoded) == 1 else np.concatenate(self._undecoded)
        self._undecoded, self._undecoded_rows = [], 0
        return self.decoder.decode(waiting)

    def _apply_lifecycle(self, recs: np.ndarray) -> None:
        lifecycle = recs[recs["kind"] >= R.PROC_FORK]  # rare: most drains have none
        if not lifecycle.size:
            return
        kinds = lifecycle["kind"]
        mapped = lifecycle["ts_ns"][kinds == R.MAP_EXEC]
        for r in lifecycle:  # one Python step each is fine
            kind, pid, ts = int(r["kind"]), int(r["pid"]), int(r["ts_ns"])
            if kind == R.PROC_FORK:
                self.processes.add(pid, int(r["tid"]), ts)
            elif kind == R.PROC_EXEC:
                self.processes.exec_(pid, R.exec_comm(r))
                self._python.forget(pid)
            elif kind == R.PROC_EXIT:
                self.processes.exit_(pid, ts)
                self._python.forget(pid)
            elif kind == R.EXIT_MARK and pid not in self.exit_marks:
                self.exit_marks[pid] = (ts, int(r["requested"]))
            elif kind == R.MAP_EXEC:
                self.processes.mark_stale(pid)
                self._mapped_again.add(pid)
        if np.isin(kinds, (R.PROC_EXEC, R.PROC_FORK, R.MAP_EXEC)).any():
            self._refresh_processes(only_stale=True, mapped_ns=int(mapped.min()) if mapped.size else None)

    def _reread_mapped(self) -> None:
        """Re-read, a poll later, the maps of processes that announced an executable mapping:
        MAP_EXEC is sent as mmap is entered, and the drain that read it may have read the
        maps before the mapping was made. The re-read of every process's maps comes only once
        a second (periodic()), and a library's frames would stay unknown until then."""
        for pid in self._mapped_again:
            self.processes.mark_stale(pid)
        self._mapped_again = set()
        self._refresh_processes(only_stale=True)

    def _intern(self, *columns) -> np.ndarray:
        return self._stacks.intern(*columns)

    def _read_stack(self, bpf_stack_id: int) -> list[int]:
        return list(self._bpf["stacks"].walk(bpf_stack_id))

    def _read_user_stack(self, key: int) -> UserStack:
        """A user stack, innermost first, and the word at its stack pointer (KeyError once
        evicted). The last slot holds the word (bpf/common.bpf.c, WORD_AT_SP_SLOT)."""
        ips = list(self._bpf["ustacks"][ctypes.c_uint64(key)].ip)
        frames, word_at_sp = ips[:USER_STACK_DEPTH], ips[-1]
        return UserStack(frames[:frames.index(0)] if 0 in frames else frames, word_at_sp)

    def _refresh_processes(self, only_stale: bool, mapped_ns: int | None = None, before_exec: bool = False) -> None:
        """Read the maps of the processes that need it and probe what they map. `before_exec`:
        the one to read is memprof's gated child, whose maps are still memprof's own: its
        interpreter is not probed for Py_FinalizeEx (a uprobe on memprof's Python, not the
        command's; the command's own runtime is probed from its path, _attach_libraries)."""
        for info in self.processes.refresh(only_stale=only_stale):
            self._libraries.probe_new_mappings(info.maps, mapped_ns, pythons=not before_exec)
            self._python.register(info.pid, info.maps)

    def periodic(self) -> None:
        """At each flush: once PERIODIC_S has passed since the last time, re-read the maps of
        live processes and probe new libraries (what an exec mapping's MAP_EXEC missed: one
        made executable by mprotect, say)."""
        now = time.monotonic()
        if self._periodic_at_s is not None and now - self._periodic_at_s < PERIODIC_S:
            return
        self._periodic_at_s = now
        self._refresh_processes(only_stale=False)

    def drain_stack_tables(self) -> tuple[dict, dict]:
        self._symbols.wait()
        self._python.refresh()
        return self._stacks.drain_tables()

    # ---- accounting ----
    def update_stats(self) -> SourceStats:
        counters = self._bpf["counters"]
        total = lambda slot: counter_total(counters, slot)  # noqa: E731
        self.stats.lost = total(R.CNT_RINGBUF_FULL)
        self.stats.detail.update(
            stack_failures=total(R.CNT_STACK_FAIL), site_cache_full=total(R.CNT_SITE_FULL),
            nested_in_scratch=total(R.CNT_SCRATCH_BUSY), mixed_sites=total(R.CNT_SITE_MIXED),
            interrupt_allocations=total(R.CNT_IRQ_ALLOCS),
            path_name_buffers_not_recorded=total(R.CNT_SCRATCH_SKIPPED),
            page_stack_sample_every=self.options.kmem.page_stack_every,
            user_pages=self.options.kmem.include_user_pages,
            kernel_sample_bytes=self.options.kernel_sample_bytes,
            sampled_kernel_left_out=total(R.CNT_SAMPLED_FULL),
            native_sample_bytes=self.options.native_sample_bytes, ring_buffer_bytes=self.options.ringbuf_bytes,
            user_stack_sample_every=self.options.user_stack_every, held_frees=self._held_frees,
            program_from_cache=getattr(self._bpf, "FROM_CACHE", False))  # compiled_cache.py: no compile this run
        self.stats.missed = self._tracepoints.missed(self._bpf, counters, self.stats.detail)
        unseen = read_unseen_tasks(self._bpf)
        if unseen is not None:
            self.stats.detail["unseen_tasks"] = unseen
        costs = program_costs(self._bpf)
        if costs:
            self.stats.detail["prog_ns_per_run"], self.stats.detail["prog_runs"] = costs
        if self._python is not None:
            self.stats.detail["python"] = {
                "enabled": self.options.python.enabled,
                "interpreters": self._python.interpreter_notes(),
                "events_without_thread_state": total(R.CNT_PY_NO_THREAD),
                "not_code_objects": total(R.CNT_PY_BAD_CODE),
                "map_full": total(R.CNT_PY_MAP_FULL),
                "tail_calls_failed": total(R.CNT_PY_TAIL_FAILED),
                "code_heads_read": total(R.CNT_PY_CODE_READS),
                "stacks_of_their_call": total(R.CNT_PY_CALL_STACKS),
                **self._python.stats}
        return self.stats

    def exits(self) -> list[dict]:
        return [{"pid": pid, "ts_ns": ts, "reason": _exit_reason(why)} for pid, (ts, why) in sorted(self.exit_marks.items())]

    def live_tgids(self) -> list[int]:
        return self.processes.live()

    def last_exit_ns(self) -> int | None:
        """When the last of the tree's processes exited, as the kernel stamped it
        (sched_process_exit, CLOCK_MONOTONIC ns); None before any exit was polled."""
        return max((i.exit_ns for i in self.processes.procs.values() if i.exit_ns is not None), default=None)

    def detach_process_probes(self) -> None:
        """The target's whole tree has exited: detach the probes only its processes reach
        (uprobes); the raw tracepoints stay attached until stop(): the kmem ones report the
        kernel's last frees, and the process tree's filter on tracked pids, none left now.
        Each perf event's last close waits out RCU grace periods in the kernel (~0.4 s for
        all, here): a forked holder makes those closes (probe_holder.py), and this returns
        at once. Without a holder (fork failed, MEMPROF_PROBE_HOLDER=0) they run on a
        thread while the session waits for the last frees, and stop() joins it."""
        if self._bpf is None or self._process_probes_detach is not None:
            return
        links = [*self._tracepoints.link_fds, *self._bpf.raw_tracepoint_fds.values()]
        holder = hold(perf_event_fds(self._bpf), later=links)
        if holder is not None:
            detach_each(self._bpf)  # reference drops: the holder keeps each event open
            holder.release_first()
            self._process_probes_detach = holder
            return
        self._process_probes_detach = threading.Thread(target=detach_in_parallel, args=(self._bpf,),
                                                       name="memprof-detach", daemon=True)
        self._process_probes_detach.start()

    def stop(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        try:
            self._tracepoints.detach()  # a reference drop too, when a holder holds the links
            if isinstance(self._process_probes_detach, threading.Thread):
                self._process_probes_detach.join()
            if self._bpf is not None:
                detach_in_parallel(self._bpf)
                self._bpf.cleanup()
                self._bpf = None
        finally:
            for probes in (self._libraries, self._python):  # the files they held for bcc
                if probes is not None:
                    probes.close_files()
            if isinstance(self._process_probes_detach, Holder):
                # After every copy of the recorder's is closed, so that the holder's are the
                # last; and even when cleanup() raised, so that it never outlives its purpose.
                self._process_probes_detach.release_later()


def perf_event_fds(bpf) -> list[int]:
    """The descriptors of bcc's perf-event probes (tracepoints, uprobes)."""
    return [*bpf.tracepoint_fds.values(), *bpf.uprobe_fds.values()]


def detach_in_parallel(bpf) -> None:
    """Detach bcc's perf-event probes (tracepoints, uprobes) on threads, before its cleanup().

    cleanup() closes them one at a time, and each close waits out an RCU grace period in the
    kernel: 6 tracepoints took 0.46 s of `record -- true` (cProfile, bench/RESULTS.md). The
    closes are ctypes calls, which release the GIL, so they overlap. Best effort: what fails
    here is left to cleanup(), which raises as before."""
    jobs = _detach_jobs(bpf)
    if len(jobs) < 2:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(jobs)), thread_name_prefix="memprof-detach") as pool:
        list(pool.map(_detach, jobs))


def detach_each(bpf) -> None:
    """Detach bcc's perf-event probes one after the other: for closes that do not wait (a
    holder keeps each event open, probe_holder.py). Best effort, as detach_in_parallel."""
    for job in _detach_jobs(bpf):
        _detach(job)


def _detach_jobs(bpf) -> list[tuple]:
    return [(bpf.detach_tracepoint, key) for key in list(bpf.tracepoint_fds)] + \
        [(bpf.detach_uprobe_event, key) for key in list(bpf.uprobe_fds)]


def _detach(job) -> None:
    method, key = job
    try:
        method(key)
    except Exception:  # bcc raises bare Exception; cleanup() meets the probe again
        pass


def _exit_reason(why: int) -> str:
    if why == R.EXIT_WHY_FINALIZE:
        return "python finalize"
    return f"signal {why}" if why else "exit_group"


def _program_symbols() -> list[tuple[int, str]] | None:
    """The loaded BPF programs' kallsyms symbols from the kernel's program info, or None
    (read kallsyms whole) where it cannot give them all."""
    try:
        return bpfinfo.program_symbols()
    except OSError:
        return None
