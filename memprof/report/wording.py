"""The words every view uses about leak findings, in one place: the terminal reports
(leaks.py, summary.py), the HTML page and the tables of the exports say the same thing in
the same words, and of a distributed job's ranks. Plain text, except `note_line` and
`diverging_line` (rich markup, escaped). Render only."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from memprof.analysis.loss import Severity
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_duration_ns

if TYPE_CHECKING:
    from memprof.analysis.leaks import LeakFinding, LeakResult
    from memprof.analysis.model_state import ModelStateTotal
    from memprof.analysis.ranks import RankUse


def left_out_json(result: LeakResult) -> dict[str, Any]:
    """What --min-age and --top left out of `result` (see LeakResult)."""
    return {"younger_count": int(result.younger_count), "younger_bytes": int(result.younger_bytes),
            "top": result.top, "findings_total": int(result.findings_total),
            "not_leaks_total": int(result.not_leaks_total)}


def note_line(note: str) -> str:
    """A note as markup: one that changes the results (a loss.Note of severity CAVEAT) is a
    yellow '!', information (INFO, or plain text of no known severity) a dim 'note:'."""
    if getattr(note, "severity", Severity.INFO) is Severity.CAVEAT:
        return f"[yellow]! {escape(str(note))}[/]"
    return f"[dim]note: {escape(str(note))}[/]"


def shown_of(shown: int, total: int, top: int | None, one: str, many: str) -> str:
    """'21 findings', or 'showing 10 of 21 findings (--top 10)' when --top cut the list."""
    if shown >= total:
        return counted(shown, one, many)
    return f"showing {shown} of {counted(total, one, many)} (--top {top})"


def min_age_left_out(result: LeakResult) -> str:
    """One line on the allocations live at the end that --min-age left out ('' when none)."""
    if not result.younger_count:
        return ""
    younger = counted(result.younger_count, "allocation", "allocations")
    return (f"--min-age {short_duration(result.min_age_ns)} left out {younger} "
            f"({format_bytes(result.younger_bytes)}) live at the end but younger than that: in flight, not counted "
            "(--min-age 0 counts them)")


def unrecorded_heap(result: LeakResult) -> str:
    """The line said under "no leaks" where the recording has no native family (the default
    sources): the user hunting a Python-heap leak must not read "no leaks" as "no leak
    anywhere". '' where a leak was found, or the heap was recorded, or that is unknown."""
    if result.findings or result.heap_recorded is not False:
        return ""
    return ("Not recorded: the C library's heap (malloc and friends: Python's objects, NumPy's arrays); "
            "a leak there shows only with `memprof record --sources +native`.")

KIND_LABELS = {"held_at_end": "held at the end", "grows_per_step": "grows per step", "not_a_leak": "not a leak"}


# Why memory that is held is not a leak, by LeakFinding.reason (those said in one fixed line).
_NOT_A_LEAK_WHY = {
    "cached_segment": "segments PyTorch's caching allocator keeps for reuse, with no live tensor block inside "
                      "(torch.cuda.empty_cache() returns them): not a leak",
    "slab_pages": "pages the slab allocator took for its caches, or its bookkeeping of them; it keeps and reuses "
                  "them (a leak of the objects in them shows in kernel_slab): not a leak",
    "address_space": "the process's own address space (page tables, memory areas): it grows with the memory the "
                     "process maps (shown in the other layers) and goes with it: not a leak",
    "memprof_own": "memprof's own: its BPF programs, its uprobes or its agent in this process took it, not the "
                   "target: not a leak",
    "startup": "made once at start-up (loading the program and its libraries, imports, set-up before the first step) "
               "and kept until exit, not grown since: not a leak",
    "threads": "the kernel objects of threads still running at the end (task, stack, pid): not a leak",
    "kernel_cache": "a kernel cache (page cache, dentries, inodes) kept after the files were closed; the kernel "
                    "reclaims it under memory pressure: not a leak",
    "model_state": "the model's own tensors (parameters, buffers, gradients, optimizer state), kept for the whole "
                   "job: model state, not a leak",
    "framework_state": "DistributedDataParallel's gradient buckets (its reducer's flat copies of the gradients), made "
                       "as it starts and rebuilt once, kept for the whole job and not grown: not a leak",
}
# A CUDA segment of reason "model_state" holds the model's tensors rather than being one.
_MODEL_STATE_SEGMENT_WHY = ("segments PyTorch's caching allocator holds for the model's own tensors (parameters, "
                            "buffers, gradients, optimizer state), and for nothing else: model state, not a leak")

# A recording without module boundaries (record --torch-modules was not asked for).
MODULES_NOT_TRACKED = ("no module boundaries in this recording: record with `memprof record --torch-modules` to "
                       "see which nn.Module allocated (every allocation here is in no module)")

MODEL_STATE_HEADING = "Model state, not a leak"
MODEL_STATE_WHY = ("the model's own tensors live at the end (or at their peak, where the model went before the "
                   "end), kept for the whole job (counted in no finding)")
# How each ModelStateRole value is said, one and many.
ROLE_WORDS = {"parameter": ("parameter", "parameters"), "buffer": ("buffer", "buffers"),
              "gradient": ("gradient", "gradients"),
              "optimizer_state": ("optimizer state tensor", "optimizer state tensors")}


def model_state_json(result: LeakResult) -> list[dict[str, Any]]:
    """The model state live at the end, or at its peak where it held more then
    (LeakResult.model_state), one dict per role, layer
    and device: role, layer, device, count (allocations: one per tensor storage), live_bytes."""
    return [{"role": t.role, "layer": t.layer, "device": t.device, "count": int(t.count),
             "live_bytes": int(t.live_bytes)} for t in result.model_state]


