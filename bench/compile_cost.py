"""What bcc's compile of memprof's BPF object costs, by LLVM's own accounting (issue 24).

bcc compiles the whole program at every `record`: most of its start-up. Wall time here is
too noisy to tell 0.2 s apart, so this reads clang's and LLVM's -ftime-report, which time
the compiler's own work (front end, IR passes, code generation), and sums their totals, for
the default families (with cuda's programs, as where an NVIDIA driver is loaded, and
without, as elsewhere) and for `--sources +native`, alternating, REPEATS times each.

--fresh times what a cold `record` pays instead: each compile in a new interpreter, on a
thread set up as record's compile thread is (sources/ebpf/early.py), the wall time of bcc's
BPF() call alone (no -ftime-report, whose timers cost time of their own). That
includes what bcc does around LLVM, such as its front end's look-ups in kallsyms, which
LLVM's totals leave out. It also times the defaults as a first run compiles them (the
"halves" rows): two forked children at once, each compiling half of the programs
(sources/ebpf/compile_child.py), from the fork to their programs joined in the parent.

    sudo .venv/bin/python bench/compile_cost.py [--repeats R] [--fresh]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

from memprof.sources.ebpf import loading
from memprof.sources.ebpf.bpfload import captured_stderr
from memprof.sources.ebpf.options import DEFAULT_FAMILIES, EbpfOptions


def compile_seconds(families: tuple[str, ...]) -> tuple[float, float]:
    """(LLVM's summed totals, wall seconds) of one compile of the object for `families`."""
    from bcc import BPF
    options = EbpfOptions(families=families)
    text, cflags = loading.program_source(options, options.enabled)
    cflags = [*cflags, "-ftime-report"]
    t0 = time.perf_counter()
    with captured_stderr() as diagnostics:
        BPF(text=text.encode(), cflags=cflags).cleanup()
    wall = time.perf_counter() - t0
    totals = re.findall(r"Total Execution Time: ([0-9.]+) seconds", diagnostics.text())
    return sum(map(float, totals)), wall


_FRESH = """
import sys, time
from memprof.sources.ebpf import early, loading
from memprof.sources.ebpf.bpfload import captured_stderr
from memprof.sources.ebpf.options import EbpfOptions
options = EbpfOptions(families=tuple(sys.argv[2:]))
text, cflags = loading.program_source(options, options.enabled)
t0 = time.perf_counter()
with captured_stderr():
    if sys.argv[1] == "halves":  # as a first run's record compiles
        import os
        from memprof.sources.ebpf import compile_child
        entry, fds = compile_child.fork_compile(text, cflags).receive()
        for fd in fds:
            os.close(fd)
    elif hasattr(early, "compile_on_own_thread"):  # as record compiled in its own process
        early.compile_on_own_thread(text, cflags).cleanup()
    else:  # a revision before it: as it compiled
        from bcc import BPF
        BPF(text=text.encode(), cflags=cflags).cleanup()
print(time.perf_counter() - t0)
"""


def fresh_compile_seconds(families: tuple[str, ...], how: str = "whole") -> tuple[float, float]:
    """(nan, wall seconds) for one compile in a new interpreter: bcc's BPF() call (`how`
    "whole"), or the compile children's fork to their halves joined ("halves")."""
    out = subprocess.run([sys.executable, "-c", _FRESH, how, *families], check=True, capture_output=True,
                         text=True).stdout
    return float("nan"), float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fresh", action="store_true", help="each compile in a new interpreter, its wall time only")
    args = ap.parse_args()
    measure = fresh_compile_seconds if args.fresh else compile_seconds
    # The defaults compile cuda's programs only where an NVIDIA driver is loaded
    # (options.families_for_this_host): both are timed, whichever this host is.
    variants = {"default sources, with a driver": DEFAULT_FAMILIES,
                "default sources, without one": tuple(f for f in DEFAULT_FAMILIES if f != "cuda"),
                "+native": (*DEFAULT_FAMILIES, "native")}
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    if args.fresh:
        seen.update({f"{name}, halves in two children": [] for name in variants})
    for _ in range(args.repeats):
        for name, families in variants.items():
            seen[name].append(measure(families))
            if args.fresh:
                seen[f"{name}, halves in two children"].append(fresh_compile_seconds(families, "halves"))
    for name, runs in seen.items():
        llvm, wall = zip(*runs)
        if args.fresh:
            print(f"{name}: wall {statistics.median(wall):.3f} s (min {min(wall):.3f}, max {max(wall):.3f}), "
                  f"a new interpreter per compile")
            continue
        print(f"{name}: LLVM's totals {statistics.median(llvm):.3f} s (min {min(llvm):.3f}, max {max(llvm):.3f}); "
              f"wall {statistics.median(wall):.3f} s")


if __name__ == "__main__":
    main()
