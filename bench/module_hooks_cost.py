"""Cost of the agent's forward hooks per nn.Module call (issue 21, item 5): a loop of
outermost calls of a 3-module model (Sequential(Linear, ReLU, Linear) on a 1x8 input, so
the modules' own work is small and the hooks show): without the agent's hooks, with them
but module tracking off (torch_modules false: depth counting only), and with module
tracking on. An optimizer is taken to count the steps (as in training), so that an
outermost forward is not also a step (`--forward-steps`: it is, as in generate). Variants
alternate within each round (the host's interference spreads over all of them) and each
keeps its fastest round. Times are the thread's CPU time (time.thread_time: a busy host
slows the wall clock more). Prints µs per outermost call (4 module calls: the Sequential and
its 3 children).

--train: examples/train.py's own step instead (SGD on a 64x512 batch through fc1, relu and
fc2, each called on its own: three outermost forwards a step), with the agent's records
written (flush) inside the timed loop, hooks on in both variants: what module tracking adds
to a small CPU training step. Prints µs per step and the ratio.

usage: .venv/bin/python bench/module_hooks_cost.py [--calls 10000] [--rounds 7] [--forward-steps] [--train]
"""
import argparse
import importlib
import json
import os
import sys
import tempfile
import time

import torch
from torch import nn

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memprof", "agent", "boot")


def timed(net, x, calls):
    """µs per call of `net(x)` over `calls` calls."""
    with torch.no_grad():
        began = time.thread_time()
        for _ in range(calls):
            net(x)
        return (time.thread_time() - began) / calls * 1e6


def installed_agent(folder):
    """The agent module, installed (its hooks on torch), writing into `folder`."""
    os.environ["MEMPROF_AGENT_DIR"] = folder
    sys.path.insert(0, BOOT)
    agent = importlib.import_module("memprof_agent")
    agent.install()
    return agent


def set_variant(agent, name):
    """Hooks on or off, module tracking on or off, as the variant `name` says."""
    agent.remove_hooks()
    if name != "no hooks":
        agent._hook_forwards(torch)
    agent._state["track_modules"] = name == "modules on"


def train_step_cost(agent, rounds, steps=100):
    """{tracking on/off: best µs per examples/train.py step, records written included}."""
    sys.path.insert(0, os.path.join(os.path.dirname(BOOT), "..", "..", "examples"))
    import train
    model = train.Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(train.BATCH, train.IN), torch.randint(0, train.CLASSES, (train.BATCH,))
    best = {False: float("inf"), True: float("inf")}
    for _ in range(rounds):
        for on in best:
            agent._state["track_modules"] = on
            began = time.thread_time()
            for _ in range(steps):
                train.train_step(model, optimizer, x, y)
            agent.flush()
            best[on] = min(best[on], (time.thread_time() - began) / steps * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--forward-steps", action="store_true")
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    if args.train:
        with tempfile.TemporaryDirectory() as folder:
            best = train_step_cost(installed_agent(folder), args.rounds * 2)
        print(f"train step: modules off {best[False]:.1f} µs, on {best[True]:.1f} µs, "
              f"{best[True] / best[False]:.3f}x")
        return
    torch.set_num_threads(1)
    net, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), torch.zeros(1, 8)
    variants = ("no hooks", "modules off", "modules on")
    best = dict.fromkeys(variants, float("inf"))
    with tempfile.TemporaryDirectory() as folder:
        agent = installed_agent(folder)
        if not args.forward_steps:
            agent._state["step_source"] = "optimizer.step"
        for _ in range(args.rounds):
            for name in variants:
                set_variant(agent, name)
                timed(net, x, args.calls // 10)  # warm up
                best[name] = min(best[name], timed(net, x, args.calls))
                agent.flush()
        agent.remove_hooks()
    base = best["no hooks"]
    for name in variants:
        us = best[name]
        print(f"{name:12s} {us:8.2f} µs per outermost call  ({us / base:.2f}x, +{us - base:.2f} µs)")


if __name__ == "__main__":
    main()
