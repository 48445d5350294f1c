"""Case (c) of the `memory-outside-pytorch` rule (outside_torch.py): kernel memory that a
program's objects keep growing — pipes, sockets, files, page cache — from the kernel-layer
leak findings, grouped by the user frame that made them and the kind of object their kernel
frames show.

A finding counts when it is a confirmed leak (no free of its chain was proven missed) of the
kernel layers and either grows per step (its trend's Mann–Kendall confidence at least the
rule's) or, where the recording had no checkpoints to judge a trend on (a command without
steps), was held by the process until its exit and freed by the kernel's teardown then
(`released_at_exit`: the process held it; an object never seen freed may be a lost free).
memprof's own chains (its BPF programs, uprobes, agent) are never leak findings (caches.py),
and a chain through the agent's files is skipped here too.

Pure; sizes bytes, times CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprof.analysis.advice import chain_text
from memprof.analysis.advice.model import Advice
from memprof.analysis.leaks import one_per_chain
from memprof.model.schema import Layer
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.leaks import LeakFinding, LeakResult

_KERNEL_LAYERS = (Layer.KERNEL_SLAB.value, Layer.KERNEL_PAGE.value)
# Allocator frames below the function that asked for the object (skipped to name it).
_ALLOCATOR_PREFIXES = ("kmem_cache_alloc", "__kmem_cache_alloc", "kmalloc", "__kmalloc", "kvmalloc", "__kvmalloc",
                       "alloc_pages", "__alloc_pages", "__alloc_frozen_pages", "folio_alloc", "__folio_alloc",
                       "alloc_slab_obj_exts", "allocate_slab", "___slab_alloc", "__slab_alloc", "new_slab",
                       "kmalloc_reserve", "krealloc", "vmalloc", "__vmalloc")
# Kind of object by the kernel functions of its chain: the first rule with a function in the chain wins.
_KINDS = (
    ("pipe", ("alloc_pipe_info", "create_pipe_files", "do_pipe2", "pipe_write", "anon_pipe_write", "pipe_resize_ring")),
    ("socket", ("__sys_socket", "__sys_socketpair", "__sock_create", "sk_alloc", "sock_alloc", "sock_alloc_file",
                "__sys_accept4", "do_accept", "alloc_skb_with_frags", "__alloc_skb", "sock_sendmsg", "tcp_sendmsg")),
    ("eventfd", ("do_eventfd",)),
    ("epoll instance", ("do_epoll_create", "ep_alloc")),
    ("memfd", ("__x64_sys_memfd_create", "memfd_create")),
    ("page-cache page", ("filemap_add_folio", "__filemap_get_folio", "page_cache_ra_unbounded",
                         "page_cache_ra_order", "add_to_page_cache_lru", "__filemap_add_folio")),
    ("open file", ("do_sys_openat2", "do_sys_open", "path_openat", "do_filp_open")),
)
# The function that makes the object each kind is counted by (its count is the number of objects).
_COUNTED_BY = {"pipe": ("alloc_pipe_info",), "socket": ("sk_prot_alloc", "sk_alloc"),
               "open file": ("alloc_empty_file",), "eventfd": ("do_eventfd",), "epoll instance": ("ep_alloc",)}
_CHANGE = {
    "pipe": "close both ends of each pipe once its work is done (os.close / close(2), a `with` block, or "
            "subprocess's communicate()), or reuse one pipe",
    "socket": "close each socket when its work is done (a `with` block, .close()), or keep one connection or a "
              "pool instead of opening one per step",
    "open file": "close each file once read or written (`with open(...)`), or keep the one you reopen",
    "eventfd": "close each eventfd (os.close) once it is no longer waited on",
    "epoll instance": "close each epoll instance (selector.close(), os.close) or reuse one",
    "memfd": "close each memfd and drop its mappings once shared",
    "page-cache page": "the page cache is reclaimable, but here it keeps growing with files the job writes or "
                       "reads once: drop them from the cache (os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) or "
                       "write them elsewhere",
}
_AGENT_MARKERS = ("memprof_agent", "/agent/boot/")


@dataclass(frozen=True)
class KernelLimits:
    """The rule's thresholds for case (c): bytes of a call site's chains, objects of its main
    chain, and the trend confidence a growing finding needs."""

    min_bytes: int
    min_objects: int
    confidence: float


def chain_key(frames: list[dict]) -> tuple:
    """What a reader sees of a chain: its frames (kind, function, module, file, line)."""
    return tuple((f.get("kind"), f.get("function"), f.get("module"), f.get("file"), f.get("line")) for f in frames)


def frame_text(frames: list[dict]) -> str:
    """A chain in one phrase: its innermost frames up to its call site (call_site_frame)."""
    if not frames:
        return "(no stack)"
    where = call_site_frame(frames)
    inner = object_site(frames) if any(f.get("kind") == "kernel" for f in frames) else _one(frames[0])
    parts = [inner] + ([_one(where)] if where is not None else [])
    return " ← ".join(dict.fromkeys(parts))


def call_site_frame(frames: list[dict]) -> dict | None:
    """The frame of the user's code that made the allocation: the innermost Python frame
    outside the interpreter's library (stdlib, site-packages), else the innermost Python
    frame, else the innermost native frame outside libc and the dynamic loader."""
    own = chain_text.user_frame(frames)
    if own is not None:
        return own
    python = [f for f in frames if f.get("kind") == "python"]
    if python:
        return python[0]
    native = [f for f in frames if f.get("kind") == "native" and not _system_native(f)]
    return native[0] if native else None


def _system_native(frame: dict) -> bool:
    module, function = frame.get("module") or "", frame.get("function") or ""
    return module.startswith(("libc.so", "libpthread", "ld-linux", "libc-")) or function in ("", "[unknown]")


def _one(frame: dict) -> str:
    function = frame.get("function") or "?"
    if frame.get("file"):
        return f"{function} ({frame['file']}:{frame.get('line') if frame.get('line') is not None else '?'})"
    return f"{function} ({frame['module']})" if frame.get("module") and frame.get("kind") == "native" else function


def _short(frame: dict | None) -> str:
    if frame is None:
        return "an unknown call site"
    if frame.get("file"):
        return chain_text.frame_label(frame)
    return _one(frame)


def object_kind(frames: list[dict]) -> str:
    """The kind of kernel object a chain made ("pipe", "socket", …; "kernel object" if none)."""
    functions = {f.get("function") for f in frames if f.get("kind") == "kernel"}
    return next((kind for kind, names in _KINDS if functions & set(names)), "kernel object")


def object_site(frames: list[dict]) -> str:
    """The kernel function that asked for the object: the innermost kernel frame past the allocator's."""
    kernel = [f.get("function") or "?" for f in frames if f.get("kind") == "kernel"]
    asked = [name for name in kernel if not name.startswith(_ALLOCATOR_PREFIXES)]
    return (asked or kernel or ["?"])[0]


