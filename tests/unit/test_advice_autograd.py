"""Advice rule `autograd-graph-kept` (issue 22) on synthetic training recordings with known
answers, both ways: every step's forward leaves the tensors its graph saved (two ReLU outputs
made at model.py:20 and :21, log_softmax's output at train.py:63), which grow per step — the
advice names those lines and the exact growth; freed each step, kept by one chain alone (one
tensor kept in a list), grown outside any forward, or with no backward in the recording, it
says nothing. The real workload (examples/loss_accumulation.py) is recorded in
tests/integration/test_advice_training.py."""
from __future__ import annotations

import pytest

from memprof.analysis.advice import autograd
from memprof.analysis.advice.chain_text import user_frame
from memprof.analysis.advice.forwards import forward_caller, in_forward
from memprof.api import analyse
from tests.training_factories import (
    KiB, LOOP_CHAIN, MODEL, PID, S, TRAIN, Model, enter, ev, forward_chain, leave, write,
)

STEPS = 12
RELU_A, RELU_B, LOSS, TEMP, LOOP, BARE, BARE_RELU = 5, 6, 7, 8, 9, 10, 11  # stack ids
CHAINS = {
    RELU_A: forward_chain("ReLU.forward", 20),
    RELU_B: forward_chain("ReLU.forward", 21),
    LOSS: [("native", "c10::alloc_cpu", "libc10.so", None, None),
           ("python", "CrossEntropyLoss.forward", None, "/venv/lib/python3.11/site-packages/torch/nn/modules/loss.py",
            1400),
           ("python", "Module._call_impl", None, "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1784),
           ("python", "validate", None, TRAIN, 63), ("python", "train", None, TRAIN, 50)],
    TEMP: forward_chain("Linear.forward", 19),
    LOOP: LOOP_CHAIN,
    BARE: [("native", "c10::alloc_cpu", "libc10.so", None, None)],
    BARE_RELU: [("native", "c10::alloc_cpu", "libc10.so", None, None),
                ("native", "at::relu", "libtorch_cpu.so", None, None)],
}
# What each step's graph saves: 128 KiB + 64 KiB of ReLU outputs, 2560 + 4 bytes in the loss.
SAVED = ((RELU_A, 128 * KiB), (RELU_B, 64 * KiB), (LOSS, 2560), (LOSS, 4))
PER_STEP = 128 * KiB + 64 * KiB + 2564


def training(saved=SAVED, *, kept: bool = True, grads: bool = True, layer: str = "torch_cpu",
             device: str = "cpu", modules: tuple[str, ...] = ()) -> tuple[list[dict], int]:
    """STEPS steps: the forward makes `saved` ((stack, bytes) each step) and a 1 MiB temporary;
    backward frees the temporary, and the saved tensors too unless `kept` (a loss summed as a
    tensor keeps them). `modules`: module paths, one per saved tensor, run around its alloc
    (record --torch-modules). Returns (rows, end_ns)."""
    model = Model(2 << 20, grads=grads, layer=layer, device=device)
    at = dict(layer=layer, device=device, pid=PID)
    rows = model.made()
    for k in range(1, STEPS + 1):
        t = k * S
        for j, (stack, size) in enumerate(saved):
            addr = 0x5000_0000_0000 + k * 0x100_0000 + j * 0x10_0000
            if modules:
                rows += [enter(t + 10 * j, ""), enter(t + 10 * j + 1, modules[j])]
            rows.append(ev(t + 10 * j + 2, "alloc", addr, size, stack, **at))
            if modules:
                rows += [leave(t + 10 * j + 3, ""), leave(t + 10 * j + 4, None)]
            if not kept:
                rows.append(ev(t + S // 4 + j, "free", addr, **at))
        rows += [ev(t + 100, "alloc", 0x6000_0000_0000, 1 << 20, TEMP, **at),
                 ev(t + S // 4 - 1, "free", 0x6000_0000_0000, **at)]
        rows += model.backward(k, t + S // 4 + 100) + model.step_mark(k)
    return rows, (STEPS + 1) * S


def judge(tmp_path, rows_end, name="train"):
    rows, end = rows_end
    verdict = autograd.check(analyse(write(tmp_path / f"{name}.memprof", rows, CHAINS, end)))
    assert all(a.rule == autograd.RULE_ID for a in verdict.advice)
    return verdict


@pytest.mark.parametrize("layer,device", [("torch_cpu", "cpu"), ("cuda_block", "cuda:0")])
def test_a_kept_graph_gets_its_growth_per_step_and_forward_lines(tmp_path, layer, device):
    (advice,) = judge(tmp_path, training(layer=layer, device=device)).advice
    assert advice.layer == layer
    assert advice.numbers["growth_bytes_per_step"] == PER_STEP
    assert advice.numbers["kept_bytes"] == STEPS * PER_STEP == advice.saving_bytes
    assert advice.numbers["steps"] == STEPS
    assert advice.numbers["chains"] == 3
    assert advice.numbers["forward_lines"] == [
        {"line": f"{MODEL}:20", "function": "Block.forward", "module": None, "bytes_per_step": 128.0 * KiB},
        {"line": f"{MODEL}:21", "function": "Block.forward", "module": None, "bytes_per_step": 64.0 * KiB},
        {"line": f"{TRAIN}:63", "function": "validate", "module": None, "bytes_per_step": 2564.0},
    ]
    assert advice.numbers["forward_calls"] == [
        {"line": f"{TRAIN}:50", "function": "train", "bytes_per_step": 192.0 * KiB},
        {"line": f"{TRAIN}:63", "function": "validate", "bytes_per_step": 2564.0},
    ]
    assert advice.evidence[4] == (f"The forwards were called at {TRAIN}:50 (train, 192.0 KiB/step), {TRAIN}:63 "
                                  "(validate, 2.5 KiB/step): a result of that call (a loss, an output) carries their "
                                  "graph past the step (a sum, a list).")
    assert f"the result of the call at {TRAIN}:50" in advice.change
    assert set(advice.chains) == {RELU_A, RELU_B, LOSS}
    assert advice.title == ("The autograd graph is kept across steps: 194.5 KiB more each step, "
                            "saved by the forward at model.py:20")
    assert "194.5 KiB per step" in advice.evidence[0] and f"over {STEPS} steps" in advice.evidence[0]
    assert advice.evidence[1] == f"128.0 KiB/step allocated at {MODEL}:20 (Block.forward)"
    assert ".item()" in advice.change and "torch.no_grad()" in advice.change


def test_with_module_paths_and_no_python_frames_it_names_the_modules(tmp_path):
    saved = ((BARE, 128 * KiB), (BARE, 64 * KiB))
    # One chain (BARE) made in two modules: the finding's module is the one with most allocations.
    rows = training(saved, modules=("blocks.0.act", "blocks.1.act"))
    verdict = judge(tmp_path, rows)
    # Both tensors share one chain: one growing chain is one tensor kept, not a graph.
    assert not verdict.advice and "not 2 or more" in verdict.why_not


def test_two_module_chains_without_python_frames_fire_by_module(tmp_path):
    saved = ((BARE, 128 * KiB), (BARE_RELU, 64 * KiB))
    (advice,) = judge(tmp_path, training(saved, modules=("blocks.0.act", "blocks.1.act"))).advice
    assert advice.modules == ("blocks.0.act", "blocks.1.act")
    assert advice.numbers["growth_bytes_per_step"] == 192 * KiB
    assert advice.numbers["forward_lines"] == []
    assert advice.title.endswith("saved by the forward at module blocks.0.act")


def test_freed_each_step_no_advice(tmp_path):
    verdict = judge(tmp_path, training(kept=False))
    assert not verdict.advice
    assert verdict.why_not == "no tensor chain (torch_cpu, cuda_block) grows per step"


def test_one_tensor_kept_in_a_list_is_not_a_graph(tmp_path):
    """torch_leak.py's pattern: one chain (fc1's output) kept per step; .detach() would not free it."""
    verdict = judge(tmp_path, training(((RELU_A, 128 * KiB),)))
    assert not verdict.advice
    assert verdict.why_not.startswith("1 tensor chain(s) grow per step, but not 2 or more inside module forwards")


def test_growth_outside_forwards_no_advice(tmp_path):
    """Batches kept by the loop (made by torch.randn in train.py, no module call): not a graph."""
    verdict = judge(tmp_path, training(((LOOP, 256 * KiB), (LOOP, 8 * KiB), (BARE, 4 * KiB))))
    assert not verdict.advice and "not 2 or more inside module forwards" in verdict.why_not


def test_small_growth_no_advice(tmp_path):
    """Two scalars a step (a loss and its sum): under MIN_GROWTH_BYTES_PER_STEP."""
    verdict = judge(tmp_path, training(((RELU_A, 4), (LOSS, 4))))
    assert not verdict.advice


def test_without_a_backward_no_advice(tmp_path):
    verdict = judge(tmp_path, training(grads=False))
    assert not verdict.advice and verdict.why_not.startswith("no backward ran")


def test_rule_entry_names_its_thresholds():
    rule = autograd.RULE
    assert rule.id == "autograd-graph-kept" and rule.trigger and rule.evidence and rule.advice and rule.saving
    assert {t.name for t in rule.thresholds} == {"MIN_GROWTH_BYTES_PER_STEP", "MIN_CHAINS"}


def frames(chain: list[tuple]) -> list[dict]:
    return [dict(zip(("kind", "function", "module", "file", "line"), frame)) for frame in chain]


def test_a_chain_read_as_pytorch_code():
    relu, loss, loop = frames(CHAINS[RELU_A]), frames(CHAINS[LOSS]), frames(CHAINS[LOOP])
    assert in_forward(relu) and in_forward(loss) and not in_forward(loop)
    assert in_forward(frames([("python", "_call_impl", None, "/usr/lib/python3/torch/nn/modules/module.py", 1)]))
    assert (user_frame(relu)["file"], user_frame(relu)["line"]) == (MODEL, 20)   # torch's frames skipped
    assert (forward_caller(relu)["function"], forward_caller(relu)["line"]) == ("train", 50)  # past the outermost call
    assert forward_caller(loss)["line"] == 63 and forward_caller(loop) is None
    stdlib = frames([("python", "run", None, "/usr/lib/python3.11/threading.py", 9)])
    assert user_frame(stdlib) is None
