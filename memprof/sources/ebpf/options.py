"""What the eBPF source probes and how: the options `record` gives it.

Kept apart from source.py and uprobes.py, which import numpy and pyarrow, so that `record`
can build them and start bcc's compile (early.py) before those imports (issue 24: start-up;
tests/unit/test_startup_imports.py keeps it so)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection

from memprof import nvidia_driver
from memprof.sources.cpython.options import PythonOptions
from memprof.sources.ebpf import kmem as K

# record --alloc-probes (sources/ebpf/uprobes.py): CALL_SITE takes an allocator whose call to
# a known function carries (address, size) in one uprobe there, where
# memprof/sources/ebpf/callsite.py finds it; ENTRY_RETURN always takes it at entry and return.
CALL_SITE, ENTRY_RETURN = "call-site", "entry-return"
ALLOC_PROBES = (CALL_SITE, ENTRY_RETURN)

DEFAULT_FAMILIES = ("kmem", "torch", "cuda")
# record --native-sample-bytes: an allocation of S bytes is recorded with probability
# min(1, S / 64 KiB). On GPT-2 generation and the training bench, the libc heap's weighted
# bytes (allocated, and live at the end) came within 2 % of the unsampled run's from one row
# in 80 and one in 150; its weighted count within 10 % (bench/RESULTS.md, bench/native_cost.py).
DEFAULT_NATIVE_SAMPLE_BYTES = 64 << 10
ALL_FAMILIES = ("kmem", "torch", "cuda", "native")


@dataclass
class EbpfOptions:
    """What to probe and how. `families` ⊆ ALL_FAMILIES; torch and cuda probes attach only
    to processes that map libc10 / libcuda. `native_sample_bytes`: libc allocations are sampled by size (0 = every one).
    `native_preload`: the path of memprof's LD_PRELOAD interposer (memprof/preload) when the
    command was given it, so the native family probes its markers; "" = uprobes on libc."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    kmem: K.KmemOptions = field(default_factory=K.KmemOptions)
    native_sample_bytes: int = DEFAULT_NATIVE_SAMPLE_BYTES
    native_probes: str = "auto"  # record --native-probes: auto, preload or uprobes (memprof/preload)
    native_preload: str = ""
    user_stack_every: int = 16  # user-space allocators: one in N takes its own user stack
    allocator_prefix: str = ""
    alloc_probes: str = CALL_SITE  # one of ALLOC_PROBES
    ringbuf_bytes: int = 128 << 20
    stack_entries: int = 32768      # kernel stacks (the kernel's stack map: ~1 KiB each, preallocated)
    user_stack_entries: int = 16384  # user stacks (least-recently-used, by frame hash: ~1 KiB each)
    addr_filter_bits_log2: int = 26
    python: PythonOptions = field(default_factory=PythonOptions)
    # Families of the defaults this host cannot use, and why (meta.json's ebpf detail
    # `left_out`): families_for_this_host.
    left_out: dict[str, str] = field(default_factory=dict)

    def enabled(self, family: str) -> bool:
        """Whether `family` (one of ALL_FAMILIES) is probed."""
        return family in self.families

    @property
    def kernel_sample_bytes(self) -> int:
        """The kernel's byte sampling the programs apply (bytes; 0 = none, also without kmem)."""
        return self.kmem.sample_bytes if self.enabled("kmem") else 0


def families_for_this_host(families: tuple[str, ...], named: Collection[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(`families` less those this host cannot use, {left-out family: why}). Only cuda is
    ever left out: where no NVIDIA driver is loaded (nvidia_driver.py) no CUDA call can
    allocate, and its ten programs cost ~0.1 s of a first run's compile (bench/RESULTS.md).
    A family in `named` (the user asked for it by name: `--sources +cuda`) is kept all the
    same, for a stand-in libcuda such as the tests' (examples/cuda_standin)."""
    if "cuda" not in families or "cuda" in named or nvidia_driver.present():
        return families, {}
    kept = tuple(f for f in families if f != "cuda")
    return kept, {"cuda": f"{nvidia_driver.absence()}; --sources +cuda probes libcuda all the same"}
