"""The kernel probe family: kmem tracepoints (slab + page allocator).

Raw tracepoints (not classic ones: no trace record is built per event) with argument
layouts confirmed against the running kernel's BTF. See bpf/README.md for the cost model
and the trade-offs (stack sampling, address filter for frees, nested-free backups)."""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from memprof.errors import SourceUnavailableError
from memprof.sources.ebpf import records as R

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
SLAB_TRACEPOINTS = ("kmalloc", "kmalloc_node", "kmem_cache_alloc", "kmem_cache_alloc_node", "kfree", "kmem_cache_free")
PAGE_TRACEPOINTS = ("mm_page_alloc", "mm_page_free", "mm_page_free_batched")
ALL_TRACEPOINTS = SLAB_TRACEPOINTS + PAGE_TRACEPOINTS
_GFP_MOVABLE = 0x08  # ___GFP_MOVABLE_BIT is 3 on every kernel with these tracepoints


@dataclass
class KmemOptions:
    """Tuning of the kernel probes. Stacks are taken for one slab allocation in
    `slab_stack_every` and one page allocation in `page_stack_every` (powers of two; 1 =
    every allocation); the others reuse their site's latest stacks. `sample_bytes` (bytes;
    0 = every allocation) samples the allocations themselves by size."""

    slab_stack_every: int = 64
    page_stack_every: int = 8
    include_user_pages: bool = False
    # record --kernel-sample-bytes: an allocation of S bytes is taken with probability
    # min(1, S / N) and weighted by max(1, N / S) (bpf/kmem.bpf.c, kernel_sampled); 0 takes
    # every one, so that counts are exact.
    sample_bytes: int = 0


def tracefs_root() -> str | None:
    for d in TRACEFS_DIRS:
        if os.path.isdir(os.path.join(d, "events", "kmem")):
            return d
    return None


def tracepoint_exists(category: str, name: str) -> bool:
    root = tracefs_root()
    return bool(root) and os.path.isdir(os.path.join(root, "events", category, name))


# With --kernel-sample-bytes, the most taken allocations the target may hold at once before
# more are left out and counted (bpf/kmem.bpf.c, sampled_live): a preallocated hash map of
# 5.0 MiB of kernel memory (its memlock), compiled only when sampling.
SAMPLED_LIVE_ENTRIES = 1 << 16


def kmem_cflags(options: KmemOptions) -> list[str]:
    """-D constants of bpf/kmem.bpf.c, from the options and the running kernel's BTF."""
    from memprof.sources.ebpf.btf import BtfError
    from memprof.sources.ebpf.btf_answers import kernel_btf
    try:
        btf = kernel_btf()
        size_off = btf.member_offset("kmem_cache", "size")
        objsize_off = btf.member_offset("kmem_cache", "object_size")
        name_off = btf.member_offset("kmem_cache", "name")
        task_stack_off = btf.member_offset("task_struct", "stack")
        takes_cache = _takes_cache(btf.raw_tracepoint_params("kmem_cache_alloc"))
        next_arg = unseen_switch_next_arg(btf)
    except BtfError as e:
        raise SourceUnavailableError(f"cannot read struct kmem_cache or task_struct from BTF: {e.message}", e.hint) from e
    skip = 0 if options.include_user_pages else _GFP_MOVABLE
    flags = [
        f"-DSTACK_SAMPLE_MASK={options.slab_stack_every - 1}",
        f"-DPAGE_STACK_SAMPLE_MASK={options.page_stack_every - 1}",
        f"-DKMEM_CACHE_SIZE_OFF={size_off}",
        f"-DKMEM_CACHE_OBJSIZE_OFF={objsize_off}",
        f"-DKMEM_CACHE_NAME_OFF={name_off}",
        f"-DTASK_STACK_OFF={task_stack_off}",
        f"-DPAGE_SKIP_GFP={skip:#x}",
        f"-DPAGE_SHIFT_BYTES={mmap.PAGESIZE.bit_length() - 1}",
        f"-DKERNEL_SAMPLE_BYTES={options.sample_bytes}ULL",
        f"-DKERNEL_SAMPLED_LIVE={SAMPLED_LIVE_ENTRIES}",
    ]
    if next_arg is not None:
        flags.append(f"-DUNSEEN_SWITCH_NEXT_ARG={next_arg}")
    if takes_cache:
        flags.append("-DKMEM_CACHE_ALLOC_TAKES_CACHE=1")
        if names_cache_is_its_own():
            flags.append("-DSKIP_PATH_NAME_BUFFERS=1")
    return flags


SLAB_SYSFS = "/sys/kernel/slab"


def names_cache_is_its_own(slab_sysfs: str = SLAB_SYSFS) -> bool:
    """Whether the path-name buffers' slab cache (names_cache) is a cache of its own here, so
    that an allocation from a cache named so is a path-name buffer (bpf/kmem.bpf.c,
    scratch_cache). SLUB merges caches of one size and flags: merged, names_cache would be a
    link to a shared cache (`:0004096`) whose allocations are block I/O's and others' too,
    and one that others merged into would carry their allocations under its name. It is a
    cache of its own where the kernel keeps its usercopy region (CONFIG_HARDENED_USERCOPY);
    sysfs then shows a folder of that name, not a link. False when sysfs cannot tell."""
    path = os.path.join(slab_sysfs, "names_cache")
    return os.path.isdir(path) and not os.path.islink(path)


