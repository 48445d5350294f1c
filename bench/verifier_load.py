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

HERE = os.path.dirname(os.path.abspath(__file__))
_BPF_PROG_LOAD = 5
_LOG_STATS = 4  # BPF_LOG_STATS: the verifier's summary lines only
_LOG_BYTES = 1 << 20
_PROCESSED = re.compile(r"processed (\d+) insns")
_TIME = re.compile(r"verification time (\d+) usec")


def _child(out: str, command: list[str]) -> None:
    """One recording whose cached programs are loaded with the verifier's statistics; one
    `VERIFIED name instructions processed usec` line per program on stderr."""
    sys.path.insert(0, os.environ.get("PYTHONPATH") or os.path.dirname(HERE))
    report = open(os.dup(2), "w", buffering=1)  # early.py points fd 2 at a file while it loads
    from memprof.sources.ebpf import cached_bpf
    from memprof.sources.ebpf.bpfinfo import bpf_call

    def load_with_stats(prog_type, name, insns, license, kern_version, verifier_log=True):
        code = ctypes.create_string_buffer(insns, len(insns))
        licence = ctypes.create_string_buffer(license)
        log = ctypes.create_string_buffer(_LOG_BYTES)
        attr = cached_bpf._ProgLoadAttr(
            prog_type=prog_type, insn_cnt=len(insns) // 8, insns=ctypes.addressof(code),
            license=ctypes.addressof(licence), kern_version=kern_version, prog_name=name[:15],
            log_level=_LOG_STATS, log_size=_LOG_BYTES, log_buf=ctypes.addressof(log))
        fd = bpf_call(_BPF_PROG_LOAD, attr)  # raises as the original does when refused
        text = log.value.decode(errors="replace")
        processed, usec = _PROCESSED.search(text), _TIME.search(text)
        print(f"VERIFIED {name.decode()} {len(insns) // 8} {processed[1] if processed else -1} "
              f"{usec[1] if usec else -1}", file=report, flush=True)
        return fd

    cached_bpf.load_program = load_with_stats
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
