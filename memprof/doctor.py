"""`memprof doctor`: can recording work here, and what fixes each missing piece."""
from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass

from memprof.record.privileges import can_record


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # recording cannot work without it


def run_checks() -> list[Check]:
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
        _nvml_check(),
    ]
    return checks


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