# The x86-64 entry stubs of hardware interrupts and system vectors (timer, IPIs, irq_work),
# which kallsyms lists side by side near the start of the kernel's text. Exceptions
# (asm_exc_*: page faults, int3) are the task's own work and are not among them.
_INTERRUPT_STUBS = ("asm_common_interrupt", "asm_spurious_interrupt")
_INTERRUPT_STUB_PREFIX = "asm_sysvec_"
_KALLSYMS_HEAD_LINES = 1024  # the entry stubs are within the first ~60 lines here


def _is_interrupt_stub(name: str) -> bool:
    return name in _INTERRUPT_STUBS or name.startswith(_INTERRUPT_STUB_PREFIX)


def interrupt_entry_text(lines) -> tuple[int, int]:
    """[start, end) of the kernel's interrupt entry stubs, from kallsyms `lines` (its head is
    enough): from asm_common_interrupt over the stubs that follow it by address, up to the
    next other symbol. An interrupt that hits user space runs its handler, and the softirqs
    on its way out, on the task's own stack with the stub's return address just below the
    task's pt_regs; bpf/kmem.bpf.c tells such allocations from the task's by it. (0, 0) where
    asm_common_interrupt is not found once with an address (kallsyms shows others zeros), or
    nothing follows the stubs in `lines`: then only interrupts on stacks of their own are
    told apart."""
    from memprof.sources.symbols.kallsyms import kallsyms_text_symbols  # no __pfx_ twins
    # By address, the first of each address kept, as KernelSymbols keeps them; in plain
    # Python: the head of kallsyms is small, and this module imports no numpy.
    starts, names = [], []
    for start, name, _ in sorted(kallsyms_text_symbols(lines), key=lambda symbol: symbol[0]):
        if not starts or start != starts[-1]:
            starts.append(start)
            names.append(name)
    if names.count("asm_common_interrupt") != 1:
        return 0, 0
    first = last = names.index("asm_common_interrupt")
    while last + 1 < len(names) and _is_interrupt_stub(names[last + 1]):
        last += 1
    if last + 1 >= len(names):
        return 0, 0
    return starts[first], starts[last + 1]


def read_interrupt_entry_text(path: str = "/proc/kallsyms") -> tuple[int, int]:
    """interrupt_entry_text() of the running kernel, from kallsyms' first lines (the whole
    file takes ~70 ms to read and parse here; its head ~1 ms). (0, 0) where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            head = [line for _, line in zip(range(_KALLSYMS_HEAD_LINES), f)]
    except OSError:
        return 0, 0
    return interrupt_entry_text(head)


def plan_attach() -> list[tuple[str, str]]:
    """(tracepoint, program) pairs for the kmem tracepoints this kernel has; each free
    tracepoint gets its backup program right after its main one (see bpf/README.md)."""
    from memprof.sources.ebpf.btf_answers import kernel_btf
    btf = kernel_btf()
    plan = []
    for tp in ALL_TRACEPOINTS:
        if not tracepoint_exists("kmem", tp):
            continue
        plan.append((tp, _program_for(tp, btf.raw_tracepoint_params(tp))))
        if tp in R.FREE_TRACEPOINTS:
            plan.append((tp, f"mp_{tp}_nested"))
    return plan


def _program_for(tp: str, params: list[str]) -> str:
    if tp in R.FREE_TRACEPOINTS:
        return f"mp_{tp}"
    if tp in ("kmalloc", "kmalloc_node"):
        return "mp_kmalloc"
    if tp.startswith("kmem_cache_alloc"):
        # Since 6.0 the cache pointer replaced the sizes in the prototype.
        return "mp_kmem_cache_alloc" if _takes_cache(params) else "mp_kmem_cache_alloc_sized"
    if tp == "mm_page_alloc":
        return "mp_page_alloc"
    raise ValueError(f"no program for tracepoint {tp}")


def unseen_switch_next_arg(btf) -> int | None:
    """Where sched_switch's raw tracepoint passes the incoming task (its second task_struct
    pointer), for kmem.bpf.c's count of switches no program saw; None (not compiled) where
    task_struct's `tgid` does not follow `pid`, which the program reads as one word."""
    if btf.member_offset("task_struct", "tgid") != btf.member_offset("task_struct", "pid") + 4:
        return None
    tasks = [i for i, param in enumerate(btf.raw_tracepoint_params("sched_switch")) if param == "struct task_struct *"]
    return tasks[1] if len(tasks) >= 2 else None


def _takes_cache(params: list[str]) -> bool:
    """Whether kmem_cache_alloc's raw tracepoint `params` pass the cache (since 6.0) rather
    than the sizes: which of the two programs is compiled and attached."""
    return len(params) > 2 and "struct kmem_cache *" in params[2]


def read_unseen_tasks(bpf) -> list[dict] | None:
    """The processes no BPF program ran under for a while, from kmem.bpf.c's `unseen_tasks`
    (their threads' switches out that no program saw; bpf/README.md "Missed frees", 4):
    [{"pid": tgid, "comm": its name now ("" once gone), "threads": [tid, …], "switches": n}],
    most switches first. None where the count was not compiled (unseen_switch_next_arg)."""
    from memprof.sources.symbols.procs import read_comm
    try:
        table = bpf["unseen_tasks"]
    except KeyError:
        return None
    by_process: dict[int, dict] = {}
    for key, times in table.items():
        tgid, tid = key.value >> 32, key.value & 0xFFFFFFFF
        process = by_process.setdefault(tgid, {"pid": tgid, "comm": read_comm(tgid) if tgid else "idle",
                                               "threads": [], "switches": 0})
        process["threads"].append(tid)
        process["switches"] += int(times.value)
    for process in by_process.values():
        process["threads"].sort()
    return sorted(by_process.values(), key=lambda p: (-p["switches"], p["pid"]))
