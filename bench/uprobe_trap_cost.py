"""What one uprobe costs on this kernel, by the instruction it sits on, with an empty program.

Why memprof probes `c10::alloc_cpu`'s `call NUMAMove` rather than its entry and return (see
bpf/README.md): a trap costs less where the kernel emulates the probed instruction (push,
call, jmp) than where it must single-step it out of line (e.g. `ret`), and a uretprobe adds a
second trap at return. A small C program, built here, calls each probed function N times;
bcc attaches an empty BPF program (`return 0`) to:

  entry (push %rbp)      a uprobe at a normal function's first instruction
  entry + return         the same plus a uretprobe (what entry-return probes cost)
  call rel32             a uprobe on a `call` instruction inside a function
  ret (single-stepped)   a uprobe on a function that is only `ret`
  nop5                   a uprobe on a 5-byte nop (Linux 6.18+ may turn it into a syscall)
  nop1                   a uprobe on a one-byte nop (emulated; memprof's preload markers)

and reports ns per call over the unprobed loop (median of REPEATS runs).

    sudo .venv/bin/python bench/uprobe_trap_cost.py [--calls N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
__attribute__((noipa)) void callee(void *p, unsigned long n) { __asm__ volatile("" ::: "memory"); }
__attribute__((noipa)) void *with_frame(unsigned long n) { void *p = malloc(16); callee(p, n); free(p); return p; }
__asm__(".globl ret_only\n.type ret_only,@function\nret_only:\n ret\n.size ret_only,1\n");
__asm__(".globl nop5_then_ret\n.type nop5_then_ret,@function\nnop5_then_ret:\n .byte 0x0f,0x1f,0x44,0x00,0x00\n ret\n.size nop5_then_ret,6\n");
__asm__(".globl nop1_then_ret\n.type nop1_then_ret,@function\nnop1_then_ret:\n nop\n ret\n.size nop1_then_ret,2\n");
void ret_only(void); void nop5_then_ret(void); void nop1_then_ret(void);
int main(int argc, char **argv) {
    long n = atol(argv[1]); int which = atoi(argv[2]);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (which == 0) with_frame(i); else if (which == 1) ret_only(); else if (which == 2) nop5_then_ret(); else nop1_then_ret();
        __asm__ volatile("" ::: "memory");
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
}
"""
BPF_TEXT = "int probe(void *ctx) { return 0; }"
# name -> (which loop the program runs, probes: [(kind, symbol, offset inside it)])
CASES = {
    "none": (0, []),
    "entry (push %rbp)": (0, [("entry", "with_frame", 0)]),
    "entry + return": (0, [("entry", "with_frame", 0), ("return", "with_frame", 0)]),
    "call rel32": (0, [("entry", "with_frame", "call")]),
    "ret (single-stepped)": (1, [("entry", "ret_only", 0)]),
    "nop5": (2, [("entry", "nop5_then_ret", 0)]),
    "nop1": (3, [("entry", "nop1_then_ret", 0)]),
}


def call_offset(binary: Path) -> int:
    """Offset of with_frame's call to callee (found as memprof finds alloc_cpu's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from memprof.sources.ebpf.callsite import find_call_site
    site = find_call_site(str(binary), "with_frame", "callee")
    if site.offset is None:
        raise SystemExit(f"no call site in the test program: {site.why}")
    return site.offset


def run_case(binary: Path, calls: int, which: int, probes, offset: int) -> float:
    from bcc import BPF
    from memprof.sources.ebpf.bpfload import captured_stderr  # clang's header warnings, kept off the terminal
    with captured_stderr():
        bpf = BPF(text=BPF_TEXT) if probes else None
    for kind, symbol, at in probes:
        sym_off = offset if at == "call" else at
        if kind == "entry":
            bpf.attach_uprobe(name=str(binary), sym=symbol, sym_off=sym_off, fn_name="probe")
        else:
            bpf.attach_uretprobe(name=str(binary), sym=symbol, fn_name="probe")
    try:
        out = subprocess.run([str(binary), str(calls), str(which)], capture_output=True, text=True, check=True)
        return float(out.stdout)
    finally:
        if bpf is not None:
            bpf.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memprof-bench-") as tmp:
        source, binary = Path(tmp) / "traps.c", Path(tmp) / "traps"
        source.write_text(PROGRAM)
        subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(source)], check=True)
        offset = call_offset(binary)
        results = {name: [] for name in CASES}
        for _ in range(args.repeats):
            for name, (which, probes) in CASES.items():
                results[name].append(run_case(binary, args.calls if name != "ret (single-stepped)" else args.calls // 10,
                                              which, probes, offset))
    base = statistics.median(results["none"])
    print(f"ns per call, median of {args.repeats} runs of {args.calls} calls; an empty BPF program")
    print(f"{'probe':<24}{'ns/call':>9}{'added ns':>10}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<24}{median:>9.0f}{median - base:>+10.0f}")


if __name__ == "__main__":
    main()
