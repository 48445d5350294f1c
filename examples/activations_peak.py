"""activations_peak: a training step whose activations make its peak, the known
`activations-peak` workload (memprof report advice; record with --torch-modules for module
paths). A deep narrow stack of transformer-style MLP blocks, with a large batch:

    Block(x) = x + fc2(gelu(fc1(norm(x))))      width W, hidden 4W

The tensors each block's forward saves for backward, per row of the batch: norm's output (W
floats; LayerNorm also saves its mean and rstd, 2 floats), fc1's output (4W: GELU saves its
input), GELU's output (4W: fc2 saves its input) and the block's output (W, the next block's
input). Default: W = 64, batch 1024, 6 blocks, so each block holds 1024 x (10 x 64 + 2) x 4
= 2,629,632 bytes (~2.5 MiB) at the peak, 2,367,488 of them inside it and 262,144 its output:
about 15 MiB for the six, against 0.8 MiB of parameters and as much of gradients.
Checkpointing a block keeps only its input (the block before's output): the advice's estimate
is the blocks' insides less one block recomputed at a time during backward. Measured on this
machine (record --torch-modules): the torch_cpu peak was 17.1 MiB, 86 % of it activations; the
advice estimated 10.0 MiB less from checkpointing blocks.*, and --checkpoint (each block through
torch.utils.checkpoint) peaked at 5.9 MiB, 11.2 MiB less (the estimate is on the safe side).

--wide is the control: W = 512, batch 4, 2 blocks, Adam. Its peak is its weights (2 x 2 x
512 x 2048 x 4 = 16 MiB of parameters), their gradients and Adam's two moments (as much again
each), the activations of 4 rows are a few KiB: no advice.

usage: activations_peak.py [--wide] [--checkpoint] [--steps N] [--hold MS]
prints "pid=N", then "steps=N".
"""
import argparse
import os
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

NARROW = dict(width=64, batch=1024, blocks=6, optimizer="sgd")
WIDE = dict(width=512, batch=4, blocks=2, optimizer="adam")
CLASSES = 10


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, width, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x, checkpointed=False):
        if not checkpointed:
            return self.head(self.blocks(x))
        for block in self.blocks:  # the advice's change: each block keeps only its input
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wide", action="store_true", help="the control: a wide model, a tiny batch, Adam")
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each block (the advice, applied)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hold", type=int, default=300, metavar="MS")
    args = parser.parse_args()
    shape = WIDE if args.wide else NARROW

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, criterion = Model(shape["width"], shape["blocks"]), nn.CrossEntropyLoss()
    optimizer = (torch.optim.Adam(model.parameters(), lr=1e-3) if shape["optimizer"] == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.01))
    print(f"pid={os.getpid()}", flush=True)
    for _ in range(args.steps):
        x = torch.randn(shape["batch"], shape["width"])
        y = torch.randint(0, CLASSES, (shape["batch"],))
        optimizer.zero_grad()
        loss = criterion(model(x, checkpointed=args.checkpoint), y)
        loss.backward()
        optimizer.step()
    print(f"steps={args.steps}", flush=True)
    time.sleep(args.hold / 1000)


if __name__ == "__main__":
    main()
