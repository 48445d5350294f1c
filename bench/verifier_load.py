"""What the kernel's verifier does with each program a recording loads (issue 24: start-up).

Every start loads memprof's BPF programs, and the kernel checks each one before it runs: the
verifier follows every path it can reach, every copy of a loop's body included, and the
start waits for the programs it attaches before the command starts. This bench records a
command once to warm the compiled-program cache, then again with each program's load made
at the verifier's statistics level (BPF_LOG_STATS), and prints, per program, the
instructions it processed and its own verification time, largest first, with the totals.

    sudo .venv/bin/python bench/verifier_load.py [--repeats N] [-- CMD ...]

The default command is `python -c pass` under this Python (its programs include the torch
family's: torch is in this environment). Run from a tree whose memprof is the one to
measure (bench/bpf_before_after.sh copies each side; PYTHONPATH names it).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
_LOG_STATS = 4  # BPF_LOG_STATS: the verifier's summary lines only
_LOG_BYTES = 1 << 20
_PROCESSED = re.compile(r"processed (\d+) insns")
_TIME = re.compile(r"verification time (\d+) usec")


def _child(out: str, command: list[str]) -> None:
    """One recording whose cached programs are loaded with the verifier's statistics; one
    `VERIFIED name instructions processed usec` line per program on stderr. memprof's own
    loader (cached_bpf.load_program) builds each load; only its system call is wrapped, to
    ask for the statistics and read them."""
    sys.path.insert(0, os.environ.get("PYTHONPATH") or os.path.dirname(HERE))
    report = open(os.dup(2), "w", buffering=1)  # early.py points fd 2 at a file while it loads
    from memprof.sources.ebpf import cached_bpf
    real_call, real_load = cached_bpf.bpf_call, cached_bpf.load_program
    # The program each loading thread loads (start-up loads on several at once), by its whole
    # name: the kernel's keeps 15 bytes of it.
    loading = threading.local()

    def load_named(prog_type, name, *args, **kwargs):
        loading.name = name
        return real_load(prog_type, name, *args, **kwargs)

    def call_with_stats(command: int, attr):
        if command != cached_bpf._PROG_LOAD or attr.log_level:  # a retry for the refusal's log: as it is
            return real_call(command, attr)
        log = ctypes.create_string_buffer(_LOG_BYTES)
        attr.log_level, attr.log_size, attr.log_buf = _LOG_STATS, _LOG_BYTES, ctypes.addressof(log)
        try:
            fd = real_call(command, attr)
        finally:
            attr.log_level, attr.log_size, attr.log_buf = 0, 0, 0
        text = log.value.decode(errors="replace")
        processed, usec = _PROCESSED.search(text), _TIME.search(text)
        print(f"VERIFIED {loading.name.decode()} {attr.insn_cnt} {processed[1] if processed else -1} "
              f"{usec[1] if usec else -1}", file=report, flush=True)
        return fd

    cached_bpf.bpf_call, cached_bpf.load_program = call_with_stats, load_named
    from cli.main import main
    sys.argv = ["memprof", "record", "-q", "--force", "-o", out, "--", *command]
    main()


def _one_run(out: str, command: list[str], warm_up: bool = False) -> dict[str, tuple[int, int, int]]:
    """program -> (instructions, instructions processed, verification µs) of one recording
    (none for a `warm_up` that compiles: bcc loads what it compiles itself)."""
    proc = subprocess.run([sys.executable, __file__, "--child", out, "--", *command],
                          capture_output=True, text=True)
    programs = {}
    for line in proc.stderr.splitlines():
        if line.startswith("VERIFIED "):
            _, name, insns, processed, usec = line.split()
            programs[name] = (int(insns), int(processed), int(usec))
    if not programs and not warm_up:
        sys.exit(f"no program was loaded from the cache (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="measured recordings (after one that warms the cache)")
    parser.add_argument("--top", type=int, default=10, help="programs listed, largest first")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*", help="the command recorded (default: python -c pass)")
    args = parser.parse_args()
    command = args.command or [sys.executable, "-c", "pass"]
    if args.child:
        _child(args.child, command)
        return
    with tempfile.TemporaryDirectory(prefix="memprof-verifier-") as tmp:
        out = os.path.join(tmp, "run.memprof")
        _one_run(out, command, warm_up=True)
        runs = [_one_run(out, command) for _ in range(args.repeats)]
    print(f"command: {' '.join(command)}")
    for i, programs in enumerate(runs, 1):
        processed = sum(p for _, p, _ in programs.values())
        usec = sum(u for _, _, u in programs.values())
        print(f"run {i}: {len(programs)} programs, {processed:,} instructions processed, verification {usec / 1e3:.0f} ms")
    last = runs[-1]
    print(f"{'program':32s} {'insns':>6s} {'processed':>10s} {'ms':>7s}")
    for name, (insns, processed, usec) in sorted(last.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{name:32s} {insns:6d} {processed:10,d} {usec / 1e3:7.1f}")


if __name__ == "__main__":
    main()
