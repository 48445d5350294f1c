"""`memprof doctor`: can recording work here, and what fixes each missing piece."""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from typing import Sequence

from memprof.capture.may_record import can_record


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # recording cannot work without it
    absent: str = ""  # the status word of a failed check; "" for MISSING (required) or "absent"

    @property
    def status(self) -> str:
        """The word shown for the check: ok, or why not."""
        if self.ok:
            return "ok"
        return self.absent or ("MISSING" if self.required else "absent")


def run_checks(pythons: Sequence[str] = ()) -> list[Check]:
    """Every check, in display order; `pythons`: interpreter paths to check for Python frames
    besides the one running memprof."""
    tracefs = _tracefs_check()
    checks = [
        Check("privileges", can_record(), "root" if os.geteuid() == 0 else f"uid {os.geteuid()}",
              "run as root: sudo memprof …  (or grant CAP_BPF and CAP_PERFMON)"),
        _bcc_check(),
        _headers_check(),
        tracefs,
        _btf_check(),
    ]
    checks += _tracepoint_checks(tracefs)
    checks += [
        Check("uprobes", os.path.exists("/sys/bus/event_source/devices/uprobe"), "uprobe PMU",
              "a kernel with CONFIG_UPROBES", required=False),
        _interrupt_entry_check(),
        _module_check("torch", "pip install torch (for PyTorch targets and the CPU allocator layer)"),
        _module_check("capstone", "pip install capstone (one uprobe per torch CPU allocation instead of two "
                      "traps: it finds c10::alloc_cpu's call to NUMAMove)"),
        _nvidia_driver_check(),
        _nvml_check(),
        _compiled_cache_check(),
        _symbol_cache_check(),
    ]
    return checks + python_checks(pythons)


def _interrupt_entry_check() -> Check:
    """Whether the kmem programs can tell an interrupt of user code from the task's own work
    (bpf/kmem.bpf.c, in_task_work): its entry stubs' addresses, from kallsyms."""
    from memprof.sources.ebpf.kmem import read_interrupt_entry_text
    start, end = read_interrupt_entry_text()
    if start:
        return Check("interrupt entries", True, f"{end - start} bytes of entry stubs at {start:#x} (kallsyms): "
                     "allocations of interrupts are not charged to the process", required=False)
    return Check("interrupt entries", False, "asm_common_interrupt not found in kallsyms: allocations made in an "
                 "interrupt of the process's user code are charged to it",
                 "run as root (kallsyms hides addresses from others); an x86-64 kernel", required=False)


def _compiled_cache_check() -> Check:
    from memprof.sources.ebpf import compiled_cache
    return _cache_check("compiled-program cache", compiled_cache.state())


def _symbol_cache_check() -> Check:
    from memprof.sources.symbols import symbol_cache
    return _cache_check("symbol cache", symbol_cache.state())


def _cache_check(title: str, state: tuple[bool, str, str]) -> Check:
    """A cache folder's state (root_cache.folder_state) as an optional check."""
    ok, detail, fix = state
    return Check(title, ok, detail, fix, required=False, absent="off")


def recording_possible(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)


def _bcc_check() -> Check:
    spec = importlib.util.find_spec("bcc")
    return Check("bcc", spec is not None, spec.origin if spec else "not importable",
                 "apt-get install python3-bpfcc bpfcc-tools, and use a Python that sees /usr/lib/python3/dist-packages (make setup)")


def _headers_check() -> Check:
    build = f"/lib/modules/{platform.release()}/build"
    ok = os.path.isdir(os.path.join(build, "include"))
    detail = os.path.realpath(build) if ok else "missing"
    return Check("kernel headers", ok, detail, "make setup (installs linux-headers-* and links the nearest to " + build + ")")


