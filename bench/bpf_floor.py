"""Run a command under stand-in BPF programs: the floors under memprof's kernel overhead.

The programs sit on the tracepoints memprof uses and do nothing (`empty`) or only what any
recorder of each event must do (`record`). bench/churn_overhead.py runs them beside memprof
(issue 24: kernel churn).

- `empty`: a program that returns at once on each tracepoint memprof attaches, in memprof's
  order (kmem.plan_attach(): each kmem tracepoint, with the second program each free
  tracepoint gets for nested frees), and on the raw tracepoints memprof's object loads
  (sys_enter, sched_switch, sched_process_fork/exec/exit, signal_deliver). What the kernel's
  dispatch to BPF costs, per event.
- `record`: as `empty`, but each allocation and free of the command's process writes one
  record of memprof's event size (72 bytes: a time stamp, pid and tid, address, size, call
  site, padding) to a ring buffer that a thread here drains with memprof's own consumer.
  The least a recorder that keeps every event (what memprof's timeline, peaks and leak
  pairing read) pays: no stacks, no Python frames, no address filter.

    sudo .venv/bin/python bench/bpf_floor.py {empty,record} -- CMD [ARG...]

The command starts once the programs are attached (it waits on a pipe: its pid is the
filter's) and its output is passed through; the exit status is the command's.
"""
from __future__ import annotations

import argparse
import mmap
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memprof.sources.ebpf import kmem, loading, records as records_module  # noqa: E402  (after the path)
from memprof.sources.ebpf.loading import program_costs  # noqa: E402
from memprof.sources.ebpf.options import EbpfOptions  # noqa: E402
from memprof.sources.ebpf.records import EVENT_BYTES, FREE_TRACEPOINTS  # noqa: E402
from memprof.sources.ebpf.ringbuf import RingBufferConsumer  # noqa: E402

RING_PAGES = EbpfOptions().ringbuf_bytes // mmap.PAGESIZE  # memprof's default ring


def other_raw_tracepoints() -> list[str]:
    """The raw tracepoints memprof's object loads by name (bcc's RAW_TRACEPOINT_PROBE), as
    its program text has them: sys_enter, sched_switch, the process and signal ones."""
    text = loading.program_text(loading.bpf_source_dir(), kmem=True)
    return sorted(set(re.findall(r"^(?:MP_KERNEL_PROGRAM )?RAW_TRACEPOINT_PROBE\((\w+)\)", text, re.M)))

_RECORD_HEAD = """
BPF_RINGBUF_OUTPUT(events, %d);
BPF_ARRAY(target, u32, 1);
struct rec { u64 ts, addr, call_site, size; u32 pid, tid; u64 pad[%d]; };
static __always_inline int record(u64 addr, u64 size, u64 call_site)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 zero = 0, *tgid = target.lookup(&zero);
    if (!tgid || *tgid != (u32)(id >> 32))
        return 0;
    struct rec *r = events.ringbuf_reserve(sizeof(struct rec));
    if (!r)
        return 0;
    r->ts = bpf_ktime_get_ns();
    r->pid = id >> 32;
    r->tid = (u32)id;
    r->addr = addr;
    r->size = size;
    r->call_site = call_site;
    events.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
    return 0;
}
""" % (RING_PAGES, (EVENT_BYTES - 40) // 8)


def _record_body(tracepoint: str, nested: bool) -> str:
    """What a `record` program does on `tracepoint`: one record, from the main program only."""
    if nested:
        return "return 0;"
    if tracepoint in kmem.PAGE_TRACEPOINTS:
        return "return record(ctx->args[0], 4096, 0);"
    if tracepoint in FREE_TRACEPOINTS:
        return "return record(ctx->args[1], 0, ctx->args[0]);"
    # kmalloc's bytes_alloc; for kmem_cache_alloc since 6.0 its gfp flags: the floor reads no
    # cache's sizes, which memprof's program does (one kernel read)
    return "return record(ctx->args[1], ctx->args[3], ctx->args[0]);"


def program_text(mode: str, plan: list[tuple[str, str]]) -> str:
    """The BPF text: one function per (tracepoint, program) of `plan`, and the other raw
    tracepoints' (autoloaded by bcc from their names)."""
    parts = [_RECORD_HEAD] if mode == "record" else []
    for tracepoint, name in plan:
        body = _record_body(tracepoint, name.endswith("_nested")) if mode == "record" else "return 0;"
        parts.append(f"int floor_{name}(struct bpf_raw_tracepoint_args *ctx) {{ {body} }}")
    parts += [f"int raw_tracepoint__{tp}(struct bpf_raw_tracepoint_args *ctx) {{ return 0; }}"
              for tp in other_raw_tracepoints()]
    return "\n".join(parts)


class Drain:
    """Keeps a ring of `size_bytes` (memprof's default) drained every 5 ms on a thread, with
    memprof's own consumer (RingBufferConsumer: each batch copied out, as the recorder copies
    it); `records` counts what it drained, and after `close` `produced_bytes` how far the
    producer went. Also tests/integration/test_ring_buffer_wrap.py's."""

    def __init__(self, map_fd: int, size_bytes: int = RING_PAGES * mmap.PAGESIZE):
        self._ring = RingBufferConsumer(map_fd, size_bytes, EVENT_BYTES, lambda: records_module.EVENT_DTYPE)
        self.records = 0
        self.produced_bytes = 0  # set by close()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.records += len(self._ring.drain())

    def close(self) -> None:
        """Stop, after a last drain."""
        self._stop.set()
        self._thread.join()
        self.records += len(self._ring.drain())
        self.produced_bytes = self._ring.producer_pos  # how far the producer went, laps included
        self._ring.close()


def _print_program_costs(bpf) -> None:
    """Each program's runs and mean ns a run, where kernel.bpf_stats_enabled is on."""
    costs = program_costs(bpf)
    for name, ns in (costs[0] if costs else {}).items():
        print(f"# {name}: {costs[1][name]} runs, {ns:.0f} ns a run", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("empty", "record"))
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command")
    from bcc import BPF
    plan = kmem.plan_attach()
    bpf = BPF(text=program_text(args.mode, plan).encode(), cflags=["-w"])
    from bcc.libbcc import lib
    links = []  # bcc's attach_raw_tracepoint takes one program per tracepoint; memprof's take two
    for tracepoint, name in plan:  # in memprof's order: a free's main program before its backup
        fd = lib.bpf_attach_raw_tracepoint(bpf.load_func(f"floor_{name}", BPF.RAW_TRACEPOINT).fd, tracepoint.encode())
        if fd < 0:
            sys.exit(f"bpf_floor: could not attach to kmem:{tracepoint} (error {-fd})")
        links.append(fd)
    # The command waits for a line before it execs, so that its pid is known to the filter first.
    child = subprocess.Popen(["sh", "-c", 'read _ && exec "$0" "$@"', *command], stdin=subprocess.PIPE)
    if args.mode == "record":
        bpf["target"][bpf["target"].Key(0)] = bpf["target"].Leaf(child.pid)
        drain = Drain(bpf["events"].map_fd)
    child.stdin.write(b"\n")
    child.stdin.close()
    status = child.wait()
    if args.mode == "record":
        drain.close()
        print(f"floor_records={drain.records}", flush=True)
    _print_program_costs(bpf)
    for fd in links:
        os.close(fd)
    bpf.cleanup()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
