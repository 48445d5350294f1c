"""A known workload for memprof's agent: N optimizer steps on a tiny model, a memprof.mark()
after step 2, and (with --child) the same again in a child Python process started with
subprocess. With --break-profiler, torch.profiler cannot start: the agent's profiler window
fails inside the agent, which must log it and let this program finish. Prints "done steps=N"."""
import argparse
import subprocess
import sys

import torch

import memprof


def train(steps: int) -> None:
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 8)).sum().backward()
        opt.step()
        if i == 1:
            memprof.mark("after step 2")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--break-profiler", action="store_true")
    args = ap.parse_args()
    if args.break_profiler:
        def refuse(self, *a, **k):
            raise RuntimeError("profiler broken on purpose (test)")
        torch.profiler.profile.__enter__ = refuse
    train(args.steps)
    if args.child:
        subprocess.run([sys.executable, __file__, "--steps", "3"], check=True)
    print(f"done steps={args.steps}")


if __name__ == "__main__":
    main()
