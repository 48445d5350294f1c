"""Model state is never a leak (issue 21, item 4): the model's parameters, buffers, gradients
and optimizer state, named by the agent, are totalled apart by role — in find_leaks, the
text and JSON reports, the summary and `check --fail-on-leak` — while a real leak next to
them is still found, to the allocation."""
from __future__ import annotations

import json
from types import SimpleNamespace

from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.budget import leak_totals
from memprof.analysis.checkpoints import find_checkpoints
from memprof.analysis.leaks import LeakReason, exit_times, find_leaks
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.model_state import ModelStateTotal, state_roles
from memprof.analysis.views import About, LeaksView
from memprof.cli.main import cli
from memprof.model.schema import STATE_PREFIX, ModelStateRole
from memprof.report.leaks import render, to_json
from memprof.timeline import timeline
from tests.diff_factories import write_recording
from tests.factories import ev, events_frame, mark

S, KiB = 1_000_000_000, 1024
PID, EXIT_NS, END_NS = 100, 9 * S, 10 * S
WEIGHTS, LEAKED, OPTIMIZER = 1, 2, 4  # stack ids: the model's constructor, the leak, Adam's step
PARAM_BASE, LEAK_BASE = 0x7F00_0000_0000, 0x5500_0000_0000
PARAMETER, GRADIENT, OPTIMIZER_STATE = (ModelStateRole.PARAMETER, ModelStateRole.GRADIENT,
                                        ModelStateRole.OPTIMIZER_STATE)


def note(ts_ns: int, addr: int, size: int, role: ModelStateRole, name: str, layer: str = "torch_cpu") -> dict:
    """The agent's model-state note for one tensor, as the reader writes it."""
    return ev(ts_ns, "mark", addr, size, layer=layer, category=f"{STATE_PREFIX}{role.value}:{name}", pid=PID)


def param_size(i: int) -> int:
    return KiB * (i + 1)


