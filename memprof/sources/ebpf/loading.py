"""Compiling memprof's one BPF object and attaching its kernel programs.

The program text is joined from the parts in bpf/ (bpf/parts.h says why and in which
order), configured with -D constants from the options and the kernel (BTF, tracefs), and
compiled by bcc. The kmem family's raw tracepoints are attached here, through libbcc: bcc's
own `attach_raw_tracepoint` allows one program per tracepoint, and the free tracepoints
take two (main + backup). User-space probes are library_probes.py's."""
from __future__ import annotations

import ctypes
import mmap
import os
from importlib import resources
from typing import Callable

from memprof.errors import SourceUnavailableError
from memprof.sources.cpython.options import python_cflags
from memprof.sources.ebpf import kmem as K
from memprof.sources.ebpf.bpfinfo import prog_stats
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf import compiled_cache, early
from memprof.sources.ebpf.bpfload import captured_stderr, is_load_failure, load_failure, load_program

USER_STACK_DEPTH = 127  # frames kept per user stack (the kernel's perf_event_max_stack default)


def bpf_source_dir() -> str:
    return str(resources.files("memprof.bpf"))


def program_text(src_dir: str, *, kmem: bool) -> str:
    """The BPF program: its parts joined in order (see bpf/parts.h for why)."""
    parts = ["common.bpf.c", "python.bpf.c", *(["kmem.bpf.c"] if kmem else []), "uprobes.bpf.c", "memprof.bpf.c"]
    texts = []
    for name in parts:
        with open(os.path.join(src_dir, name)) as f:
            texts.append(f"#line 1 \"{name}\"\n" + f.read())
    return "\n".join(texts)


def compile_program(options, enabled: Callable[[str], bool]):
    """bcc's BPF object for `options` (an EbpfOptions), with the programs of the families
    `enabled(name)` says (kmem, cuda, native; torch's are always compiled: few and small);
    SourceUnavailableError with a remedy when bcc is missing, tracefs is not mounted, or the
    program does not compile or load."""
    try:
        import bcc  # noqa: F401 (that it imports: said here, with a remedy)
    except ImportError as e:
        raise SourceUnavailableError("bcc is not importable", "install python3-bpfcc (make setup), and run memprof from a Python that sees it") from e
    if enabled("kmem") and K.tracefs_root() is None:
        raise SourceUnavailableError("tracefs is not mounted (no kmem tracepoints found)", "mount -t tracefs nodev /sys/kernel/tracing")
    text, cflags = program_source(options, enabled)
    compiled = early.take(text, cflags)
    if compiled is None:
        compiled = compiled_cache.load(text, cflags)
    if compiled is not None:  # not `or`: bcc's BPF object is falsy until a table is read (its __len__)
        return compiled
    with captured_stderr() as diagnostics:
        try:
            compiled = early.compile_on_own_thread(text, cflags)
        except Exception as e:  # bcc raises bare Exception on compile failure
            failure = e
    if compiled is not None:
        compiled_cache.store(compiled, text, cflags)
        return compiled
    if is_load_failure(failure):  # compiled; bcc then loads the raw tracepoint programs it attaches itself
        raise load_failure(failure) from failure
    first_error = next((line for line in diagnostics.text().splitlines() if "error" in line), str(failure))
    raise SourceUnavailableError(f"could not compile the eBPF probes: {first_error}",
                                 "run `memprof doctor`: bcc needs kernel headers at /lib/modules/$(uname -r)/build")


# bcc optimizes the module itself (-O3, BPFModule::run_pass_manager) after clang has already
# run its own -O2 pipeline on it: the IR was optimized twice. -disable-llvm-passes keeps
# clang's -O2 front end (its debug info keeps the parameters' names, which the kernel wants in
# the BTF bcc loads for the task-storage maps; -O0 would drop them) and skips clang's passes,
# leaving bcc's. 0.87 -> 0.73 s of compile; the programs differ by 20 of ~7,700 instructions.
SINGLE_OPTIMIZATION = ["-Xclang", "-disable-llvm-passes"]


def program_source(options, enabled: Callable[[str], bool]) -> tuple[str, list[str]]:
    """(program text, compiler flags) for `options`: what bcc compiles. The flags include
    -w: clang's header warnings (on every compile) would otherwise reach fd 2."""
    src_dir = bpf_source_dir()
    flags = [f"-I{src_dir}", "-w", *SINGLE_OPTIMIZATION, *program_cflags(options, enabled)]
    return program_text(src_dir, kmem=enabled("kmem")), flags


def program_cflags(options, enabled: Callable[[str], bool]) -> list[str]:
    """The -D constants that size the maps and switch the program's optional parts."""
    o = options
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
    flags += task_cflags()
    # Which families are compiled: the cuda and native programs only where they may be used
    # (bpf/uprobes.bpf.c), the system call's anchor only with kmem (bpf/memprof.bpf.c).
    flags += [f"-DMP_{family.upper()}_FAMILY=1" for family in ("kmem", "cuda", "native") if enabled(family)]
    if enabled("kmem"):
        flags += K.kmem_cflags(o.kmem)
    flags += python_cflags(o.python)
    return flags


