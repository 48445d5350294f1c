"""loss_accumulation: a training loop that keeps every step's autograd graph, the known
`autograd-graph-kept` workload (memprof report advice). Each step trains on a batch, then
measures the loss on a fixed held-out batch, without torch.no_grad(), and sums it as a tensor:

    total_val_loss += val_loss          # the line that keeps the graph (--fixed: val_loss.item())

`val_loss` carries its autograd graph, and each sum's graph holds the graphs of all the
losses before it, so every step's evaluation graph, with the tensors its forward saved for a
backward that never comes, stays alive until the loop ends. (A loss summed *after*
`loss.backward()` keeps only the graph's nodes, C++ objects on the native heap, no tensor:
backward frees what the graph saved. A forward whose backward never runs keeps it all.)

Expected growth, exactly 264708 bytes per step in the PyTorch CPU allocator: the tensors the
evaluation forward saved (torch.autograd.graph.saved_tensors_hooks lists them) that it also
allocated (the batch and the weights were there before):
  - the output of each ReLU in Model.forward, 64 x 512 float32 = 131072 bytes, twice
    (saved by ReLU's backward and by the next Linear's): 262144, allocated on Model.forward's
    two `h = self.act(...)` lines;
  - log_softmax's output in CrossEntropyLoss, 64 x 10 float32 = 2560 bytes;
  - nll_loss's total weight, a 0-dim float32: 4 bytes;
each freed only when the loop ends. The other tensors the forward made (each Linear's output,
the logits, the loss itself) are freed at once: no backward node saves them. The advice
reports the growth the leak findings fit (Theil-Sen over the step checkpoints); the
integration test holds it to 264708 within 2 % (chains too small to be judged growing, like
the 4-byte total weight, may fall out). With --fixed nothing outlives its step.

usage: loss_accumulation.py [--steps N] [--fixed] [--hold MS]
prints "pid=N", then "steps=N" and "kept_graphs=K" (how many steps' graphs the total holds).
"""
import argparse
import os
import time

import torch
from torch import nn

BATCH, IN, HIDDEN, CLASSES = 64, 256, 512, 10
KEPT_BYTES_PER_STEP = 2 * BATCH * HIDDEN * 4 + BATCH * CLASSES * 4 + 4  # 264708


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.act(self.fc1(x))
        h = self.act(self.fc2(h))
        return self.head(h)


def train_step(model, criterion, optimizer, x, y):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()


def validate(model, criterion, x, y):
    return criterion(model(x), y)  # no torch.no_grad(): the graph is built, and kept with the loss


def kept_graphs(total) -> int:
    """How many losses' graphs `total` (a float, or a tensor summed from them) still holds."""
    count, nodes, seen = 0, [getattr(total, "grad_fn", None)], set()
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__.startswith("NllLoss")
        nodes.extend(next_node for next_node, _ in node.next_functions)
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fixed", action="store_true", help="sum val_loss.item(): the control, nothing kept")
    parser.add_argument("--hold", type=int, default=600, metavar="MS")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, criterion = Model(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    val_x, val_y = torch.randn(BATCH, IN), torch.randint(0, CLASSES, (BATCH,))
    print(f"pid={os.getpid()}", flush=True)

    total_val_loss = 0.0
    for _ in range(args.steps):
        train_step(model, criterion, optimizer, torch.randn(BATCH, IN), torch.randint(0, CLASSES, (BATCH,)))
        val_loss = validate(model, criterion, val_x, val_y)
        if args.fixed:
            total_val_loss += val_loss.item()
        else:
            total_val_loss += val_loss  # the leak: keeps this step's graph and what it saved
    print(f"steps={args.steps}")
    print(f"kept_graphs={kept_graphs(total_val_loss)}", flush=True)
    time.sleep(args.hold / 1000)


if __name__ == "__main__":
    main()