def model_state_line(total: ModelStateTotal) -> str:
    """'40 parameters, 1.50 MiB (torch_cpu, cpu)'."""
    one, many = ROLE_WORDS.get(total.role, (total.role, total.role))
    return f"{counted(total.count, one, many)}, {format_bytes(total.live_bytes)} ({total.layer}, {total.device})"


def explain(finding: LeakFinding, result: LeakResult) -> str:
    """One line, in plain words, of why the finding has its kind."""
    unit = result.checkpoints.unit if result.checkpoints is not None else "step"
    if finding.reason == "grows":
        return (f"grew at {finding.rises} of {finding.points - 1} {unit} boundaries, by "
                f"{format_bytes(finding.slope_bytes_per_step)} per {unit} (Theil–Sen), "
                f"{_percent(finding.confidence)} confidence it rises (Mann–Kendall)"
                + ("; released only before the end, what each cycle left behind adding up until then"
                   if finding.released_before_end else ""))
    if finding.reason == "plateau":
        return (f"filled to {format_bytes(finding.live_bytes)} by {unit} {finding.plateau_from}, then held steady: "
                "a cache or pool, not a leak")
    if finding.reason == "grows_within":
        return (f"grew {format_bytes(finding.slope_bytes_per_step)} per {unit} in the same "
                f"{counted(finding.live_count, 'buffer', 'buffers')} made larger each {unit}, up to "
                f"{format_bytes(finding.live_bytes)}, and was released before the end: working memory that a request "
                "or step grows and gives back (a KV cache, a backward's gradients), not a leak")
    if finding.reason == "sawtooth" and finding.within_slope_bytes_per_step:
        return (f"grows {format_bytes(finding.within_slope_bytes_per_step)} per {unit} within each cycle and is "
                f"released when the cycle ends ({finding.resets} times, up to {format_bytes(finding.live_bytes)}): "
                "working memory that a request or step grows and gives back (a KV cache, a backward's gradients), "
                "not a leak")
    if finding.reason == "sawtooth":
        return (f"rose and fell back {finding.resets} times, up to {format_bytes(finding.live_bytes)}: "
                f"a buffer filled and released every few {unit}s, not a leak")
    if finding.reason == "model_state" and finding.layer == "cuda_segment":
        return _MODEL_STATE_SEGMENT_WHY
    if finding.reason in _NOT_A_LEAK_WHY:
        return _NOT_A_LEAK_WHY[finding.reason]
    if finding.released_at_exit:
        return "held when the target began to exit; only its exit released it"
    return ("held when the target began to exit, and still held after it" if target_exited(result)
            else "still held when the recording stopped")


def placement(finding: LeakFinding) -> str:
    """'on rank 2 (host node-a)', 'on ranks 0, 1, 3 (hosts a, b)'; '' for a finding without ranks."""
    if not finding.ranks:
        return ""
    ranks = ", ".join(str(rank) for rank in finding.ranks)
    hosts = ", ".join(finding.hosts)
    where = f" ({'host' if len(finding.hosts) == 1 else 'hosts'} {hosts})" if finding.hosts else ""
    return f"on {'rank' if len(finding.ranks) == 1 else 'ranks'} {ranks}{where}"


def rank_json(rank: RankUse) -> dict:
    """One rank of a distributed job as `report` and the job report give it (ranks.RankUse)."""
    return {"rank": rank.rank, "host": rank.host, "pids": list(rank.pids), "layer": rank.layer,
            "peak_bytes": rank.peak_bytes, "end_bytes": rank.end_bytes,
            "growth_bytes_per_step": rank.growth_bytes_per_step, "steps": rank.steps, "diverges": rank.diverges}


def diverging_line(rank: RankUse) -> str:
    """'  ! rank 2 on node-a (pid 5102): why it differs from the other ranks' (markup)."""
    where = f" on {escape(rank.host)}" if rank.host else ""
    return f"  [yellow]! rank {rank.rank}[/]{where} (pid {', '.join(map(str, rank.pids))}): {escape(rank.diverges)}"


def kind_label(finding: LeakFinding, result: LeakResult) -> str:
    """'held at the end', 'grows per step' ('per window' where growth was judged over time
    windows), 'not a leak'."""
    label = KIND_LABELS.get(finding.kind, finding.kind)
    if result.checkpoints is not None and finding.kind == "grows_per_step":
        return label.replace("per step", f"per {result.checkpoints.unit}")
    return label


def _percent(fraction: float | None) -> str:
    if fraction is None:
        return "?"
    return f"{min(fraction, 0.9999) * 100:.2f}%" if fraction < 1 else "99.99%+"


def target_exited(result: LeakResult) -> bool:
    """Whether the target began to exit before the recording stopped."""
    return result.end_ns < result.recording_end_ns


def finding_chain(finding: LeakFinding, chains: dict[int, list[dict]]) -> list[dict]:
    """The finding's frames, innermost first ([] without a stack)."""
    return [] if finding.stack_id is None else chains.get(finding.stack_id, [])


def short_duration(ns: int) -> str:
    """A duration without trailing zero decimals: 500_000_000 → '500ms'."""
    return re.sub(r"\.0+(?=[a-z])", "", format_duration_ns(ns))


def counted(n: int, one: str, many: str) -> str:
    """'1 finding', '3 findings'."""
    return f"{n} {one if n == 1 else many}"
