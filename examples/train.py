"""train: the PyTorch CPU training loop of torch_leak.py without the leak (nothing outlives
its step), for overhead benchmarks and as the no-leak baseline.

usage: train.py [--steps N] [--start-wait MS] [--wait-for-line] [--hold MS] [--phases K] [--optimizer sgd|adam]
prints "pid=N", then "loop_s=<seconds of the loop only>", "step_median_s=" and "step_p10_s="
(the median and 10th percentile of one step's seconds: a host's interference inflates some
steps and leaves the others, so these vary less between runs than the loop), and "steps=N"

--phases K runs the loop K times in this one process, waiting for a line on stdin before each
loop after the first (it prints "waiting=K" then), and prints each loop's lines prefixed
"phaseK_" (phase1_loop_s=…): bench/train_attach_bracket.py attaches `record --pid` for one
phase and compares it with the phases around it.
"""
import argparse
import os
import sys
import time

import torch
from torch import nn

BATCH, IN, HIDDEN, CLASSES = 64, 512, 512, 10


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(HIDDEN, CLASSES)


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    hidden = model.fc1(x)
    logits = model.fc2(model.relu(hidden))
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item()


def run_loop(model, optimizer, step, steps):
    """`steps` training steps; returns perf_counter() seconds before the first and after each."""
    step_ends = [time.perf_counter()]
    for _ in range(steps):
        x = torch.randn(BATCH, IN)
        y = torch.randint(0, CLASSES, (BATCH,))
        step(model, optimizer, x, y)
        step_ends.append(time.perf_counter())
    return step_ends


def print_timing(step_ends, prefix=""):
    """The loop's seconds, and its median and 10th-percentile step."""
    step_s = sorted(b - a for a, b in zip(step_ends, step_ends[1:])) or [0.0]
    print(f"{prefix}loop_s={step_ends[-1] - step_ends[0]:.6f}")
    print(f"{prefix}step_median_s={step_s[len(step_s) // 2]:.9f}")
    print(f"{prefix}step_p10_s={step_s[len(step_s) // 10]:.9f}", flush=True)


def main(step=train_step, report=lambda: None, description=__doc__):
    """Run the loop with `step` (torch_leak.py passes its leaking one); `report()` prints
    extra result lines after loop_s and steps."""
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--start-wait", type=int, default=300, metavar="MS")
    parser.add_argument("--wait-for-line", action="store_true",
                        help="after printing pid=, wait for a line on stdin (a `record --pid` test sends it)")
    parser.add_argument("--hold", type=int, default=800, metavar="MS")
    parser.add_argument("--phases", type=int, default=1, metavar="K",
                        help="run the loop K times, waiting for a line on stdin before each after the first")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="adam keeps two state tensors per parameter (model state, not a leak)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    optimizer = (torch.optim.Adam(model.parameters(), lr=0.001) if args.optimizer == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.01))

    print(f"pid={os.getpid()}", flush=True)
    if args.wait_for_line:
        sys.stdin.readline()
    time.sleep(args.start_wait / 1000)
    for phase in range(1, args.phases + 1):
        if phase > 1:
            print(f"waiting={phase}", flush=True)
            sys.stdin.readline()
        step_ends = run_loop(model, optimizer, step, args.steps)
        print_timing(step_ends, prefix=f"phase{phase}_" if args.phases > 1 else "")
    print(f"steps={args.steps}")
    report()
    sys.stdout.flush()
    time.sleep(args.hold / 1000)


if __name__ == "__main__":
    main()