def task_cflags() -> list[str]:
    """-D constants of the parts every recording compiles, from the running kernel's BTF:
    where a task's context-switch counts are (common.bpf.c's system call anchor), and, for
    memprof.bpf.c's raw tracepoints, where the fields the classic tracepoints gave are and
    whether sched_process_exit passes group_dead. SourceUnavailableError where the BTF does
    not say."""
    from memprof.sources.ebpf.btf import BtfError
    from memprof.sources.ebpf.btf_answers import kernel_btf
    try:
        btf = kernel_btf()
        offsets = {"TASK_NVCSW_OFF": btf.member_offset("task_struct", "nvcsw"),
                   "TASK_NIVCSW_OFF": btf.member_offset("task_struct", "nivcsw"),
                   "TASK_PID_OFF": btf.member_offset("task_struct", "pid"),
                   "TASK_TGID_OFF": btf.member_offset("task_struct", "tgid"),
                   "TASK_SIGNAL_OFF": btf.member_offset("task_struct", "signal"),
                   "SIGNAL_GROUP_EXIT_CODE_OFF": btf.member_offset("signal_struct", "group_exit_code"),
                   "TASK_TI_STATUS_OFF": btf.member_offset("task_struct", "thread_info") + btf.member_offset("thread_info", "status"),
                   "SIGACTION_HANDLER_OFF": btf.member_offset("k_sigaction", "sa") + btf.member_offset("sigaction", "sa_handler")}
        exit_params = btf.raw_tracepoint_params("sched_process_exit")
    except BtfError as e:
        raise SourceUnavailableError(f"cannot read task_struct or the process tree's tracepoints from BTF: {e.message}", e.hint) from e
    flags = [f"-D{name}={offset}" for name, offset in offsets.items()]
    if exit_params[1:2] == ["bool"]:
        flags.append("-DHAVE_EXIT_GROUP_DEAD=1")
    return flags


class Tracepoints:
    """The kmem family's raw tracepoints, attached through libbcc; closing a link's fd
    detaches its program."""

    def __init__(self):
        self.attached: list[tuple[str, str]] = []  # (tracepoint, program)
        self._link_fds: list[int] = []
        self.interrupt_entry_text = (0, 0)

    def attach(self, bpf) -> None:
        """Attach every kmem program, after telling them where the kernel's interrupt entry
        stubs are (bpf/kmem.bpf.c, in_task_work); `interrupt_entry_text` in the detail says
        whether it was found: without it, interrupts of user code are charged to the task."""
        from bcc.libbcc import lib
        self.interrupt_entry_text = K.read_interrupt_entry_text()
        table = bpf["irq_entry_text"]
        for slot, address in enumerate(self.interrupt_entry_text):
            table[ctypes.c_int(slot)] = ctypes.c_ulonglong(address)
        for tp, fn in K.plan_attach():
            prog = load_program(bpf, fn, bpf.RAW_TRACEPOINT)
            fd = lib.bpf_attach_raw_tracepoint(prog.fd, tp.encode())
            if fd < 0:
                raise SourceUnavailableError(f"could not attach to tracepoint kmem:{tp} (error {-fd})", "run `memprof doctor`")
            self.attached.append((tp, fn))
            self._link_fds.append(fd)

    def names(self) -> list[str]:
        return sorted({tp for tp, _ in self.attached})

    def missed(self, bpf, counters, detail: dict) -> dict[str, int]:
        """Per free tracepoint: frees the kernel skipped (recursion) less those a backup
        program saw (`detail["nested_frees_recovered"]` says how many: each recorded where it
        freed the target's memory, and rightly not where it did not).

        An allocation tracepoint's skips are not losses, and go to
        `detail["nested_allocations"]` instead. The kernel runs a raw tracepoint's program
        with preemption off and skips it only when the same program is already running on
        that CPU (`__bpf_trace_run`), so a skipped allocation was made inside memprof's own
        allocation program: by an interrupt that hit it (which in_task_work() would have
        refused to record: bpf/kmem.bpf.c) or by a helper the program called (memprof's own
        bookkeeping). Neither is the target's (bpf/README.md, "Missed frees", 1)."""
        missed, counted = {}, set()
        for tp, fn in self.attached:
            if fn in counted or fn.endswith("_nested"):  # shared (kmalloc/_node) or a backup
                continue
            counted.add(fn)
            try:
                prog = prog_stats(bpf.load_func(fn, bpf.RAW_TRACEPOINT).fd)  # cached by bcc
            except Exception:
                continue
            skipped = prog.recursion_misses
            if tp not in R.FREE_TRACEPOINTS:
                nested = detail.setdefault("nested_allocations", {})
                nested[tp] = nested.get(tp, 0) + skipped
                continue
            caught = counter_total(counters, R.CNT_NESTED_FREES + R.FREE_TRACEPOINTS.index(tp))
            detail.setdefault("nested_frees_recovered", {})[tp] = caught
            missed[tp] = missed.get(tp, 0) + max(0, skipped - caught)
        return missed

    @property
    def link_fds(self) -> list[int]:
        """The attached programs' link descriptors."""
        return list(self._link_fds)

    def detach(self) -> None:
        for fd in self._link_fds:
            os.close(fd)
        self._link_fds = []


def counter_total(counters, slot: int) -> int:
    """One slot of the per-CPU `counters` map, summed over CPUs."""
    return int(sum(counters[ctypes.c_int(slot)]))


def program_costs(bpf) -> tuple[dict, dict] | None:
    """Mean ns per run and runs of every loaded program — counted by the kernel only with
    sysctl kernel.bpf_stats_enabled=1 (bench/ turns it on); None otherwise."""
    ns, runs = {}, {}
    for name, fn in sorted(bpf.funcs.items()):
        name = name.decode() if isinstance(name, bytes) else name
        try:
            prog = prog_stats(fn.fd)
        except Exception:
            continue
        if prog.run_cnt:
            ns[name], runs[name] = round(prog.run_time_ns / prog.run_cnt, 1), prog.run_cnt
    return (ns, runs) if ns else None
