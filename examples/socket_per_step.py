"""socket_per_step: a loop that keeps one socket pair from every step (a connection opened per
step and never closed), the known kernel leak with steps; `--close` closes each pair within its
step: the control, which holds nothing.

usage: socket_per_step.py [--steps N] [--close]
Each step is a `memprof.mark("step")` (which counts the steps where nothing else does), a
socket pair with a byte through it, and a 20 ms sleep. Prints "kept=K steps=N".
"""
import argparse
import socket
import time

import memprof


def open_connection(kept, close):
    """One socket pair, a byte through it; kept (the leak) unless `close`."""
    a, b = socket.socketpair()
    a.send(b"x")
    b.recv(1)
    if close:
        a.close()
        b.close()
    else:
        kept.append((a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--close", action="store_true")
    args = ap.parse_args()
    kept = []
    for _ in range(args.steps):
        open_connection(kept, args.close)
        time.sleep(0.02)
        memprof.mark("step")
    print(f"kept={len(kept)} steps={args.steps}", flush=True)


if __name__ == "__main__":
    main()
