"""Advice rule `activations-peak` (issue 22) on synthetic training recordings with known
answers, both ways. The trigger: four transformer-style blocks (blocks.0 … blocks.3) whose
forward keeps fc1's output (4 units), GELU's (4 units) and the block's own output (1 unit) for
backward, a 64 KiB head, 1 MiB of parameters and as much of gradients: the activations make
the peak, and checkpointing each of blocks.* frees Σ held − outputs − the largest block, exact.
Without module paths it names the forward's lines and micro-batching's saving; a Sequential
of single ops gets micro-batching alone. Controls: a wide model (weights make the peak), tiny
activations, activations kept across steps (a leak's, not the step's), no backward.
The real workloads (examples/activations_peak.py) are in tests/integration/test_advice_training.py."""
from __future__ import annotations

import pytest

from memprof.analysis.advice import activations
from memprof.analysis.advice.activations import group_name
from memprof.api import analyse
from tests.training_factories import KiB, MODEL, PID, MiB, S, Model, enter, ev, forward_chain, leave, write

STEPS = 3
FC, ACT, OUT, HEAD = 5, 6, 7, 8  # stack ids
CHAINS = {
    FC: forward_chain("Linear.forward", 30),
    ACT: forward_chain("GELU.forward", 30),
    OUT: [("native", "c10::alloc_cpu", "libc10.so", None, None), ("python", "Block.forward", None, MODEL, 30),
          ("python", "Module._call_impl", None, "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1784),
          ("python", "train", None, "/src/train.py", 50)],
    HEAD: forward_chain("Linear.forward", 40, caller="Model.forward"),
}
UNIT = 256 * KiB


class Forward:
    """Rows of one forward at `t` on the training thread, each allocation at a fresh address,
    with module boundaries when `tracked`; `made` keeps the addresses for the backward."""

    def __init__(self, t: int, tracked: bool, step: int, layer: str = "torch_cpu", device: str = "cpu"):
        self.t, self.tracked, self.rows, self.made = t, tracked, [], []
        self.at = dict(layer=layer, device=device, pid=PID)
        self.base = 0x5000_0000_0000 + step * 0x1000_0000

    def _tick(self) -> int:
        self.t += 10
        return self.t

    def call(self, path: str) -> None:
        if self.tracked:
            self.rows.append(enter(self._tick(), path))

    def back(self, outer: str | None) -> None:
        if self.tracked:
            self.rows.append(leave(self._tick(), outer))

    def alloc(self, size: int, stack: int) -> None:
        addr = self.base + len(self.made) * 0x100_0000
        self.rows.append(ev(self._tick(), "alloc", addr, size, stack, **self.at))
        self.made.append(addr)

    def blocks(self, count: int, unit: int) -> None:
        """Model.forward: `count` blocks, then the head."""
        self.call("")
        self.call("blocks")
        for i in range(count):
            self.call(f"blocks.{i}")
            for child, stack in (("fc1", FC), ("act", ACT)):
                self.call(f"blocks.{i}.{child}")
                self.alloc(4 * unit, stack)
                self.back(f"blocks.{i}")
            self.alloc(unit, OUT)  # x + fc2(…): made in the block itself
            self.back("blocks")
        self.back("")
        self.call("head")
        self.alloc(64 * KiB, HEAD)
        self.back("")
        self.back(None)

    def sequential(self, count: int, size: int) -> None:
        """nn.Sequential of single ops net.0 … net.N: one output each."""
        self.call("")
        self.call("net")
        for i in range(count):
            self.call(f"net.{i}")
            self.alloc(size, FC)
            self.back("net")
        self.back("")
        self.back(None)


def training(*, params: int = MiB, blocks: int = 4, unit: int = UNIT, tracked: bool = True, grads: bool = True,
             kept: bool = False, sequential: int = 0, layer: str = "torch_cpu",
             device: str = "cpu") -> tuple[list[dict], int]:
    """STEPS steps: a forward (Forward.blocks, or .sequential of that many ops), backward frees
    its activations (unless `kept`) and makes the gradients in step 1."""
    model = Model(params, grads=grads, layer=layer, device=device)
    rows = model.made()
    for k in range(1, STEPS + 1):
        forward = Forward(k * S, tracked, k, layer, device)
        forward.sequential(sequential, 5 * unit) if sequential else forward.blocks(blocks, unit)
        rows += forward.rows
        if not kept:
            rows += [ev(k * S + S // 4 + n, "free", addr, **forward.at)
                     for n, addr in enumerate(reversed(forward.made))]
        rows += model.backward(k, k * S + S // 4 + 100) + model.step_mark(k)
    return rows, (STEPS + 1) * S


def judge(tmp_path, rows_end):
    rows, end = rows_end
    verdict = activations.check(analyse(write(tmp_path / "train.memprof", rows, CHAINS, end)))
    assert all(a.rule == activations.RULE_ID for a in verdict.advice)
    return verdict


BLOCK = 9 * UNIT                      # fc1 4 units + GELU 4 units + the block's output 1 unit
ACTS = 4 * BLOCK + 64 * KiB           # 9 MiB + the head
PEAK = ACTS + 2 * MiB                 # parameters and gradients


@pytest.mark.parametrize("layer,device", [("torch_cpu", "cpu"), ("cuda_block", "cuda:0")])
def test_blocks_make_the_peak_checkpoint_them(tmp_path, layer, device):
    (advice,) = judge(tmp_path, training(layer=layer, device=device)).advice
    numbers = advice.numbers
    assert (numbers["peak_bytes"], numbers["activation_bytes"], numbers["state_bytes"]) == (PEAK, ACTS, 2 * MiB)
    assert numbers["share"] == pytest.approx(ACTS / PEAK)
    assert numbers["modules"] == {f"blocks.{i}": BLOCK for i in range(4)}
    assert numbers["checkpoint"] == {
        "parent": "blocks", "modules": ["blocks.0", "blocks.1", "blocks.2", "blocks.3"], "held_bytes": 4 * BLOCK,
        "outputs_bytes": 4 * UNIT, "recomputed_bytes": BLOCK, "saving_bytes": 4 * BLOCK - 4 * UNIT - BLOCK}
    assert advice.saving_bytes == 4 * BLOCK - 4 * UNIT - BLOCK == 5888 * KiB
    assert advice.modules == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert advice.layer == layer
    assert advice.title == f"Activations make {layer}'s peak: checkpoint blocks.*"
    assert advice.evidence[1] == ("4 modules under blocks hold 9.0 MiB of it (each with the modules inside it): "
                                  "blocks.0 2.2 MiB, blocks.1 2.2 MiB, blocks.2 2.2 MiB, blocks.3 2.2 MiB.")
    assert "= 5.8 MiB less at the peak" in advice.evidence[2]
    assert "torch.utils.checkpoint" in advice.change and "micro-batches" in advice.change
    assert numbers["micro_batch_saving_bytes"] == ACTS - ACTS // 2


def test_without_module_paths_it_names_the_forward_lines(tmp_path):
    (advice,) = judge(tmp_path, training(tracked=False)).advice
    assert advice.numbers["forward_lines"] == {f"{MODEL}:30": 4 * BLOCK, f"{MODEL}:40": 64 * KiB}
    assert advice.saving_bytes == ACTS - ACTS // 2
    assert "checkpoint" not in advice.numbers and advice.modules == ()
    assert advice.evidence[2] == ("No checkpointing estimate: record with --torch-modules for module paths and "
                                  "a checkpointing estimate.")
    assert set(advice.chains) <= {FC, ACT, OUT, HEAD} and advice.chains


def test_a_sequential_of_single_ops_gets_micro_batching(tmp_path):
    """Each of net.0 … net.7 keeps only its output: checkpointing one by one frees nothing."""
    (advice,) = judge(tmp_path, training(sequential=8)).advice
    size = 5 * UNIT
    assert advice.numbers["modules"] == {f"net.{i}": size for i in range(8)}
    assert advice.saving_bytes == 8 * size // 2
    assert advice.title == "Activations make torch_cpu's peak (83% of it)"


def test_a_wide_model_no_advice(tmp_path):
    verdict = judge(tmp_path, training(params=32 * MiB))
    assert not verdict.advice
    assert verdict.why_not == ("torch_cpu's activations at its peak: 9.1 MiB of 73.1 MiB (12%), under 50% or 4.0 MiB")


def test_small_activations_no_advice(tmp_path):
    verdict = judge(tmp_path, training(params=64 * KiB, unit=32 * KiB))
    assert not verdict.advice and "under 50% or 4.0 MiB" in verdict.why_not


def test_activations_kept_across_steps_are_not_the_steps(tmp_path):
    """Kept, every step's 9 MiB would be 93% of the last peak; only the peak step's count."""
    verdict = judge(tmp_path, training(kept=True))
    assert not verdict.advice
    assert verdict.why_not.startswith("torch_cpu's activations at its peak: 9.1 MiB of 29.2 MiB (31%)")


def test_without_a_backward_no_advice(tmp_path):
    verdict = judge(tmp_path, training(grads=False))
    assert not verdict.advice and verdict.why_not.startswith("no backward ran")


def test_group_name():
    assert group_name(["blocks.0", "blocks.1"]) == "blocks.*"
    assert group_name(["encoder", "decoder"]) == "encoder, decoder"
    assert group_name(["layers.3"]) == "layers.3"


def test_rule_entry_names_its_thresholds():
    rule = activations.RULE
    assert rule.id == "activations-peak" and rule.trigger and rule.saving and "--torch-modules" in rule.needs
    assert {t.name for t in rule.thresholds} == {"ACTIVATION_SHARE_OF_PEAK", "MIN_ACTIVATION_BYTES"}
