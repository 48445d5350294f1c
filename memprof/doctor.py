"""`memprof doctor`: can recording work here, and what fixes each missing piece."""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from typing import Sequence

from memprof.record.privileges import can_record


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # recording cannot work without it
    absent: str = "absent"  # the status word of an optional check that failed


def run_checks(pythons: Sequence[str] = ()) -> list[Check]:
    """Every check, in display order; `pythons`: interpreter paths to check for Python frames
    besides the one running memprof."""
    from memprof.sources import kmem
    checks = [
        Check("privileges", can_record(), "root" if os.geteuid() == 0 else f"uid {os.geteuid()}",
              "run as root: sudo memprof …  (or grant CAP_BPF and CAP_PERFMON)"),
        _bcc_check(),
        _headers_check(),
        Check("tracefs", kmem.tracefs_root() is not None, kmem.tracefs_root() or "not mounted",
              "mount -t tracefs nodev /sys/kernel/tracing"),
        _btf_check(),
    ]
    checks += [_tracepoint_check(tp) for tp in kmem.ALL_TRACEPOINTS]
    checks += [
        Check("uprobes", os.path.exists("/sys/bus/event_source/devices/uprobe"), "uprobe PMU",
              "a kernel with CONFIG_UPROBES", required=False),
        _module_check("torch", "pip install torch (for PyTorch targets and the CPU allocator layer)"),
        _module_check("capstone", "pip install capstone (one uprobe per torch CPU allocation instead of two "
                      "traps: it finds c10::alloc_cpu's call to NUMAMove)"),
        _nvml_check(),
    ]
    return checks + python_checks(pythons)


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
    from memprof.sources.btf import BtfError, load_cached
    try:
        btf = load_cached()
        offset = btf.member_offset("kmem_cache", "size")
        return Check("BTF", True, f"/sys/kernel/btf/vmlinux (kmem_cache.size at {offset})")
    except BtfError as e:
        return Check("BTF", False, e.message, "a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def _tracepoint_check(tp: str) -> Check:
    from memprof.sources import kmem
    present = kmem.tracepoint_exists("kmem", tp)
    optional = tp.endswith("_node") or tp == "mm_page_free_batched"
    detail = "present" if present else ("absent (merged into the non-_node tracepoint on this kernel)" if optional else "absent")
    return Check(f"tracepoint kmem:{tp}", present, detail, "a kernel with CONFIG_TRACEPOINTS and tracefs mounted", required=not optional)


def _module_check(name: str, fix: str) -> Check:
    spec = importlib.util.find_spec(name)
    return Check(name, spec is not None, "importable" if spec else "not installed", fix, required=False)


def _nvml_check() -> Check:
    for lib in ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1"):
        if os.path.exists(lib):
            return Check("CUDA/NVML", True, lib, required=False)
    return Check("CUDA/NVML", False, "no NVIDIA driver (GPU layers unavailable)", "install the NVIDIA driver on a GPU machine", required=False)


def python_checks(pythons: Sequence[str] = ()) -> list[Check]:
    """"Python frames" (optional) for the interpreter running memprof, then each of `pythons`:
    whether memprof can read the frames of processes running it."""
    from memprof.sources.pyinterp import runtime_file
    checks = [_python_check(sys.executable, _own_runtime_file())]
    return checks + [_python_check(p, runtime_file(os.path.realpath(p))) for p in pythons]


def _own_runtime_file() -> str:
    """The file defining this process's _PyRuntime, as the recorder would find it: from our maps."""
    from memprof.sources.pyinterp import python_file_in_maps, runtime_file
    from memprof.sources.symbolize import parse_maps, snapshot_maps
    found = python_file_in_maps(parse_maps(snapshot_maps(os.getpid()) or ""))
    return found or runtime_file(os.path.realpath(sys.executable))


def _python_check(given: str, inspected: str) -> Check:
    from memprof.sources.pyinterp import PythonLayoutError, inspect_python
    shown = inspected if os.path.realpath(given) == inspected else f"{given} → {inspected}"
    try:
        binary = inspect_python(inspected)
    except PythonLayoutError as e:
        detail = e.message if inspected in e.message else f"{shown}: {e.message}"
        return Check("Python frames", False, detail, e.hint or "", required=False, absent="unsupported")
    return Check("Python frames", True, f"CPython {binary.version_text()} ({shown}): frames supported", required=False)
