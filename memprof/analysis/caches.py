"""Memory that is held on purpose: what is live at the end but is not a leak.

- PyTorch's caching allocator keeps segments (layer `cuda_segment`) after the tensors in them
  are freed, to reuse them; a segment with no live block (`cuda_block`) inside is cache.
- The kernel keeps page cache, dentries, inodes and extent caches after the files are closed;
  they are reclaimed under memory pressure, not freed by the process.
- Pages the slab allocator takes for its objects (`allocate_slab`) stay with it, whether or
  not the process lives: a leak of kernel objects shows in `kernel_slab`, not in the pages.
  So does its own bookkeeping: the per-object cgroup vector it kmallocs as it takes a page
  (or when a page first holds an accounted object), freed with the page; the per-CPU sheaves
  of objects it keeps for a cache (Linux 6.18).
- Page tables and memory areas (VMAs) grow with the memory a process maps and go with its
  address space: what they map shows in the other layers.
- Kernel memory that memprof's own BPF programs take while they run in the target's context
  (the kernel's BPF allocator refilling its per-CPU cache, in an irq_work inside one of
  them, for the programs' per-thread storage) is memprof's, not the target's; so is what the
  kernel keeps for memprof's uprobes, and what memprof's agent allocates in a Python target
  (its thread, its buffers, its imports).
- A thread's kernel objects (task_struct, its stack, its pid) live as long as the thread.
- What a program makes once at start-up, recognized by its frames: an import, the dynamic
  loader loading a library, exec loading the program.
- What a training framework keeps for the whole job beside the model: DistributedDataParallel's
  gradient buckets (its reducer's flat copies of the gradients, made as it is built and
  rebuilt once, in the second step's forward, in the order the gradients came).

Pure functions; no I/O. Times are CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import end_times, labels, live_mask
from memprof.model.schema import FrameKind, Layer


# Kernel functions that fill reclaimable caches (Linux 5.x–6.18 names): page cache (also the
# block device's, where filesystems cache metadata blocks, and the buffer heads of cached
# blocks), the xarray nodes that index it, dentries, inodes of filesystems, ext4's
# extent-status cache (6.18 allocates its entries in __es_insert_extent), and what an
# inode keeps for as long as it is cached: the lock context its first flock or fcntl lock
# makes (freed with the inode, not with the lock: torch.compile's cache files keep one each).
_KERNEL_CACHE_FUNCTIONS = re.compile(
    r"^(__filemap_add_folio|filemap_alloc_folio\w*|filemap_add_folio|__filemap_get_folio\w*|page_cache_ra_\w+|"
    r"folio_alloc_buffers|alloc_buffer_head|"
    r"add_to_page_cache_lru|__page_cache_alloc|xas_alloc|xas_nomem|radix_tree_node_alloc\w*|"
    r"__d_alloc|d_alloc\w*|alloc_inode|\w+_alloc_inode|ext4_es_alloc_extent|__es_alloc_extent|__es_insert_extent|"
    r"locks_get_lock_context)$")
# The slab allocator taking pages for a cache of objects, and kmalloc-ing its own bookkeeping:
# a page's vector of per-object extensions (memory cgroup, allocation tags: 6.10+
# alloc_slab_obj_exts, 5.9–6.9 memcg_alloc_page_obj_cgroups / memcg_alloc_slab_cgroups), and
# 6.18's per-CPU sheaves of objects (alloc_empty_sheaf), which its caches keep (Linux 5.x–6.18).
_SLAB_ALLOCATOR_OWN_FUNCTIONS = {"allocate_slab", "new_slab", "alloc_slab_page",
                        "alloc_slab_obj_exts", "memcg_alloc_page_obj_cgroups", "memcg_alloc_slab_cgroups",
                        "alloc_empty_sheaf"}
# The process's own address space (Linux 5.x–6.18): the mm itself, page tables, memory areas
# (VMAs), the maple tree that indexes them, anonymous-memory bookkeeping.
_ADDRESS_SPACE_FUNCTIONS = {"pte_alloc_one", "__pte_alloc", "__pte_alloc_kernel", "pmd_alloc_one", "__pmd_alloc",
                            "__pud_alloc", "__p4d_alloc", "pgd_alloc", "_pgd_alloc",
                            "mm_alloc", "vm_area_alloc", "vm_area_dup", "mas_alloc_nodes", "mas_preallocate", "mas_store_prealloc",
                            "anon_vma_alloc", "anon_vma_clone", "anon_vma_fork", "__anon_vma_prepare",
                            # munmap's tree of the areas it detaches (6.x): freed at once, but on
                            # 6.18 through RCU sheaves, which no kmem tracepoint sees (bpf/README.md)
                            "mas_store_gfp", "do_vmi_align_munmap",
                            # brk moving the heap's end: its area and the maple tree's nodes
                            "do_brk_flags", "__do_sys_brk"}
# glibc's wrappers of the brk system call: a kernel allocation made under them is the heap's
# area growing (its maple-tree nodes), whatever the kernel stack kept. Since the caller of a
# frameless wrapper is kept (memprof/sources/symbols/frameless.py), a chain that kept only its
# call site (mas_new_ma_node) still shows them.
_ADDRESS_SPACE_SYSCALL_WRAPPERS = {"brk", "__brk", "sbrk", "__sbrk"}
# A kernel frame of one of memprof's own BPF programs (all named mp_*): the kernel names a JIT-ed
# program bpf_prog_<tag>_<name> in kallsyms.
_MEMPROF_PROGRAM_FRAME = re.compile(r"^bpf_prog_[0-9a-f]+_mp_\w+$")
# The kernel's bookkeeping of uprobes, which memprof places on user-space allocators: the
# per-thread uprobe state, the breakpoints it writes into a library as it is mapped, and the
# USDT semaphores those bump (Linux 5.x–6.18).
_UPROBE_FUNCTIONS = {"alloc_utask", "uprobe_notify_resume", "install_breakpoint", "update_ref_ctr", "uprobe_mmap",
                     "prepare_uretprobe"}
# memprof's agent in a Python target: a copy under the recording's agent/boot/ (record -- CMD),
# or the memprof package's own agent/boot/ (an attached program that installed it).
_AGENT_FILE = r"(?:^|/)agent/boot/(?:memprof_agent|sitecustomize)\.py$"


def is_agent_file(file: str) -> bool:
    """Whether a Python frame's file is memprof's agent (a copy in a recording's agent/boot/,
    or the package's own)."""
    return re.search(_AGENT_FILE, file) is not None

# The agent's functions that run the target's own code: the hook around torch's import, the
# profiler step it counts, the sitecustomize it shadows. A chain through one of them is the
# target's, unless a frame of the agent's own is further in.
_AGENT_PASS_THROUGH = {"_TorchWatcher.find_spec.<locals>.exec_module", "_patch_profiler_step.<locals>.step",
                       "_run_shadowed_sitecustomize"}
# A thread (or process) being made: every kernel object of it is allocated under copy_process.
_THREAD_FUNCTIONS = {"copy_process"}
# exec loading a program (kernel; GCC's .isra/.constprop clones included).
_EXEC_FUNCTION = re.compile(r"^(bprm_execve|do_execveat_common|load_elf_binary|begin_new_exec)(\.\w+)*$")
# The dynamic loader's own code (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld.so).
_LOADER_MODULE = re.compile(r"^ld(-linux[\w.-]*)?\.so")
# Every import runs through importlib's _find_and_load (frozen or not). Code frozen into
# CPython is the first Python the interpreter runs as it starts, before any import of the
# program's: getpath (3.11+: sys.path computed in Python), then the import system's own
# (its module bodies, _setup, _install).
_IMPORT_FUNCTION = "_find_and_load"
_IMPORT_SYSTEM_FILES = ("<frozen getpath>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# Python functions of torch/nn/parallel/distributed.py in which DistributedDataParallel
# allocates its reducer's gradient buckets: at construction, and their rebuild in the
# second step's forward (`self.reducer._rebuild_buckets()`, "called only once during
# training"). One bucket per ~25 MiB of gradients, per rank.
_DDP_FILE = "torch/nn/parallel/distributed.py"
_DDP_BUCKET_FUNCTIONS = frozenset({"DistributedDataParallel.__init__", "DistributedDataParallel._ddp_init_helper",
                                   "DistributedDataParallel._pre_forward"})
# Inodes and dentries that are not cached: those of pipes, sockets and anonymous files live
# exactly as long as their file descriptors. A chain through any of these is not a cache.
_NOT_CACHE_FUNCTIONS = {"sock_alloc_inode", "sock_alloc", "get_pipe_inode", "create_pipe_files", "d_alloc_pseudo",
                        "alloc_file_pseudo", "new_inode_pseudo", "anon_inode_getfile", "__anon_inode_getfile",
                        "anon_inode_make_secure_inode"}


@dataclass(frozen=True)
class KnownChains:
    """Stack ids recognized by their frames, for leaks.find_leaks: kernel caches
    (kernel_cache_stacks), the slab allocator's pages (slab_page_stacks), the address space
    (address_space_stacks), memprof's own (memprof_stacks), threads (thread_stacks), start-up
    work (startup_stacks), the stacks with a Python frame (python_stacks), and what a training
    framework keeps beside the model (framework_state_stacks)."""

    cache: frozenset[int] = frozenset()
    slab_pages: frozenset[int] = frozenset()
    address_space: frozenset[int] = frozenset()
    memprof: frozenset[int] = frozenset()
    threads: frozenset[int] = frozenset()
    startup: frozenset[int] = frozenset()
    python: frozenset[int] = frozenset()
    framework_state: frozenset[int] = frozenset()


def known_chains(stacks: pd.DataFrame, frames: pd.DataFrame) -> KnownChains:
    """Every set of KnownChains, from a recording's stacks and frames."""
    return KnownChains(cache=kernel_cache_stacks(stacks, frames), slab_pages=slab_page_stacks(stacks, frames),
                       address_space=address_space_stacks(stacks, frames), memprof=memprof_stacks(stacks, frames),
                       threads=thread_stacks(stacks, frames), startup=startup_stacks(stacks, frames),
                       python=python_stacks(stacks, frames), framework_state=framework_state_stacks(stacks, frames))


def kernel_cache_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids whose kernel frames include a cache-filling function (module docstring)."""
    kernel, names = _kernel_functions(frames)
    caches = _stacks_of(stacks, kernel.loc[names.str.match(_KERNEL_CACHE_FUNCTIONS).to_numpy(), "frame_id"])
    return caches - _stacks_of(stacks, kernel.loc[names.isin(_NOT_CACHE_FUNCTIONS).to_numpy(), "frame_id"])


def slab_page_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids of the slab allocator's own memory: the pages it took for its caches
    (`kernel_page` chains through allocate_slab) and its bookkeeping (`kernel_slab` chains
    through alloc_slab_obj_exts, which a page keeps until it is freed, or alloc_empty_sheaf,
    a per-CPU sheaf its cache keeps). It keeps and reuses them on its own schedule, and a
    leak of the objects in them shows in `kernel_slab`, so they are never a leak themselves."""
    return _stacks_through(stacks, frames, _SLAB_ALLOCATOR_OWN_FUNCTIONS)


def address_space_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids of the process's own address space (page tables, VMAs, their maple tree):
    they follow its mappings (growing as it maps and touches memory, freed with its address
    space), and the memory they map shows in the other layers, so they are never a leak."""
    return (_stacks_through(stacks, frames, _ADDRESS_SPACE_FUNCTIONS)
            | _stacks_of(stacks, frames.loc[(frames["kind"] == FrameKind.NATIVE.value).to_numpy()
                                            & frames["function"].isin(_ADDRESS_SPACE_SYSCALL_WRAPPERS).to_numpy(),
                                            "frame_id"]))


def memprof_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids of memprof's own memory, never the target's leak:
    - a kernel frame of one of memprof's BPF programs: an allocation made while memprof's
      program ran (module docstring). (The target's own allocations are recorded with stacks
      that start at the allocator, below the tracepoint where memprof's program runs.)
    - a kernel frame of the uprobes' bookkeeping (memprof's probes on the allocators);
    - memprof's agent in a Python target, when the innermost of its frames is one of its own
      (`_AGENT_PASS_THROUGH` runs the target's code: torch's import through its hook stays
      the target's)."""
    kernel, names = _kernel_functions(frames)
    ours = names.str.match(_MEMPROF_PROGRAM_FRAME).to_numpy() | names.isin(_UPROBE_FUNCTIONS).to_numpy()
    return _stacks_of(stacks, kernel.loc[ours, "frame_id"]) | _agent_stacks(stacks, frames)


def _agent_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids whose innermost frame of memprof's agent is not a pass-through (see memprof_stacks)."""
    is_agent = (frames["kind"] == FrameKind.PYTHON.value) & frames["file"].fillna("").str.contains(_AGENT_FILE)
    agent = frames.loc[is_agent.to_numpy(), ["frame_id", "function"]]
    if agent.empty:
        return frozenset()
    rows = stacks.merge(agent, on="frame_id").sort_values(["stack_id", "depth"], kind="stable")
    innermost = rows.drop_duplicates("stack_id")
    return frozenset(int(s) for s in innermost.loc[~innermost["function"].isin(_AGENT_PASS_THROUGH), "stack_id"])


def thread_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids of a thread's kernel objects (task_struct, its kernel stack, its pid: all
    made under copy_process): while live, they are a thread that runs, not a leak."""
    return _stacks_through(stacks, frames, _THREAD_FUNCTIONS)


def startup_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids of start-up work, known by its frames: an import (a Python frame of
    importlib's _find_and_load, or of the import system's own frozen code), the dynamic
    loader loading a library (a native frame in ld.so), exec loading the program (its kernel
    functions)."""
    kernel, names = _kernel_functions(frames)
    known = set(kernel.loc[names.str.match(_EXEC_FUNCTION).to_numpy(), "frame_id"])
    module, function = frames["module"].fillna(""), frames["function"].fillna("")
    loader = (frames["kind"] == FrameKind.NATIVE.value) & module.str.match(_LOADER_MODULE)
    imports = (frames["kind"] == FrameKind.PYTHON.value) & ((function == _IMPORT_FUNCTION)
                                                             | frames["file"].isin(_IMPORT_SYSTEM_FILES))
    known |= set(frames.loc[(loader | imports).to_numpy(), "frame_id"])
    return _stacks_of(stacks, pd.Series(sorted(known), dtype="int64"))


def framework_state_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids through a Python frame of DistributedDataParallel where it makes its
    gradient buckets (_DDP_BUCKET_FUNCTIONS in torch's distributed.py): state it keeps for
    the whole job, as the model keeps its gradients. Not a leak unless it grows
    (leaks._GROWTH_WINS): anything else made there and held stays a finding once it grows."""
    python = (frames["kind"] == FrameKind.PYTHON.value).to_numpy()
    in_ddp = (frames["function"].isin(_DDP_BUCKET_FUNCTIONS).to_numpy()
              & frames["file"].fillna("").str.endswith(_DDP_FILE).to_numpy())
    return _stacks_of(stacks, frames.loc[python & in_ddp, "frame_id"])


def python_stacks(stacks: pd.DataFrame, frames: pd.DataFrame) -> frozenset[int]:
    """Stack ids with a Python frame other than the import system's own frozen code: the
    thread was running Python code. (The interpreter runs that code as it starts, before
    anything of the program's; leaks._before_python counts from the first other frame.)"""
    python = (frames["kind"] == FrameKind.PYTHON.value) & ~frames["file"].isin(_IMPORT_SYSTEM_FILES)
    return _stacks_of(stacks, frames.loc[python.to_numpy(), "frame_id"])


def _stacks_through(stacks: pd.DataFrame, frames: pd.DataFrame, functions: set[str]) -> frozenset[int]:
    """Stack ids with a kernel frame of one of `functions` (offsets ignored)."""
    kernel, names = _kernel_functions(frames)
    return _stacks_of(stacks, kernel.loc[names.isin(functions).to_numpy(), "frame_id"])


def _kernel_functions(frames: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """The kernel frames, and their function names without the '+0x…' offset."""
    kernel = frames[frames["kind"] == FrameKind.KERNEL.value]
    return kernel, kernel["function"].fillna("").str.replace(r"\+0x[0-9a-f]+$", "", regex=True)


def _stacks_of(stacks: pd.DataFrame, frame_ids: pd.Series) -> frozenset[int]:
    """Stack ids that hold any of `frame_ids`."""
    return frozenset(int(s) for s in stacks.loc[stacks["frame_id"].isin(frame_ids), "stack_id"].unique())


def cached_segments(allocations: pd.DataFrame, at_ns: np.ndarray) -> np.ndarray:
    """Per allocation: True for a `cuda_segment` live at its `at_ns` with no `cuda_block`
    of the same device live then at an address inside it ([addr, addr + size_bytes))."""
    is_segment = labels(allocations["layer"]) == Layer.CUDA_SEGMENT.value
    return is_segment & (blocks_inside(allocations, at_ns, allocations) == 0)


def blocks_inside(allocations: pd.DataFrame, at_ns: np.ndarray, blocks: pd.DataFrame) -> np.ndarray:
    """Per allocation of `allocations`: for a `cuda_segment`, how many `cuda_block`s of
    `blocks` (allocations too: the same frame, or another) of its device were live inside it
    ([addr, addr + size_bytes)) at the latest `at_ns` of the segments; 0 for the rest."""
    layer = labels(allocations["layer"])
    is_segment = layer == Layer.CUDA_SEGMENT.value
    out = np.zeros(len(allocations), dtype=np.int64)
    if not is_segment.any() or blocks.empty:
        return out
    device = labels(allocations["device"])
    addr = allocations["addr"].to_numpy().astype(np.uint64)
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0).astype(np.uint64)
    when = float(np.max(at_ns[is_segment]))  # blocks are judged at the latest segment time
    block_addr, block_device = blocks["addr"].to_numpy().astype(np.uint64), labels(blocks["device"])
    live_block = (labels(blocks["layer"]) == Layer.CUDA_BLOCK.value) & live_mask(
        blocks["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(blocks), when)
    for dev in np.unique(device[is_segment].astype(str)):
        inner = np.sort(block_addr[live_block & (block_device == dev)])
        segs = np.flatnonzero(is_segment & (device == dev))
        out[segs] = np.searchsorted(inner, addr[segs] + size[segs], "left") - np.searchsorted(inner, addr[segs], "left")
    return out
