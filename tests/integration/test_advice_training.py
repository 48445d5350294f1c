"""Advice rules `autograd-graph-kept` and `activations-peak` (issue 22) on real CPU training
loops recorded under `memprof record`, both ways, four short recordings (module-scoped):

- examples/loss_accumulation.py sums each step's evaluation loss as a tensor: every step's
  graph stays, 264,708 bytes a step of what its forward saved (the example's docstring works it
  out); autograd-graph-kept gives that growth within 2 % and names Model.forward's two lines;
  with --fixed (`.item()`) it is silent. activations-peak is silent on both: what earlier steps
  kept is not the peak step's, and one step's activations are small beside the weights.
- examples/activations_peak.py (--torch-modules): six MLP blocks with a large batch; the
  activations make the peak, each of blocks.0 … blocks.4 holds exactly 2,629,632 bytes at it,
  and checkpointing blocks.* is the advice; with --wide the weights, gradients and Adam's
  state make the peak: silent. autograd-graph-kept is silent on both.

The rules are judged in process (memprof.api), each alone: another rule's failure is its own
test's. Unit tests with exact synthetic numbers: tests/unit/test_advice_{autograd,activations}.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memprof.analysis.advice import activations, autograd
from memprof.api import analyse

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LOSS_ACCUMULATION = EXAMPLES / "loss_accumulation.py"
ACTIVATIONS_PEAK = EXAMPLES / "activations_peak.py"
KEPT_BYTES_PER_STEP = 2 * 64 * 512 * 4 + 64 * 10 * 4 + 4   # loss_accumulation.KEPT_BYTES_PER_STEP: 264708
STEPS = 40
BLOCK_BYTES = 1024 * (10 * 64 + 2) * 4                      # activations_peak.py, one block at the peak: 2,629,632


def record(run_memprof, tmp_path_factory, script: Path, *script_args, modules: bool = False) -> dict:
    """The two rules' verdicts on `script SCRIPT_ARGS` recorded (with --torch-modules if `modules`)."""
    folder = tmp_path_factory.mktemp(script.stem)
    path = folder / f"{script.stem}.memprof"
    options = ["--torch-modules"] if modules else []
    result = run_memprof("record", "-q", "-o", path, *options, "--", sys.executable, script, *script_args,
                         cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    analysed = analyse(path)
    return {rule.RULE_ID: rule.check(analysed) for rule in (autograd, activations)}


@pytest.fixture(scope="module")
def kept_graph(run_memprof, tmp_path_factory) -> dict:
    return record(run_memprof, tmp_path_factory, LOSS_ACCUMULATION)


@pytest.fixture(scope="module")
def item_summed(run_memprof, tmp_path_factory) -> dict:
    return record(run_memprof, tmp_path_factory, LOSS_ACCUMULATION, "--fixed")


@pytest.fixture(scope="module")
def narrow(run_memprof, tmp_path_factory) -> dict:
    return record(run_memprof, tmp_path_factory, ACTIVATIONS_PEAK, modules=True)


@pytest.fixture(scope="module")
def wide(run_memprof, tmp_path_factory) -> dict:
    return record(run_memprof, tmp_path_factory, ACTIVATIONS_PEAK, "--wide", modules=True)


def forward_lines() -> list[int]:
    """Model.forward's two `h = self.act(...)` lines in loss_accumulation.py."""
    lines = LOSS_ACCUMULATION.read_text().splitlines()
    return [i for i, line in enumerate(lines, 1) if line.strip().startswith("h = self.act(")]


def test_a_kept_graph_gets_its_growth_per_step_and_forward_lines(kept_graph):
    (advice,) = kept_graph[autograd.RULE_ID].advice
    numbers = advice.numbers
    assert numbers["growth_bytes_per_step"] == pytest.approx(KEPT_BYTES_PER_STEP, rel=0.02)
    assert numbers["steps"] == STEPS
    # Every step's graph, but for one or two at the ends of the trend's checkpoints.
    assert (STEPS - 2) * KEPT_BYTES_PER_STEP <= numbers["kept_bytes"] <= STEPS * KEPT_BYTES_PER_STEP
    assert advice.saving_bytes == numbers["kept_bytes"]
    named = {line["line"]: line for line in numbers["forward_lines"]}
    assert len(forward_lines()) == 2
    for line in forward_lines():
        entry = named[f"{LOSS_ACCUMULATION}:{line}"]
        assert entry["function"] == "Model.forward"
        assert entry["bytes_per_step"] == pytest.approx(64 * 512 * 4, rel=0.02)   # a ReLU's output, 131072
    validate = next(i for i, line in enumerate(LOSS_ACCUMULATION.read_text().splitlines(), 1)
                    if line.strip().startswith("return criterion(model(x), y)"))
    (call,) = numbers["forward_calls"]     # every tensor of the graph: validate's criterion(model(x), y)
    assert call["line"] == f"{LOSS_ACCUMULATION}:{validate}" and call["function"] == "validate"
    assert advice.layer == "torch_cpu"
    assert "loss_accumulation.py:" in advice.title and ".item()" in advice.change


def test_summing_item_gets_no_advice(item_summed):
    assert not item_summed[autograd.RULE_ID].advice
    assert item_summed[autograd.RULE_ID].why_not == "no tensor chain (torch_cpu, cuda_block) grows per step"


def test_one_steps_activations_beside_the_weights_get_no_activation_advice(kept_graph, item_summed):
    """What earlier steps' graphs kept is not the peak step's activations (the leak is the other rule's)."""
    for judged in (kept_graph, item_summed):
        assert not judged[activations.RULE_ID].advice
        assert "under 50% or 4.0 MiB" in judged[activations.RULE_ID].why_not


def test_activations_making_the_peak_get_checkpointing(narrow):
    (advice,) = narrow[activations.RULE_ID].advice
    numbers = advice.numbers
    assert advice.layer == "torch_cpu" and numbers["share"] > 0.8
    plan = numbers["checkpoint"]
    assert plan["parent"] == "blocks" and sorted(plan["modules"]) == [f"blocks.{i}" for i in range(6)]
    held = [numbers["modules"][f"blocks.{i}"] for i in range(6)]
    assert held[:5] == [BLOCK_BYTES] * 5        # blocks.5's output may be freed already at the peak
    assert plan["recomputed_bytes"] == BLOCK_BYTES
    # Σ held − outputs − one block: 10,526,720 bytes with the peak in backward past the head
    # (blocks.5's output freed); an output either way.
    assert 9 << 20 <= advice.saving_bytes <= 11 << 20
    assert advice.title == "Activations make torch_cpu's peak: checkpoint blocks.*"
    assert not narrow[autograd.RULE_ID].advice


def test_weights_making_the_peak_get_no_advice(wide):
    assert not wide[activations.RULE_ID].advice
    assert wide[activations.RULE_ID].why_not.startswith("torch_cpu's activations at its peak:")
    assert not wide[autograd.RULE_ID].advice