def forty_parameters_and_five_leaked() -> list[dict]:
    """40 parameters (1..40 KiB, stack 1) made at 0.1 s and named at the step mark (1 s) and
    before exit (8.9 s); 5 buffers of 4 KiB (stack 2) made from 2 s to 6 s and never freed."""
    rows = [ev(S // 10 + i, "alloc", PARAM_BASE + i * 0x10_0000, param_size(i), WEIGHTS) for i in range(40)]
    rows.append(dict(ts_ns=S, action="mark", category="step", step=1, pid=PID, tid=PID))
    for at in (S, EXIT_NS - S // 10):
        rows += [note(at, PARAM_BASE + i * 0x10_0000, param_size(i), PARAMETER, f"h.{i // 4}.w{i % 4}.weight")
                 for i in range(40)]
    rows += [ev((2 + k) * S, "alloc", LEAK_BASE + k * 0x1000, 4 * KiB, LEAKED) for k in range(5)]
    return rows + [mark(EXIT_NS, PID)]


def analysed(rows: list[dict], **options):
    """find_leaks as `report leaks` runs it: the timeline (which names the model state), the
    lifetimes, judged at the target's exit."""
    events = timeline(SimpleNamespace(events=events_frame(rows, layer="torch_cpu")))
    return find_leaks(pair_lifetimes(events), end_ns=EXIT_NS, recording_end_ns=END_NS,
                      end_by_pid=exit_times(events), **options)


def test_forty_parameters_are_model_state_and_only_the_five_leaked_are_a_finding():
    result = analysed(forty_parameters_and_five_leaked())
    assert [(f.stack_id, f.kind, f.live_count, f.live_bytes) for f in result.findings] == [
        (LEAKED, "held_at_end", 5, 20 * KiB)]
    assert result.model_state == [ModelStateTotal("parameter", "torch_cpu", "cpu", 40, 820 * KiB)]
    assert [(f.stack_id, f.reason, f.live_count, f.live_bytes) for f in result.not_leaks] == [
        (WEIGHTS, LeakReason.MODEL_STATE.value, 40, 820 * KiB)]
    assert [(t.layer, t.live_bytes, t.findings) for t in leak_totals(result)] == [("torch_cpu", 20 * KiB, 1)]


def test_a_chain_partly_of_model_state_is_a_finding_for_the_rest_only():
    """Three buffers the constructor made that no module owns stay a finding of that chain."""
    rows = forty_parameters_and_five_leaked()
    rows += [ev(S // 5 + k, "alloc", 0x6600_0000_0000 + k * 0x1000, 8 * KiB, WEIGHTS) for k in range(3)]
    result = analysed(sorted(rows, key=lambda row: row["ts_ns"]))
    assert [(f.stack_id, f.live_count, f.live_bytes) for f in result.findings] == [(WEIGHTS, 3, 24 * KiB),
                                                                                   (LEAKED, 5, 20 * KiB)]
    assert result.model_state[0].count == 40


def adam_training(steps: int = 10, n: int = 8) -> list[dict]:
    """n parameters (4..32 KiB); at each step, set_to_none gradients freed and made anew at
    fresh addresses, Adam's exp_avg, exp_avg_sq (same sizes) and step (4 B) made at step 1 and
    kept, and a list that keeps one 1 KiB loss per step (the leak: stack 9). The agent names
    every live tensor at each step mark."""
    size = [4 * KiB * (i + 1) for i in range(n)]
    param = [PARAM_BASE + i * 0x10_0000 for i in range(n)]
    state = {(i, kind): 0x7E00_0000_0000 + (i * 3 + j) * 0x10_0000
             for i in range(n) for j, kind in enumerate(("exp_avg", "exp_avg_sq", "step"))}
    rows = [ev(S // 10 + i, "alloc", param[i], size[i], WEIGHTS) for i in range(n)]
    for k in range(1, steps + 1):
        t = k * S
        grad = [0x7D00_0000_0000 + (k * n + i) * 0x10_0000 for i in range(n)]
        if k > 1:
            rows += [ev(t + 10 + i, "free", 0x7D00_0000_0000 + ((k - 1) * n + i) * 0x10_0000) for i in range(n)]
        rows += [ev(t + 100 + i, "alloc", grad[i], size[i], 3) for i in range(n)]
        if k == 1:
            rows += [ev(t + 200 + i * 3 + j, "alloc", state[(i, kind)], 4 if kind == "step" else size[i], OPTIMIZER)
                     for i in range(n) for j, kind in enumerate(("exp_avg", "exp_avg_sq", "step"))]
        rows.append(ev(t + 300, "alloc", LEAK_BASE + k * 0x1000, KiB, 9))
        mark_at = t + S // 2
        rows.append(dict(ts_ns=mark_at, action="mark", category="step", step=k, pid=PID, tid=PID))
        rows += [note(mark_at, param[i], size[i], PARAMETER, f"fc{i}.weight") for i in range(n)]
        rows += [note(mark_at, grad[i], size[i], GRADIENT, f"fc{i}.weight") for i in range(n)]
        rows += [note(mark_at, state[(i, kind)], 4 if kind == "step" else size[i], OPTIMIZER_STATE,
                      f"fc{i}.weight.{kind}") for i in range(n) for kind in ("exp_avg", "exp_avg_sq", "step")]
    return rows + [mark((steps + 1) * S, PID)]


def test_adam_parameters_gradients_and_optimizer_state_are_totalled_by_role():
    rows = adam_training()
    events = timeline(SimpleNamespace(events=events_frame(rows, layer="torch_cpu")))
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=11 * S, min_points=8)
    result = find_leaks(pair_lifetimes(events), end_ns=11 * S, recording_end_ns=12 * S,
                        end_by_pid=exit_times(events), checkpoints=checkpoints)
    sizes = 4 * KiB * 36  # 4 + 8 + … + 32 KiB
    assert result.model_state == [
        ModelStateTotal("parameter", "torch_cpu", "cpu", 8, sizes),
        ModelStateTotal("gradient", "torch_cpu", "cpu", 8, sizes),  # only the last step's: the others were freed
        ModelStateTotal("optimizer_state", "torch_cpu", "cpu", 24, 2 * sizes + 8 * 4),
    ]
    assert [(f.stack_id, f.kind, f.live_count) for f in result.findings] == [(9, "grows_per_step", 10)]
    assert {f.stack_id for f in result.not_leaks} == {WEIGHTS, 3, OPTIMIZER}


def test_model_state_that_grows_per_step_is_still_not_a_finding():
    """A buffer registered at every step (stack 5) would grow per step; as model state it is
    totalled, not found."""
    rows = []
    for k in range(1, 11):
        addr = 0x7C00_0000_0000 + k * 0x10_0000
        rows += [ev(k * S + 1, "alloc", addr, 64 * KiB, 5),
                 dict(ts_ns=k * S + 2, action="mark", category="step", step=k, pid=PID, tid=PID),
                 note(k * S + 2, addr, 64 * KiB, ModelStateRole.BUFFER, f"cache.k{k}")]
    rows.append(mark(11 * S, PID))
    events = timeline(SimpleNamespace(events=events_frame(rows, layer="torch_cpu")))
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=11 * S, min_points=8)
    result = find_leaks(pair_lifetimes(events), end_ns=11 * S, recording_end_ns=12 * S,
                        end_by_pid=exit_times(events), checkpoints=checkpoints, min_age_ns=0)
    assert result.findings == []
    assert result.model_state == [ModelStateTotal("buffer", "torch_cpu", "cpu", 10, 640 * KiB)]


def test_a_cuda_segment_holding_only_model_state_is_model_state_and_one_holding_more_is_held():
    seg_a, seg_b = 0x10_0000_0000, 0x20_0000_0000
    rows = [
        ev(S // 10, "alloc", seg_a, 2 * 1024 * KiB, 7, layer="cuda_segment", device="cuda:0"),
        ev(S // 10 + 1, "alloc", seg_a + 4096, 4096, 1, layer="cuda_block", device="cuda:0"),
        ev(S // 10 + 2, "alloc", seg_b, 2 * 1024 * KiB, 7, layer="cuda_segment", device="cuda:0"),
        ev(S // 10 + 3, "alloc", seg_b, 4096, 1, layer="cuda_block", device="cuda:0"),
        ev(S // 10 + 4, "alloc", seg_b + 8192, 4096, 2, layer="cuda_block", device="cuda:0"),  # not the model's
        {**note(S, seg_a + 4096, 4096, PARAMETER, "wte.weight", layer="cuda_block"), "device": "cuda:0"},
        {**note(S, seg_b, 4096, PARAMETER, "wpe.weight", layer="cuda_block"), "device": "cuda:0"},
        mark(EXIT_NS, PID),
    ]
    result = analysed(rows)
    assert [(f.layer, f.stack_id, f.live_count) for f in result.findings] == [
        ("cuda_segment", 7, 1), ("cuda_block", 2, 1)]
    assert [(f.layer, f.reason, f.live_count) for f in result.not_leaks] == [
        ("cuda_segment", "model_state", 1), ("cuda_block", "model_state", 2)]
    assert result.model_state == [ModelStateTotal("parameter", "cuda_block", "cuda:0", 2, 8192)]


def test_roles_outside_the_closed_set_are_not_model_state():
    events = events_frame([ev(1, "alloc", 0xA0, 8, category="state:parameter:w"),
                           ev(2, "alloc", 0xB0, 8, category="state:activation:x"),
                           ev(3, "alloc", 0xC0, 8, category="parameter"), ev(4, "alloc", 0xD0, 8)])
    assert state_roles(pair_lifetimes(events).allocations).tolist() == ["parameter", None, None, None]


def test_json_and_text_report_carry_the_totals_apart():
    view = LeaksView(analysed(forty_parameters_and_five_leaked()), About(path="run.memprof"))
    doc = to_json(view)
    assert doc["model_state"] == [{"role": "parameter", "layer": "torch_cpu", "device": "cpu", "count": 40,
                                   "live_bytes": 820 * KiB}]
    assert [f["live_count"] for f in doc["findings"]] == [5]
    assert doc["not_leaks"][0]["reason"] == "model_state"
    console = Console(record=True, width=200)
    render(view, console)
    text = console.export_text()
    assert "Model state, not a leak" in text
    assert "    40 parameters, 820.0 KiB (torch_cpu, cpu)" in text
    assert "model state, not a leak" in text  # the chain's why line


def test_the_commands_count_no_model_state(tmp_path):
    events = events_frame(forty_parameters_and_five_leaked(), layer="torch_cpu")
    recording = write_recording(tmp_path / "run.memprof", events, end_ns=END_NS)
    runner = CliRunner()
    leaks = json.loads(runner.invoke(cli, ["report", "leaks", str(recording), "--format", "json"]).output)
    assert [(f["layer"], f["live_count"]) for f in leaks["findings"]] == [("torch_cpu", 5)]
    assert leaks["model_state"][0]["count"] == 40
    summary = json.loads(runner.invoke(cli, ["report", str(recording), "--format", "json"]).output)
    assert [f["live_count"] for f in summary["findings"]] == [5] and summary["model_state"] == leaks["model_state"]
    assert "model state, not a leak: 40 parameters, 820.0 KiB (torch_cpu, cpu)" in \
        runner.invoke(cli, ["report", str(recording)]).output
    page = json.loads(runner.invoke(cli, ["report", "html", str(recording), "--format", "json"]).output)
    assert page["leaks"]["model_state"] == leaks["model_state"]
    assert page["leaks_text"]["model_state"] == ["40 parameters, 820.0 KiB (torch_cpu, cpu)"]
    check = runner.invoke(cli, ["check", str(recording), "--fail-on-leak"])
    assert check.exit_code == 6
    assert check.stdout.splitlines()[0] == "FAIL leak torch_cpu 20.0 KiB in 1 finding held at the end (--fail-on-leak)"


def test_a_model_freed_before_the_end_is_totalled_at_its_peak():
    """examples/train.py's model is a local of main: it goes as main returns, before the
    interpreter finalizes (the end). Its state is totalled when it was largest."""
    from tests.factories import events_frame, ev
    from memprof.analysis.leaks import find_leaks
    from memprof.analysis.lifetimes import pair_lifetimes
    from memprof.timeline import timeline
    from types import SimpleNamespace
    S = 1_000_000_000
    rows = [ev(S, "alloc", 0x1000, 4096, 1), ev(S + 1, "alloc", 0x2000, 512, 1),
            dict(ts_ns=2 * S, action="mark", category="state:parameter:fc.weight", addr=0x1000, size_bytes=4096),
            dict(ts_ns=2 * S, action="mark", category="state:parameter:fc.bias", addr=0x2000, size_bytes=512),
            ev(9 * S, "free", 0x1000), ev(9 * S + 1, "free", 0x2000),
            dict(ts_ns=10 * S, action="mark", category="exit", pid=100, tid=100)]
    events = timeline(SimpleNamespace(events=events_frame(rows, layer="torch_cpu")))
    result = find_leaks(pair_lifetimes(events), end_ns=10 * S, recording_end_ns=11 * S)
    assert [(t.role, t.count, t.live_bytes) for t in result.model_state] == [("parameter", 2, 4608)]
    assert result.findings == []
