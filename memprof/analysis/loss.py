"""What the recording could not see, per layer, from its metadata, and the notes every
report carries about it, each with its severity."""
from __future__ import annotations

from enum import Enum

from memprof.model import Layer, RecordingMeta, SourceStats
from memprof.units import format_bytes


class Severity(str, Enum):
    """How much a note matters: INFO says how the recording works (the results hold as
    shown); CAVEAT says something that changes the results (missing or estimated data)."""

    INFO = "info"
    CAVEAT = "caveat"


class Note(str):
    """A note's text (it is a str, so every renderer prints it as it is) with its `severity`."""

    severity: Severity

    def __new__(cls, text: str, severity: Severity = Severity.CAVEAT) -> "Note":
        note = super().__new__(cls, text)
        note.severity = severity
        return note


# Which layer's frees each kernel tracepoint reports.
_FREE_TRACEPOINT_LAYER = {
    "kfree": Layer.KERNEL_SLAB.value,
    "kmem_cache_free": Layer.KERNEL_SLAB.value,
    "mm_page_free": Layer.KERNEL_PAGE.value,
    "mm_page_free_batched": Layer.KERNEL_PAGE.value,
}


def skipped_frees(stats: SourceStats) -> dict[str, int]:
    """A source's frees the kernel skipped (BPF recursion protection) that no backup program
    saw, per free tracepoint (those with none left out). A recording made before 2026-12-06
    also lists allocation tracepoints in `missed`: allocations made inside memprof's own
    program, by an interrupt or by the program itself, which were never the target's and
    are not a loss (loading.Tracepoints.missed); they are left out here."""
    return {tp: int(n) for tp, n in stats.missed.items() if tp in _FREE_TRACEPOINT_LAYER and n}


def skipped_frees_by_layer(meta: RecordingMeta) -> dict[str, int]:
    """Frees the kernel skipped (BPF recursion protection), per layer: each could be the free
    of an allocation a report shows as still live."""
    out: dict[str, int] = {}
    for stats in meta.sources.values():
        for tracepoint, n in skipped_frees(stats).items():
            layer = _FREE_TRACEPOINT_LAYER[tracepoint]
            out[layer] = out.get(layer, 0) + n
    return out


def unseen_tasks(meta: RecordingMeta) -> list[dict]:
    """The processes no probe ran under while recording (the eBPF source's count of context
    switches no program saw, bpf/kmem.bpf.c), each {"pid", "comm", "threads", "switches"};
    [] when none, or not counted."""
    ebpf = meta.sources.get("ebpf")
    return list(ebpf.detail.get("unseen_tasks") or []) if ebpf is not None else []


def recording_notes(meta: RecordingMeta) -> list[Note]:
    """Plain-words notes on how complete the recording is, for every report: those that
    change the results (CAVEAT) first, then those that only say how it was recorded (INFO).
    The recording's own notes (meta.notes) are caveats."""
    notes = [Note(text) for text in meta.notes]
    if meta.folds:
        notes.append(Note(_folds_note(meta)))
    for name, stats in meta.sources.items():
        failures = int(stats.detail.get("stack_failures", 0) or 0)
        if failures:
            notes.append(Note(f"{name}: {failures} stacks could not be captured (kernel: the stack map full, or its "
                              "bucket taken by another stack; user: the walk failed); the allocations at those sites "
                              "are shown without those frames (a kernel one keeps its call site, Python frames are "
                              "kept)"))
        if stats.detail.get("site_cache_full"):
            notes.append(Note(f"{name}: the call-site stack cache overflowed {stats.detail['site_cache_full']} times; "
                              "more allocations than usual took a fresh stack", Severity.INFO))
        native_sampled = "native" in stats.detail.get("families", ()) and bool(stats.detail.get("native_sample_bytes"))
        if stats.stack_sample_every > 1:
            notes.append(_shared_stacks_note(name, stats, native_sampled, bool(stats.detail.get("kernel_sample_bytes"))))
        if native_sampled:
            notes.append(_native_sampling_note(name, int(stats.detail["native_sample_bytes"])))
        if stats.detail.get("kernel_sample_bytes"):
            notes.append(_kernel_sampling_note(name, int(stats.detail["kernel_sample_bytes"]),
                                               int(stats.detail.get("sampled_kernel_left_out") or 0)))
        notes += [Note(text) for text in _refused_notes(name, stats.detail.get("uprobes") or {})]
        notes += [Note(text) for text in _irregular_notes(name, stats.detail.get("uprobes") or {})]
        notes += [Note(text) for text in _late_probe_notes(name, stats.detail.get("uprobes") or {}, meta.start_ns)]
        notes += [Note(text) for text in _python_notes(name, stats.detail.get("python") or {})]
        notes += [Note(text) for text in _unread_agent_notes(name, stats.detail)]
        notes += [Note(text) for text in _unseen_task_notes(name, stats.detail.get("unseen_tasks") or [])]
        notes += [Note(text, Severity.INFO) for text in _step_source_notes(stats.detail.get("step_sources") or {})]
    return sorted(notes, key=lambda note: note.severity is Severity.INFO)  # stable: caveats first