def _counts(finding: LeakFinding, leaks: LeakResult, limits: KernelLimits) -> bool:
    if finding.layer not in _KERNEL_LAYERS or not finding.is_leak or not finding.confirmed:
        return False
    if finding.kind == "grows_per_step":
        return (finding.confidence or 0.0) >= limits.confidence
    return finding.kind == "held_at_end" and leaks.checkpoints is None and finding.released_at_exit


@dataclass
class _Site:
    """The findings of one (user frame, kind of object)."""

    where: dict | None
    kind: str
    findings: list
    frames: dict

    @property
    def bytes(self) -> int:
        return sum(f.live_bytes for f in self.findings)

    @property
    def objects(self) -> int:
        """Objects made: the count of the chain that makes the kind's object (alloc_pipe_info
        for a pipe), else of the biggest chain."""
        counted = [f for f in self.findings
                   if {fr.get("function") for fr in self.frames.get(f.stack_id, [])} & set(_COUNTED_BY.get(self.kind, ()))]
        return max(f.live_count for f in (counted or self.findings))

    @property
    def growing(self) -> bool:
        return any(f.kind == "grows_per_step" for f in self.findings)


def kernel_advice(facts: Facts, leaks: LeakResult, limits: KernelLimits, rule_id: str) -> tuple[list[Advice], str]:
    """(c): one advice per call site whose kernel objects cross `limits`; else why not."""
    if not any(f.layer in _KERNEL_LAYERS for f in leaks.findings):
        return [], "no kernel-layer leak findings"
    # One finding per chain: a chain split by the exit (what it released, what it did not)
    # carries its trend in both halves, and a site's growth adds up chains, not halves.
    candidates = one_per_chain(f for f in leaks.findings if _counts(f, leaks, limits))
    frames = facts.chains([f.stack_id for f in candidates if f.stack_id is not None])
    sites: dict[tuple, _Site] = {}
    for finding in candidates:
        chain = frames.get(finding.stack_id, []) if finding.stack_id is not None else []
        if any(marker in (f.get("file") or "") + (f.get("module") or "") for f in chain for marker in _AGENT_MARKERS):
            continue
        where = call_site_frame(chain)
        key = (chain_key([where]) if where else None, object_kind(chain))
        sites.setdefault(key, _Site(where, key[1], [], frames)).findings.append(finding)
    kept = [site for site in sites.values() if site.bytes >= limits.min_bytes and site.objects >= limits.min_objects]
    if not kept:
        return [], (f"no kernel objects of one call site growing, or held to the exit, by "
                    f"{format_bytes(limits.min_bytes)} and {limits.min_objects} objects")
    unit = leaks.checkpoints.unit if leaks.checkpoints is not None else "step"
    return [_site_advice(site, unit, rule_id) for site in sorted(kept, key=lambda s: -s.bytes)], ""