def _btf_check() -> Check:
    from memprof.sources.ebpf.btf import BtfError, load_cached
    try:
        btf = load_cached()
        offset = btf.member_offset("kmem_cache", "size")
        return Check("BTF", True, f"/sys/kernel/btf/vmlinux (kmem_cache.size at {offset})")
    except BtfError as e:
        return Check("BTF", False, e.message, "a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def _tracefs_check() -> Check:
    """Where tracefs is, or why it cannot be read: not mounted (mount it), or mounted but
    readable only by root (tracefs is mode 0700: run doctor as root; nothing else is wrong)."""
    from memprof.sources.ebpf import kmem
    root = kmem.tracefs_root()
    if root is not None:
        return Check("tracefs", True, root)
    unreadable = [d for d in mounted_tracefs() if not os.access(d, os.R_OK | os.X_OK)]
    if unreadable:
        return Check("tracefs", False, f"mounted at {unreadable[0]}, but readable only by root (you are uid "
                     f"{os.geteuid()}), so the tracepoints below cannot be checked",
                     "run doctor as root: sudo memprof doctor", absent="unreadable")
    return Check("tracefs", False, "not mounted", "mount -t tracefs nodev /sys/kernel/tracing")


def mounted_tracefs(mounts: str = "/proc/self/mounts") -> list[str]:
    """The mount points of tracefs among the places memprof looks (kmem.TRACEFS_DIRS), from
    `mounts` (the kernel's mount table; [] when it cannot be read)."""
    from memprof.sources.ebpf import kmem
    try:
        with open(mounts) as f:
            points = [fields[1] for fields in (line.split() for line in f) if len(fields) > 2 and fields[2] == "tracefs"]
    except OSError:
        return []
    return [d for d in kmem.TRACEFS_DIRS if d in points]


def _tracepoint_checks(tracefs: Check) -> list[Check]:
    """One check per kmem tracepoint; when tracefs could not be read, one that says they
    were not checked (their absence would say nothing of the kernel)."""
    from memprof.sources.ebpf import kmem
    if tracefs.absent == "unreadable":
        return [Check("kmem tracepoints", False, "not checked: tracefs is readable only by root",
                      "run doctor as root: sudo memprof doctor", absent="unchecked")]
    return [_tracepoint_check(tp) for tp in kmem.ALL_TRACEPOINTS]


# Tracepoints a recording does without: the _node ones were merged into kmalloc and
# kmem_cache_alloc (Linux 6.1+); mm_page_free_batched is only an extra source of page frees.
_OPTIONAL_TRACEPOINTS = {"kmalloc_node": "merged into kmem:kmalloc on this kernel",
                         "kmem_cache_alloc_node": "merged into kmem:kmem_cache_alloc on this kernel",
                         "mm_page_free_batched": "not on this kernel"}


def _tracepoint_check(tp: str) -> Check:
    """A tracepoint recording needs (MISSING when absent, with a fix), or an optional one
    (absent is expected there: said so, and no fix offered)."""
    from memprof.sources.ebpf import kmem
    present = kmem.tracepoint_exists("kmem", tp)
    if tp in _OPTIONAL_TRACEPOINTS:
        detail = "present" if present else f"{_OPTIONAL_TRACEPOINTS[tp]} (not needed; nothing to fix)"
        return Check(f"tracepoint kmem:{tp}", present, detail, required=False, absent="not needed")
    return Check(f"tracepoint kmem:{tp}", present, "present" if present else "absent",
                 "a kernel with CONFIG_TRACEPOINTS and tracefs mounted")


def _module_check(name: str, fix: str) -> Check:
    spec = importlib.util.find_spec(name)
    return Check(name, spec is not None, "importable" if spec else "not installed", fix, required=False)


def _nvidia_driver_check() -> Check:
    """Whether an NVIDIA driver is loaded: without one, `record`'s default sources leave the
    cuda family out (memprof/nvidia_driver.py), which a user of a stand-in libcuda should know."""
    from memprof import nvidia_driver
    if nvidia_driver.present():
        return Check("NVIDIA driver", True, "loaded: the default sources probe libcuda", required=False)
    return Check("NVIDIA driver", False, f"none ({', '.join(nvidia_driver.SIGNS)}): record's defaults leave cuda out",
                 "--sources +cuda probes libcuda anyway", required=False, absent="not loaded")


NVML_PATHS = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1")


def _nvml_check() -> Check:
    """Whether the NVML sampler (GPU memory per device and process) finds its library. Says
    what is missing, not why: the "NVIDIA driver" line says whether a driver is loaded."""
    for lib in NVML_PATHS:
        if os.path.exists(lib):
            return Check("CUDA/NVML", True, lib, required=False)
    return Check("CUDA/NVML", False, "libnvidia-ml.so.1 not found: no GPU memory samples",
                 "install the NVIDIA driver on a GPU machine", required=False)


def python_checks(pythons: Sequence[str] = ()) -> list[Check]:
    """"Python frames" (optional) for the interpreter running memprof, then each of `pythons`:
    whether memprof can read the frames of processes running it."""
    from memprof.sources.cpython.interp import runtime_file
    checks = [_python_check(sys.executable, _own_runtime_file())]
    return checks + [_python_check(p, runtime_file(os.path.realpath(p))) for p in pythons]


def _own_runtime_file() -> str:
    """The file defining this process's _PyRuntime, as the recorder would find it: from our maps."""
    from memprof.sources.cpython.interp import python_file_in_maps, runtime_file
    from memprof.sources.symbols.symbolize import parse_maps, snapshot_maps
    found = python_file_in_maps(parse_maps(snapshot_maps(os.getpid()) or ""))
    return found or runtime_file(os.path.realpath(sys.executable))


def _python_check(given: str, inspected: str) -> Check:
    from memprof.sources.cpython.interp import PythonLayoutError, inspect_python
    shown = inspected if os.path.realpath(given) == inspected else f"{given} → {inspected}"
    try:
        binary = inspect_python(inspected)
    except PythonLayoutError as e:
        detail = e.message if inspected in e.message else f"{shown}: {e.message}"
        return Check("Python frames", False, detail, e.hint or "", required=False, absent="unsupported")
    return Check("Python frames", True, f"CPython {binary.version_text()} ({shown}): frames supported", required=False)
