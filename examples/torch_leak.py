"""torch_leak: the known PyTorch CPU leak. A small training loop that keeps every step's
hidden activations alive by appending them to the module-level list ``history``.

The leak is exactly 131072 bytes per step: the output of the first Linear layer, a float32
tensor of 64 x 512 (batch x hidden) = 32768 elements x 4 bytes, which requires grad.
backward() releases the tensors its graph saved; what the kept graph still holds is fc1's
parameters and their gradients (below), a constant, not a growth. So after STEPS steps (default 40) the list holds STEPS x 131072 bytes (5242880 for 40) of
tensor storage, each storage one allocation of the PyTorch CPU allocator made under
train_step(), at the line ``hidden = model.fc1(x)``; the line that keeps it is
``history.append(hidden)`` in train_step(). train.py is the same loop without the leak.

Measured through c10::alloc_cpu/free_cpu (the PyTorch CPU allocator), 40 steps: 684
allocations in both scripts, 200 of them of 131072 bytes; live at exit, train.py 0 blocks,
torch_leak.py 44: the 40 kept activations plus fc1's weight (1048576 bytes) and bias (2048),
and their .grad, which the kept activations' autograd graph holds through its
AccumulateGrad nodes. (zero_grad() sets .grad to None, so each step allocates new grads:
41 allocations of each size in all, of which only the last is live at exit.) Through malloc the growth is about 133200 bytes a step:
the storage plus each kept tensor's own objects (TensorImpl, autograd node).

usage: torch_leak.py [--steps N] [--start-wait MS] [--wait-for-line] [--hold MS]
prints "pid=N", then "loop_s=<seconds of the loop only>", "steps=N" and "history_bytes=B"
"""
from torch import nn

from train import BATCH, HIDDEN, main  # the same loop: only train_step differs

LEAK_BYTES_PER_STEP = BATCH * HIDDEN * 4  # 131072

history = []  # every step's hidden activations, never cleared: the leak


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    hidden = model.fc1(x)
    history.append(hidden)  # the leak: keeps 64 x 512 float32 = 131072 bytes per step
    logits = model.fc2(model.relu(hidden))
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item()


def report_history():
    print(f"history_bytes={sum(t.untyped_storage().nbytes() for t in history)}")


if __name__ == "__main__":
    main(train_step, report_history, __doc__)