def _site_advice(site: _Site, unit: str, rule_id: str) -> Advice:
    findings = sorted(site.findings, key=lambda f: (-f.live_bytes, f.stack_id or 0))
    per_step = sum(f.slope_bytes_per_step or 0.0 for f in findings if f.kind == "grows_per_step")
    per_s = sum((f.slope_bytes_per_s if f.kind == "grows_per_step" else f.growth_bytes_per_s) or 0.0 for f in findings)
    objects, where = site.objects, _short(site.where)
    layers = sorted({f.layer for f in findings})
    if site.growing:
        rate = f"grows {format_bytes(per_step)} per {unit}"
        first = (f"{objects:,} {site.kind}s made at {where} and never closed: their kernel memory {rate} "
                 f"({format_bytes(per_s)}/s), Mann–Kendall confidence "
                 f"{min(f.confidence for f in findings if f.kind == 'grows_per_step'):.3f}; "
                 f"{format_bytes(site.bytes)} held at the end in {len(findings)} chain(s) ({', '.join(layers)}).")
    else:
        rate = f"held {format_bytes(site.bytes)} until the exit"
        first = (f"{objects:,} {site.kind}s made at {where} were held until the process exited (the kernel's "
                 f"teardown freed them): {format_bytes(site.bytes)} of kernel memory in {len(findings)} chain(s) "
                 f"({', '.join(layers)}), made at {format_bytes(per_s)}/s.")
    by_object = "; ".join(f"{f.live_count:,} × {object_site(site.frames.get(f.stack_id, []))} of "
                          f"{format_bytes(f.live_bytes / max(f.live_count, 1))}: {format_bytes(f.live_bytes)}"
                          for f in findings[:6])
    evidence = (first, f"By kernel object: {by_object}.",
                f"Made at {frame_text(site.frames.get(findings[0].stack_id, []))}.")
    change = _CHANGE.get(site.kind, f"free the {site.kind}s (kernel objects from {object_site(site.frames.get(findings[0].stack_id, []))})")
    numbers = {"kind": site.kind, "objects": objects, "held_bytes": site.bytes, "bytes_per_step": per_step,
               "bytes_per_s": per_s, "chains": len(findings), "growing": site.growing,
               "where": _short(site.where)}
    return Advice(rule=rule_id, title=f"{objects:,} {site.kind}s kept open from {where}: kernel memory {rate}",
                  evidence=evidence, change=f"{change}; they are made at {where}",
                  saving=("the kernel memory these objects held at the end, which closing them keeps from growing"),
                  saving_bytes=int(site.bytes), chains=tuple(f.stack_id for f in findings[:6]),
                  layer=layers[0] if len(layers) == 1 else None, device="cpu", numbers=numbers)
