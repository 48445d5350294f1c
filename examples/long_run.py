"""long_run: a job that runs for minutes, for `record --max-size` (issue 23): train.py's CPU
training loop, paced to --steps-per-s, with kernel churn in every step (socket pairs opened,
used and closed: slab allocations freed within microseconds) and one known leak: every
--leak-every-th step keeps that step's hidden activations (131072 bytes of PyTorch CPU
storage, made at ``hidden = model.fc1(x)`` in train_step).

usage: long_run.py [--seconds S] [--steps-per-s R] [--leak-every K] [--churn N] [--wait-for-line]
prints "pid=N", and at the end "steps=N kept=K kept_bytes=B"
"""
import argparse
import os
import socket
import sys
import time

import torch
from torch import nn

from train import BATCH, CLASSES, HIDDEN, IN, Model

kept = []  # every --leak-every-th step's hidden activations: the leak


def train_step(model, optimizer, x, y, keep):
    optimizer.zero_grad()
    hidden = model.fc1(x)
    if keep:
        kept.append(hidden.detach())  # the leak: 64 x 512 float32 = 131072 bytes
    logits = model.fc2(model.relu(hidden))
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item()


def kernel_churn(pairs):
    """`pairs` socket pairs, a byte through each, closed at once: kernel memory that never lasts."""
    for _ in range(pairs):
        a, b = socket.socketpair()
        a.send(b"x")
        b.recv(1)
        a.close()
        b.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--steps-per-s", type=float, default=10)
    ap.add_argument("--leak-every", type=int, default=10)
    ap.add_argument("--churn", type=int, default=20, help="socket pairs opened and closed per step")
    ap.add_argument("--wait-for-line", action="store_true",
                    help="after printing pid=, wait for a line on stdin (the recorders are attached then)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"pid={os.getpid()}", flush=True)
    if args.wait_for_line:
        sys.stdin.readline()
    start, period, steps = time.monotonic(), 1 / args.steps_per_s, 0
    while time.monotonic() - start < args.seconds:
        x, y = torch.randn(BATCH, IN), torch.randint(0, CLASSES, (BATCH,))
        train_step(model, optimizer, x, y, keep=steps % args.leak_every == args.leak_every - 1)
        kernel_churn(args.churn)
        steps += 1
        time.sleep(max(0.0, start + steps * period - time.monotonic()))
    kept_bytes = sum(t.untyped_storage().nbytes() for t in kept)
    print(f"steps={steps} kept={len(kept)} kept_bytes={kept_bytes} hidden={HIDDEN}", flush=True)
    time.sleep(1.0)


if __name__ == "__main__":
    main()