def _folds_note(meta: RecordingMeta) -> str:
    """What record --max-size folded (meta.folds; capture/compactor.py), in plain words."""
    last = meta.folds[-1]
    window_s = int(last.get("window_ns", 0)) / 1e9
    through = (int(last.get("through_ns", meta.start_ns)) - meta.start_ns) / 1e9
    times = int(last.get("n", len(meta.folds)))
    return (f"record --max-size: the events up to +{through:.1f}s were folded ({times} times, last into "
            f"{window_s:g}s windows): allocations made and freed within one window are counted as one per chain "
            "and window, with their count and bytes. Live bytes are exact at each window's edge, at the end and "
            "at each layer's peak; inside a window they leave out what was folded there.")


# What a step is, by the agent's step source (meta.json sources.agent.detail.step_sources).
STEP_SOURCE_WORDS = {
    "optimizer.step": "an optimizer step",
    "profiler.step": "a torch.profiler step",
    "mark": "the interval between two memprof.mark() calls",
    "forward": "an outermost nn.Module forward (nothing else counted steps: in generate, one token)",
}


def _step_source_notes(step_sources: dict) -> list[str]:
    """One note saying what a step is, per distinct step source (processes by pid)."""
    by_source: dict[str, list[str]] = {}
    for pid, source in step_sources.items():
        by_source.setdefault(str(source), []).append(str(pid))
    return [f"a step is {STEP_SOURCE_WORDS.get(source, source)}"
            + (f" (pids {', '.join(sorted(pids, key=int))})" if len(by_source) > 1 else "")
            for source, pids in sorted(by_source.items())]


def _shared_stacks_note(name: str, stats, native_sampled: bool = False, kernel_sampled: bool = False) -> Note:
    """Stack sharing, the recorder's normal way to keep its cost low, in plain words
    (`native_sampled`, `kernel_sampled`: the libc heap's or the kernel's allocations were
    sampled by size, which their own notes say)."""
    detail = stats.detail
    sampled = [layers for layers, on in (("native_heap's", native_sampled), ("the kernel's", kernel_sampled)) if on]
    recorded = "every allocation and its size are recorded" + (
        f" ({' and '.join(sampled)} are sampled by size: see {'its note' if len(sampled) == 1 else 'their notes'})"
        if sampled else "") + (
        " but the path-name buffers that system calls take and give back before they return, which are counted"
        if detail.get("path_name_buffers_not_recorded") else "")
    return Note(f"{name}: to keep its cost low, memprof walked the call stack of one kernel allocation in "
                f"{stats.stack_sample_every} (memory pages: one in {detail.get('page_stack_sample_every', 1)}, "
                f"malloc and friends: one in {detail.get('user_stack_sample_every', 1)}); the others reuse the "
                f"stack last walked at the same place in the code. This is normal: {recorded}, and Python frames "
                "are read for each (record --stack-every 1 --user-stack-every 1 walks every stack).", Severity.INFO)


def _native_sampling_note(name: str, sample_bytes: int) -> Note:
    """The libc heap's byte sampling (record --native-sample-bytes, on by default), in plain
    words: how it was recorded."""
    return Note(_sampling_text(name, "native_heap is", sample_bytes, "--native-sample-bytes"), Severity.INFO)


def _kernel_sampling_note(name: str, sample_bytes: int, left_out: int) -> Note:
    """The kernel layers' byte sampling (record --kernel-sample-bytes, asked for by name), in
    plain words: a caveat, since the kernel's leak counts are exact without it. `left_out`:
    sampled allocations dropped because the probes' table of them was full."""
    text = _sampling_text(name, "kernel_slab and kernel_page are", sample_bytes, "--kernel-sample-bytes")
    if left_out:
        text += (f"; {left_out:,} sampled allocations were left out, the target holding more of them than the "
                 "probes can follow at once, so the kernel's totals are low")
    return Note(text)


def _sampling_text(name: str, layers: str, sample_bytes: int, option: str) -> str:
    """What byte sampling at `sample_bytes` means for `layers`' totals."""
    n = format_bytes(sample_bytes)
    return (f"{name}: {layers} sampled by size: an allocation of S bytes was recorded with probability "
            f"min(1, S/{n}) and counts max(1, {n}/S) times, so their totals are unbiased estimates; a chain "
            f"of a few small allocations may be missed or over-counted (record {option} 0 records every one).")


