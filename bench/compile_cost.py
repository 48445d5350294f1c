"""What bcc's compile of memprof's BPF object costs, by LLVM's own accounting (issue 24).

bcc compiles the whole program at every `record`: most of its start-up. Wall time here is
too noisy to tell 0.2 s apart, so this reads clang's and LLVM's -ftime-report, which time
the compiler's own work (front end, IR passes, code generation), and sums their totals, for
the default families and for `--sources +native`, alternating, REPEATS times each.

    sudo .venv/bin/python bench/compile_cost.py [--repeats R]
"""
from __future__ import annotations

import argparse
import re
import statistics
import time

from memprof.sources.ebpf import loading
from memprof.sources.ebpf.bpfload import captured_stderr
from memprof.sources.ebpf.source import DEFAULT_FAMILIES, EbpfOptions, EbpfSource


def compile_seconds(families: tuple[str, ...]) -> tuple[float, float]:
    """(LLVM's summed totals, wall seconds) of one compile of the object for `families`."""
    from bcc import BPF
    source = EbpfSource(EbpfOptions(families=families))
    src_dir = loading.bpf_source_dir()
    text = loading.program_text(src_dir, kmem=source.enabled("kmem"))
    cflags = [f"-I{src_dir}", *loading.program_cflags(source.options, source.enabled), "-ftime-report"]
    t0 = time.perf_counter()
    with captured_stderr() as diagnostics:
        BPF(text=text, cflags=cflags).cleanup()
    wall = time.perf_counter() - t0
    totals = re.findall(r"Total Execution Time: ([0-9.]+) seconds", diagnostics.text())
    return sum(map(float, totals)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    variants = {"default sources": DEFAULT_FAMILIES, "+native": (*DEFAULT_FAMILIES, "native")}
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, families in variants.items():
            seen[name].append(compile_seconds(families))
    for name, runs in seen.items():
        llvm, wall = zip(*runs)
        print(f"{name}: LLVM's totals {statistics.median(llvm):.3f} s (min {min(llvm):.3f}, max {max(llvm):.3f}); "
              f"wall {statistics.median(wall):.3f} s")


if __name__ == "__main__":
    main()
