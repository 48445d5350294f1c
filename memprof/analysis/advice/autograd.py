"""Advice rule `autograd-graph-kept`: the autograd graph is kept across steps.

A forward saves tensors for its backward (a ReLU's output, a Linear's input, log_softmax's
result); backward frees them. When a loss or an output that carries its graph outlives the
step (`total_loss += loss`, `outputs.append(out)`) and no backward ever runs on that graph (an
evaluation forward without torch.no_grad(), a metric), every step's saved tensors stay: the
PyTorch allocator's chains allocated inside module forwards grow per step together.

Read from `report leaks` (every finding, not its top 10): findings of kind grows_per_step in
torch_cpu or cuda_block whose chain passes an nn.Module call (Module._call_impl in its Python
frames; or, recorded with --torch-modules, a module path), in a recording where a backward ran.
Their Theil-Sen slopes (bytes per step) add up to the growth; the bytes they held (at the end,
or at their highest checkpoint when released before it) are the saving. The advice names the
lines of the user's code that made them (the forward's) and the line that called the outermost
module (`loss = criterion(model(x), y)`: what that call returned carries the graph). One chain alone is
not a graph (a graph keeps what several ops saved): a tensor kept in a list, which `report
leaks` shows as it is; `.detach()` would not free it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprof.analysis.advice.chain_text import user_frame, where
from memprof.analysis.advice.forwards import backward_ran, forward_caller, in_forward
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.leaks import LeakKind
from memprof.model.schema import Layer
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.leaks import LeakFinding

MIN_GROWTH = Threshold(
    "MIN_GROWTH_BYTES_PER_STEP", 16 * 1024, "bytes",
    "growth per step of the tensor chains allocated in forwards, together; less is a few scalars kept, not a graph")
MIN_CHAINS = Threshold(
    "MIN_CHAINS", 2, "count",
    "chains allocated in forwards that grow together; one alone is one tensor kept (report leaks), "
    "not what a graph saved")
THRESHOLDS: tuple[Threshold, ...] = (MIN_GROWTH, MIN_CHAINS)
TENSOR_LAYERS = (Layer.CUDA_BLOCK.value, Layer.TORCH_CPU.value)  # where tensors are: one advice per layer
SHOWN_LINES = 3  # forward lines the evidence names, most bytes per step first


@dataclass(frozen=True)
class GrowingChain:
    """One chain of a tensor layer growing per step inside a forward: its slope (bytes per
    step), what it held (`kept_bytes`), the user's line that made it (`frame`) and the user's
    line that called the outermost module (`caller`: the forward whose result carries the
    graph), each None without a frame of the user's code; its module path (None: not recorded)."""

    stack_id: int | None
    slope: float
    kept_bytes: int
    frame: dict | None
    caller: dict | None
    module: str | None


def check(facts: Facts) -> Verdict:
    """Advice per tensor layer whose chains allocated in forwards grow per step together."""
    if not backward_ran(facts):
        return silent("no backward ran in this recording (no gradients, no optimizer steps): "
                      "a graph is kept across training steps only")
    leaks = facts.leaks(top=None)
    growing = [f for f in leaks.result.findings
               if f.kind == LeakKind.GROWS_PER_STEP.value and f.layer in TENSOR_LAYERS and f.slope_bytes_per_step]
    if not growing:
        return silent("no tensor chain (torch_cpu, cuda_block) grows per step")
    advice = [a for layer in TENSOR_LAYERS
              if (a := _layer_advice(layer, [f for f in growing if f.layer == layer], leaks)) is not None]
    if advice:
        return fired(*advice)
    return silent(f"{len(growing)} tensor chain(s) grow per step, but not {MIN_CHAINS.value:g} or more inside "
                  f"module forwards by {format_bytes(int(MIN_GROWTH.value))}/step together: a kept tensor, "
                  "not a graph (report leaks)")


def _layer_advice(layer: str, findings: list[LeakFinding], leaks) -> Advice | None:
    chains = _in_forwards(findings, leaks.chains)
    slope = sum(c.slope for c in chains)
    if len(chains) < MIN_CHAINS.value or slope < MIN_GROWTH.value:
        return None
    return _advice(layer, chains, slope, _steps(leaks.result))


def _in_forwards(findings: list[LeakFinding], frames_of: dict) -> list[GrowingChain]:
    """The findings' chains made inside module forwards, one per stack id (a chain split by
    its fate at exit has one trend: its slope counts once, its bytes add up), most growth first."""
    by_stack: dict = {}
    for f in findings:
        frames = frames_of.get(f.stack_id, []) if f.stack_id is not None else []
        if f.module is None and not in_forward(frames):
            continue
        seen = by_stack.get(f.stack_id)
        kept = f.live_bytes + (seen.kept_bytes if seen else 0)
        by_stack[f.stack_id] = GrowingChain(f.stack_id, float(f.slope_bytes_per_step), kept, user_frame(frames),
                                            forward_caller(frames), f.module)
    return sorted(by_stack.values(), key=lambda c: (-c.slope, -c.kept_bytes))