def _refused_notes(name: str, uprobes: dict) -> list[str]:
    """Libraries mapped while recording whose probe programs the kernel refused (`refused`:
    symbol -> why): their allocations through those probes are not in the recording."""
    return [f"{name}: the kernel refused the probes of {', '.join(lib['refused'])} in {path} "
            f"({next(iter(lib['refused'].values()))}); its {lib['layer']} allocations through "
            "them are not recorded"
            for path, lib in sorted(uprobes.items()) if lib.get("refused")]


def _irregular_notes(name: str, uprobes: dict) -> list[str]:
    """Libraries whose path led to something other than a regular file when memprof went to
    probe them (replaced by a FIFO or a device link; or nothing, its process gone with the
    /proc/PID/root it was named under): never opened, never probed."""
    return [f"{name}: {path} was not a regular file when memprof went to probe it (replaced since it was "
            f"mapped, or its process gone?); its {lib['layer']} allocations are not recorded"
            for path, lib in sorted(uprobes.items()) if lib.get("not_a_regular_file")]


def _unread_agent_notes(name: str, detail: dict) -> list[str]:
    """The agents' lines still unread when the recording ended (written faster than the
    polls after the command's exit read them: sources/agent_reader/source.py)."""
    unread = int(detail.get("unread_bytes_at_end", 0) or 0)
    if not unread:
        return []
    return [f"{name}: {format_bytes(unread)} of the agents' lines were still unread when the recording ended "
            "(written faster than memprof reads them); the steps, marks and CUDA events in them are not recorded"]


def _unseen_task_notes(name: str, unseen: list[dict]) -> list[str]:
    """The processes no probe ran under (kmem.bpf.c's unseen switches; bpf/README.md "Missed
    frees", 4), in one note: the kernel's frees on their time went unrecorded."""
    if not unseen:
        return []
    switches = sum(int(p.get("switches", 0) or 0) for p in unseen)
    return [f"{name}: no probe ran while {name_processes(unseen)} had a CPU "
            f"({switches} {'time' if switches == 1 else 'times'} seen), a property of this machine (a sandbox's or "
            "hypervisor's agent can do it). What the kernel did on that time went unrecorded, among it the RCU callbacks that "
            "free closed sockets', files' and inodes' memory: kernel allocations freed there are counted as live. "
            "Most are found out when their address is handed out again (the findings' missed frees); the rest "
            "show as kernel findings still held after the target exited (released_at_exit false), which may be "
            "memory already freed."]


def name_processes(unseen: list[dict]) -> str:
    """Processes of `unseen_tasks` by pid and name: 'process 1 (process_api)', or
    'processes 1 (a), 7 (gone)'."""
    names = ", ".join(f"{p.get('pid')} ({p.get('comm') or 'gone'})" for p in unseen)
    return f"{'process' if len(unseen) == 1 else 'processes'} {names}"


def _late_probe_notes(name: str, uprobes: dict, start_ns: int) -> list[str]:
    """Libraries probed only once the target had mapped them (dlopen), after the recording
    began: the target's calls into them before the probes were in place are not recorded. Says how long that window
    was (meta.json's mapped_ns and placed_ns, library_probes.py) and how to close it."""
    notes = []
    for path, lib in sorted(uprobes.items()):
        placed_ns = lib.get("placed_ns")
        if placed_ns is None or placed_ns <= start_ns:
            continue  # placed before the recording began (record --pid: mapped before the attach)
        mapped_ns = lib.get("mapped_ns")
        when = (f"{(placed_ns - mapped_ns) / 1e6:.0f} ms after the target mapped it" if mapped_ns is not None
                else "when memprof's periodic re-read of the target's mappings found it")
        notes.append(f"{name}: {path} was found only once the target loaded it, and probed {when} "
                     f"(+{(placed_ns - start_ns) / 1e9:.3f}s); its {lib.get('layer') or 'library'} allocations before that are not "
                     "recorded (to probe it from the start, make the loader find it: its directory in "
                     "LD_LIBRARY_PATH or the loader cache, ldconfig)")
    return notes


def _python_notes(name: str, python: dict) -> list[str]:
    """What the user should know about Python frames: interpreters without them, and loss."""
    notes = []
    if python and not python.get("enabled", True):
        notes.append(f"{name}: Python frames were off (record --no-python-frames)")
    for path, note in sorted((python.get("interpreters") or {}).items()):
        if not note.get("frames"):
            notes.append(f"{name}: no Python frames for {path}: {note.get('why')}")
    if python.get("stacks_evicted"):
        notes.append(f"{name}: {python['stacks_evicted']} Python stacks were evicted before they were read "
                     "(more new stacks than the map holds within one flush): their events have no Python frames")
    if python.get("map_full"):
        notes.append(f"{name}: {python['map_full']} events lost their Python frames (the Python stack or code map was full)")
    return notes
