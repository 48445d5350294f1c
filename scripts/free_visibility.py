"""Which kmem_cache_free events do raw-tracepoint BPF programs never run for?

A diagnostic for bpf/README.md "Missed frees" point 4, run as root from the repository root:

    .venv/bin/python scripts/free_visibility.py [--rounds N] [-- COMMAND ...]

Two counting programs are attached to the kmem_cache_free raw tracepoint the way memprof
attaches its main and backup programs (main first), and the same tracepoint is enabled in
ftrace, which is not BPF. While COMMAND runs (default: `memprof record` of kernel_churn,
which is when the gap was seen), each counts events per thread. Then, per round:

    ftrace N  main N (recursion misses N)  backup N (recursion misses N)
        tid T (tgid P NAME): ftrace N, main ran N, backup ran N

The threads listed are those with more events in ftrace than runs of the main program. The
BPF window encloses ftrace's (the counters are cleared before ftrace starts and read after
it stops), so a thread's shortfall is never an artefact of the windows. A shortfall bigger
than the main program's recursion misses of the whole round is, at least in part, events
the kernel neither ran the program for nor counted as skipped.

Tracing settings it changes (buffer size, tracing_on, the event's enable) are put back on exit.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memprof.sources.ebpf.bpfinfo import prog_stats  # noqa: E402

TRACEFS = Path("/sys/kernel/tracing")
EVENT = TRACEFS / "events/kmem/kmem_cache_free"
PROGRAM = r"""
BPF_HASH(main_runs, u32, u64);
BPF_HASH(backup_runs, u32, u64);
int main_prog(struct bpf_raw_tracepoint_args *ctx) { u32 tid = bpf_get_current_pid_tgid(); main_runs.increment(tid); return 0; }
int backup_prog(struct bpf_raw_tracepoint_args *ctx) { u32 tid = bpf_get_current_pid_tgid(); backup_runs.increment(tid); return 0; }
"""
FTRACE_LINE = re.compile(r"\s*(.+?)-(\d+)\s+\[\d+\].*kmem_cache_free:")


def default_command(folder: str) -> list[str]:
    """`memprof record` of kernel_churn into `folder`, a private one of this run's (not a
    fixed name under /tmp, which any user could take first)."""
    return [str(REPO / ".venv/bin/python"), "-m", "memprof", "record", "-q", "--force", "-o",
            str(Path(folder) / "free_visibility.memprof"), "--", str(REPO / "examples/bin/kernel_churn"), "20000"]


def attach(bpf) -> list[int]:
    """Both programs on one raw tracepoint, main first; bcc's own attach allows one per
    tracepoint, so libbcc's call is used (as memprof does). Returns the programs' fds."""
    from bcc import BPF
    from bcc.libbcc import lib
    fds = [bpf.load_func(name, BPF.RAW_TRACEPOINT).fd for name in ("main_prog", "backup_prog")]
    for fd in fds:
        if lib.bpf_attach_raw_tracepoint(fd, b"kmem_cache_free") < 0:
            raise SystemExit("could not attach to the kmem_cache_free raw tracepoint")
    return fds


@contextlib.contextmanager
def ftrace_event(buffer_kb: int):
    """The kmem_cache_free event on in the top tracing instance. Yields a Counter that is
    filled, on exit, with the events recorded per thread id; the buffer size and the event's
    state are restored then."""
    counts: collections.Counter = collections.Counter()
    saved_kb = (TRACEFS / "buffer_size_kb").read_text().split()[0]
    saved_on = (TRACEFS / "tracing_on").read_text().strip()
    (TRACEFS / "tracing_on").write_text("0")
    (TRACEFS / "trace").write_text("")
    (TRACEFS / "buffer_size_kb").write_text(str(buffer_kb))
    try:
        (EVENT / "enable").write_text("1")
        (TRACEFS / "tracing_on").write_text("1")
        yield counts
    finally:
        (TRACEFS / "tracing_on").write_text("0")
        (EVENT / "enable").write_text("0")
        counts.update(ftrace_counts())
        (TRACEFS / "buffer_size_kb").write_text(saved_kb)
        (TRACEFS / "tracing_on").write_text(saved_on)


def ftrace_counts() -> collections.Counter:
    """kmem_cache_free events in the trace buffer, per thread id."""
    counts: collections.Counter = collections.Counter()
    with open(TRACEFS / "trace") as trace:
        for line in trace:
            match = FTRACE_LINE.match(line)
            if match:
                counts[int(match.group(2))] += 1
    return counts


def process_of(tid: int) -> str:
    """'tgid comm' of a thread, or '?' when it is gone."""
    for status in Path("/proc").glob(f"*/task/{tid}/status"):
        fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        return f"tgid {fields.get('Tgid', '?').strip()} {fields.get('Name', '?').strip()}"
    return "?"


def one_round(bpf, fds: list[int], command: list[str]) -> dict:
    for table in ("main_runs", "backup_runs"):
        bpf[table].clear()
    misses_before = [prog_stats(fd).recursion_misses for fd in fds]
    with ftrace_event(buffer_kb=65536) as ftrace:
        subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        time.sleep(0.3)
    misses = [prog_stats(fd).recursion_misses - before for fd, before in zip(fds, misses_before)]
    main = {k.value: v.value for k, v in bpf["main_runs"].items()}
    backup = {k.value: v.value for k, v in bpf["backup_runs"].items()}
    short = {tid: (n, main.get(tid, 0), backup.get(tid, 0)) for tid, n in ftrace.items() if n > main.get(tid, 0)}
    return {"ftrace": sum(ftrace.values()), "main": sum(main.values()), "backup": sum(backup.values()),
            "main_misses": misses[0], "backup_misses": misses[1], "short": short}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds to run (default 5)")
    parser.add_argument("command", nargs="*", help="the workload (default: memprof record of kernel_churn 20000)")
    args = parser.parse_args()
    from bcc import BPF
    bpf = BPF(text=PROGRAM)
    fds = attach(bpf)
    folder = tempfile.mkdtemp(prefix="free_visibility.")  # 0700, root's
    command = args.command or default_command(folder)
    for n in range(args.rounds):
        r = one_round(bpf, fds, command)
        print(f"round {n}: ftrace {r['ftrace']} main {r['main']} (recursion misses {r['main_misses']}) "
              f"backup {r['backup']} (recursion misses {r['backup_misses']})", flush=True)
        for tid, (seen, ran, backup_ran) in sorted(r["short"].items(), key=lambda kv: kv[1][1] - kv[1][0])[:6]:
            print(f"    tid {tid} ({process_of(tid)}): ftrace {seen}, main ran {ran}, backup ran {backup_ran}")


if __name__ == "__main__":
    main()
