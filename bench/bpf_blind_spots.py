"""Tasks while which no BPF program runs: what memprof's probes cannot see on this machine.

A sandbox's kernel may keep BPF programs from running while one of its own tasks is current
(this project's VM does so for its PID 1, the sandbox agent). memprof's kmem programs then
miss whatever the kernel does on that task's time: the RCU callbacks a softirq runs on top of
it free sockets' inodes and the inodes' LSM blobs unseen, ~100 at a time, and the leaks report
calls their chains unconfirmed (tests/integration/test_kernel.py, the churn control).

The test here needs no allocation: a raw tracepoint program on sched_switch counts, per
process, the switches *into* its threads (the program runs with the previous task current)
and *out of* them (it runs with one of them current). Every thread switched in is switched
out again, so a process with switches in and none out is one while which BPF does not run.

    sudo .venv/bin/python bench/bpf_blind_spots.py [--seconds S]

Prints each process seen switched in, with both counts, those with none out marked; exits 1
when there is such a process, 0 when none. Measured here (8 s): PID 1 (process_api) 21 in,
0 out, of 524 switches.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROGRAM = r"""
struct counts { u64 into; u64 out_of; };
BPF_HASH(per_tgid, u32, struct counts, 4096);
static __always_inline u32 tgid_of(u64 task)
{
    u32 tgid = 0;
    bpf_probe_read_kernel(&tgid, sizeof(tgid), (void *)(task + TASK_TGID_OFF));
    return tgid;
}
RAW_TRACEPOINT_PROBE(sched_switch)  /* (preempt, prev, next, prev_state) */
{
    struct counts zero = {}, *c;
    u32 prev = tgid_of(ctx->args[1]), next = tgid_of(ctx->args[2]);
    c = per_tgid.lookup_or_try_init(&next, &zero);
    if (c)
        __sync_fetch_and_add(&c->into, 1);
    c = per_tgid.lookup_or_try_init(&prev, &zero);
    if (c)
        __sync_fetch_and_add(&c->out_of, 1);
    return 0;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to count (default 8)")
    args = parser.parse_args()
    from bcc import BPF
    from memprof.sources.ebpf.btf_answers import kernel_btf
    from memprof.sources.symbols.procs import read_comm
    offset = kernel_btf().member_offset("task_struct", "tgid")
    bpf = BPF(text=PROGRAM.replace("TASK_TGID_OFF", str(offset)))
    time.sleep(args.seconds)
    counts = {int(k.value): (int(v.out_of), int(v.into)) for k, v in bpf["per_tgid"].items()}
    blind = [tgid for tgid, (out, into) in counts.items() if into > 0 and out == 0 and tgid != 0]
    total = sum(into for _, into in counts.values())
    print(f"{total} switches in {args.seconds:g} s")
    for tgid, (out, into) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        if into:
            mark = "  <- no BPF program runs while it is current" if tgid in blind else ""
            print(f"  pid {tgid:>7} {read_comm(tgid) or '?':<16} in {into:>6}  out {out:>6}{mark}")
    return 1 if blind else 0


if __name__ == "__main__":
    sys.exit(main())