def _steps(result) -> int | None:
    """The steps the trends were judged over (the last checkpoint's step), None without steps."""
    points = result.checkpoints
    if points is None or not points.by_step or not len(points.labels):
        return None
    return int(points.labels[-1])


def _advice(layer: str, chains: list[GrowingChain], slope: float, steps: int | None) -> Advice:
    kept = sum(c.kept_bytes for c in chains)
    lines, calls = _lines(chains, "frame"), _lines(chains, "caller")
    modules = tuple(dict.fromkeys(c.module for c in chains if c.module is not None))
    made_at = lines[0]["line"] if lines else (f"module {modules[0]}" if modules else "a module's forward")
    over = f"over {steps} steps" if steps is not None else "over the recording"
    per_step = format_bytes(int(round(slope)))
    return Advice(
        rule=RULE_ID,
        title=f"The autograd graph is kept across steps: {per_step} more each step, saved by the forward at "
              f"{_short(made_at)}",
        evidence=_evidence(layer, chains, per_step, kept, over, lines, calls),
        change=("Keep numbers, not tensors, past the step: sum `loss.item()` (or `loss.detach()`), not `loss`; "
                "store `output.detach()`; run forwards no backward follows (evaluation, metrics) under "
                "`torch.no_grad()`. Look for what keeps the result of the call at "
                f"{calls[0]['line'] if calls else made_at}."),
        saving=f"{format_bytes(kept)} not kept {over.replace('over', 'by the end of these')} "
               f"({per_step} per step, for as long as the job runs)",
        saving_bytes=int(kept),
        chains=tuple(c.stack_id for c in chains),
        modules=modules,
        layer=layer,
        numbers={"growth_bytes_per_step": float(slope), "kept_bytes": int(kept), "steps": steps,
                 "chains": len(chains), "forward_lines": lines, "forward_calls": calls},
    )


def _evidence(layer: str, chains: list[GrowingChain], per_step: str, kept: int, over: str, lines: list[dict],
              calls: list[dict]) -> tuple[str, ...]:
    made = [f"{format_bytes(int(round(line['bytes_per_step'])))}/step allocated at {line['line']} "
            f"({line['function']})" + (f" in module {line['module']}" if line["module"] is not None else "")
            for line in lines[:SHOWN_LINES]]
    called = [f"The forwards were called at {_listed(calls)}: a result of that call (a loss, an output) carries "
              "their graph past the step (a sum, a list)."] if calls else []
    return (f"{len(chains)} chains of {layer} allocated inside nn.Module forwards grow together by {per_step} per "
            f"step (Theil–Sen slopes of report leaks) {over}, holding {format_bytes(kept)}: the tensors each step's "
            "forward saved for a backward, still alive after it.",
            *made, *called,
            "A backward ran in this recording (gradients, optimizer steps) and did not free these.")


def _short(line: str) -> str:
    """A "file:line" with the file's name only (the title's; the evidence keeps the path)."""
    return line.rsplit("/", 1)[-1]


def _lines(chains: list[GrowingChain], which: str) -> list[dict]:
    """The user's lines that made the growing chains (`which` "frame") or called their
    forwards ("caller"), most bytes per step first ("line": "file:line", "function", and for
    the lines that made them the chain's "module"; chains without such a frame are left out)."""
    lines: dict[str, dict] = {}
    for c in chains:
        frame = getattr(c, which)
        if frame is None:
            continue
        named = {"module": c.module} if which == "frame" else {}
        line = lines.setdefault(where(frame), {"line": where(frame), "function": frame.get("function"),
                                               "bytes_per_step": 0.0, **named})
        line["bytes_per_step"] += c.slope
    # Ties (two ReLUs saving as much) by file and line: the title names the same one every run.
    return sorted(lines.values(), key=lambda line: (-line["bytes_per_step"], _file_and_line(line["line"])))


def _file_and_line(where_: str) -> tuple[str, int]:
    file, _, line = where_.rpartition(":")
    return (file, int(line)) if line.isdigit() else (where_, 0)


def _listed(calls: list[dict]) -> str:
    return ", ".join(f"{call['line']} ({call['function']}, {format_bytes(int(round(call['bytes_per_step'])))}/step)"
                     for call in calls[:SHOWN_LINES])


RULE_ID = "autograd-graph-kept"
RULE = Rule(
    id=RULE_ID,
    title="The autograd graph is kept across steps",
    trigger=(f"in a recording where a backward ran, at least {MIN_CHAINS.value:g} tensor chains (torch_cpu or "
             "cuda_block) allocated inside nn.Module forwards grow per step (report leaks: grows_per_step), by "
             f"{format_bytes(int(MIN_GROWTH.value))} per step or more together"),
    evidence=("the growth per step (the findings' Theil–Sen slopes, summed), the steps, the bytes held, and the "
              "user's lines in the forward that made them (file:line), with module paths under --torch-modules"),
    advice=("keep numbers, not tensors, past the step: .item() or .detach() on what is accumulated, "
            "torch.no_grad() around forwards no backward follows"),
    saving="what the growing chains held (growth per step × steps): none of it would be kept",
    thresholds=THRESHOLDS,
    check=check,
)
