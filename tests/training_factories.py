"""Synthetic PyTorch training recordings with known answers, for the advice rules about a
training step's tensors (autograd-graph-kept, activations-peak): parameters and gradients
named by the agent's model-state notes, step marks, module boundaries (as record
--torch-modules writes them) and chains whose Python frames pass nn.Module calls.

Times: step k's work runs in [k·S, k·S + S/2), its mark is at k·S + S/2 (the agent marks a
step when the optimizer's step() returns). Everything is on torch_cpu unless a layer is given.
"""
from __future__ import annotations

from pathlib import Path

from memprof.model.meta import RecordingMeta
from memprof.model.schema import MODULE_NONE, MODULE_PREFIX, MODULE_RETURN_PREFIX, STATE_PREFIX
from memprof.recording import RecordingWriter
from tests.factories import ev, mark, stacks_frames
from tests.gpu_factories import MiB, PID, S, timeline_of

KiB = 1 << 10
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules"
MODEL, TRAIN = "/src/model.py", "/src/train.py"
ALLOC = ("native", "c10::alloc_cpu", "libc10.so", None, None)
CALL = ("python", "Module._call_impl", None, f"{TORCH}/module.py", 1784)
LOOP = ("python", "train", None, TRAIN, 50)


def forward_chain(op: str, line: int, caller: str = "Block.forward") -> list[tuple]:
    """A tensor made by torch's `op` (e.g. "Linear.forward") called at MODEL:`line` in
    `caller`, itself a module's forward called from the training loop (TRAIN:50)."""
    return [ALLOC, ("python", op, None, f"{TORCH}/{op.split('.')[0].lower()}.py", 120), CALL,
            ("python", caller, None, MODEL, line), CALL, LOOP]


LOOP_CHAIN = [ALLOC, ("python", "randn", None, TRAIN, 44), LOOP]  # made in the loop, in no forward
PARAM_CHAIN = [ALLOC, ("python", "Model.__init__", None, MODEL, 8)]
GRAD_CHAIN = [ALLOC, ("python", "backward", None, "/venv/lib/python3.11/site-packages/torch/_tensor.py", 600), LOOP]


def state_note(ts: int, addr: int, size: int, role: str, name: str, layer: str = "torch_cpu",
               device: str = "cpu") -> dict:
    """The agent's model-state note for one tensor."""
    return ev(ts, "mark", addr, size, layer=layer, device=device, category=f"{STATE_PREFIX}{role}:{name}", pid=PID)


def boundary(ts: int, category: str) -> dict:
    """A module boundary row on the training thread: MODULE_PREFIX + path at a call,
    MODULE_RETURN_PREFIX + the enclosing path (or MODULE_NONE) when it returns."""
    return dict(ts_ns=ts, action="mark", category=category, pid=PID, tid=PID)


def enter(ts: int, path: str) -> dict:
    return boundary(ts, MODULE_PREFIX + path)


def leave(ts: int, outer: str | None) -> dict:
    return boundary(ts, MODULE_NONE if outer is None else MODULE_RETURN_PREFIX + outer)


class Model:
    """Parameters (`param_bytes` in two tensors) made at 0.1 s and gradients of the same
    sizes made in step 1's backward, both named at every step mark; `grads=False`: no backward
    (no gradients: inference)."""

    def __init__(self, param_bytes: int, *, grads: bool = True, layer: str = "torch_cpu", device: str = "cpu"):
        self.sizes = (param_bytes // 2, param_bytes - param_bytes // 2)
        self.grads, self.layer, self.device = grads, layer, device
        self.params = [0x7F00_0000_0000 + i * 0x1000_0000 for i in range(2)]
        self.grad_addrs = [0x7E00_0000_0000 + i * 0x1000_0000 for i in range(2)]

    def made(self) -> list[dict]:
        return [ev(S // 10 + i, "alloc", a, n, 3, layer=self.layer, device=self.device, pid=PID)
                for i, (a, n) in enumerate(zip(self.params, self.sizes))]

    def backward(self, step: int, ts: int) -> list[dict]:
        """Step 1's backward makes the gradients (kept)."""
        if not self.grads or step != 1:
            return []
        return [ev(ts + i, "alloc", a, n, 4, layer=self.layer, device=self.device, pid=PID)
                for i, (a, n) in enumerate(zip(self.grad_addrs, self.sizes))]

    def step_mark(self, step: int) -> list[dict]:
        at = step * S + S // 2
        rows = [dict(ts_ns=at, action="mark", category="step", step=step, pid=PID, tid=PID)]
        rows += [state_note(at, a, n, "parameter", f"w{i}", self.layer, self.device)
                 for i, (a, n) in enumerate(zip(self.params, self.sizes))]
        if self.grads and step >= 1:
            rows += [state_note(at, a, n, "gradient", f"w{i}", self.layer, self.device)
                     for i, (a, n) in enumerate(zip(self.grad_addrs, self.sizes))]
        return rows


CHAINS = {3: PARAM_CHAIN, 4: GRAD_CHAIN, 9: LOOP_CHAIN}


def write(path: Path, rows: list[dict], chains: dict[int, list[tuple]], end_ns: int) -> Path:
    """A finalized recording of `rows` (the target exits at `end_ns`) with the `chains`'
    stacks and frames (and CHAINS')."""
    events = timeline_of(rows + [mark(end_ns, PID)])
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=PID,
                                                 start_ns=0))
    writer.append("events", {name: events[name] for name in events.columns})
    stacks, frames = stacks_frames({**CHAINS, **chains})
    writer.append("stacks", {name: stacks[name] for name in stacks.columns})
    writer.append("frames", {name: frames[name] for name in frames.columns})
    writer.finalize(end_ns=end_ns + S)
    return path


__all__ = ["KiB", "MiB", "S", "PID", "MODEL", "TRAIN", "Model", "forward_chain", "enter", "leave", "write",
           "LOOP_CHAIN", "ev"]
