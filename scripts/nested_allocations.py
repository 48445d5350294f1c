"""Where do the allocations the kernel skips memprof's allocation programs for come from?

A diagnostic for bpf/README.md "Missed frees", 1 (allocations), run as root from the
repository root:

    .venv/bin/python scripts/nested_allocations.py [--out PATH] [-- COMMAND ...]

The kernel skips a raw tracepoint's program when that same program is already running on
the CPU (a recursion miss). For memprof's allocation programs (mp_kmem_cache_alloc,
mp_kmalloc, mp_page_alloc) memprof records such skips in meta.json's
`nested_allocations` and reports them as no loss. This script checks why: a `pre` program is
attached to each allocation tracepoint before `memprof record` starts, and a `post` program
after memprof has attached, so that every event runs pre, memprof's program, post. An event
whose `pre` runs between another event's `pre` and `post` on the same CPU is nested: it came
while memprof's program (or the tracing around it) ran. Each nested event is classed by
where its program's context lives:

    interrupt stack     outside the task's kernel stack: a hard interrupt, or the softirqs
                        run on its way out (network receive, timers)
    task stack, orig_ax < 0    on the task's stack in an interrupt of user code
    task work           on the task's stack in a system call or fault: an allocation made
                        by the running program's own helpers (its kernel stack is printed)

memprof records none of the first two (bpf/kmem.bpf.c, in_task_work()), and the third is
memprof's own bookkeeping. Only the first nested event of each interrupt is caught (the
nested event's own `post` ends the window), so the counts are lower than memprof's. Without
interrupts to nest (an idle network) all counts are 0: run it while the machine takes
network traffic (say, a large `pip download`) to see some.

COMMAND defaults to examples/bin/kernel_churn 100000. Prints the counts, the task-work
events' kernel stacks, and memprof's own counts from the recording's meta.json.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACEPOINTS = ("kmem_cache_alloc", "kmalloc", "mm_page_alloc")
ATTACH_WAIT_S = 1.5  # a warm `memprof record` has attached its programs well within this
CLASSES = ("interrupt stack", "task stack, orig_ax < 0", "task work")
STALE_SLOT = 15
PROGRAM = r"""
#include <linux/sched.h>
BPF_ARRAY(armed, u64, 1);
BPF_PERCPU_ARRAY(depth, u64, 1);      /* 1 between an event's pre and its post */
BPF_PERCPU_ARRAY(outer_ctx, u64, 1);  /* the outer event's context address and task */
BPF_PERCPU_ARRAY(outer_task, u64, 1);
BPF_PERCPU_ARRAY(stats, u64, 16);     /* 0: outer events; 1 + 4 * tp + class; 15: stale depths */
BPF_STACK_TRACE(task_work_stacks, 1024);
BPF_HASH(task_work, int, u64);

static __always_inline void bump(u32 slot)
{
    u64 *v = stats.lookup(&slot);
    if (v)
        (*v)++;
}

static __always_inline int pre(void *ctx, u32 tp)
{
    u32 zero = 0;
    u64 *on = armed.lookup(&zero), *d = depth.lookup(&zero);
    u64 *octx = outer_ctx.lookup(&zero), *otask = outer_task.lookup(&zero);
    if (!on || !*on || !d || !octx || !otask)
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    /* A depth left set by a nested event whose own post was skipped (it came during the
     * outer event's post) is stale: a nested event runs on another stack, or deeper on the
     * same task's. */
    int stale = *d && *otask == (u64)task && (u64)ctx >= *octx;
    if (!*d || stale) {
        bump(0);
        if (stale)
            bump(STALE_SLOT);
        *d = 1;
        *octx = (u64)ctx;
        *otask = (u64)task;
        return 0;
    }
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    void *bottom = task->stack;
    u32 base = 1 + tp * 4;
    bump(base);
    if (!(bottom <= ctx && ctx < (void *)regs)) {
        bump(base + 1);
    } else if ((long)regs->orig_ax < 0) {
        bump(base + 2);
    } else {
        bump(base + 3);
        int id = task_work_stacks.get_stackid(ctx, 0);
        task_work.increment(id);
    }
    return 0;
}
int pre0(void *ctx) { return pre(ctx, 0); }
int pre1(void *ctx) { return pre(ctx, 1); }
int pre2(void *ctx) { return pre(ctx, 2); }
int post(void *ctx)
{
    u32 zero = 0;
    u64 *d = depth.lookup(&zero);
    if (d)
        *d = 0;
    return 0;
}
""".replace("STALE_SLOT", str(STALE_SLOT))


def attach(bpf, name: str, tracepoint: str) -> int:
    """Attach `name` to the raw tracepoint (after any attached before it). Returns the link fd."""
    from bcc import BPF
    from bcc.libbcc import lib
    fd = lib.bpf_attach_raw_tracepoint(bpf.load_func(name, BPF.RAW_TRACEPOINT).fd, tracepoint.encode())
    if fd < 0:
        sys.exit(f"nested_allocations: could not attach {name} to kmem:{tracepoint} (error {-fd})")
    return fd


def record(bpf, out: str, command: list[str]) -> None:
    """`memprof record` COMMAND between the pre and post programs; arms the count once both are on."""
    for i, tracepoint in enumerate(TRACEPOINTS):
        attach(bpf, f"pre{i}", tracepoint)
    recorder = subprocess.Popen([str(REPO / ".venv/bin/memprof"), "record", "-q", "--force", "-o", out, "--", *command],
                                cwd=REPO)
    time.sleep(ATTACH_WAIT_S)
    for tracepoint in TRACEPOINTS:
        attach(bpf, "post", tracepoint)
    bpf["depth"].clear()
    bpf["armed"][ctypes.c_int(0)] = ctypes.c_ulonglong(1)
    if recorder.wait():
        sys.exit(f"nested_allocations: memprof record exited {recorder.returncode}")


def print_counts(bpf, out: str) -> None:
    slots = [0] * 16
    for key, per_cpu in bpf["stats"].items():
        slots[key.value] = sum(per_cpu)
    print(f"events outside another's window: {slots[0]:,} (of them after a stale depth: {slots[STALE_SLOT]:,})")
    for i, tracepoint in enumerate(TRACEPOINTS):
        base = 1 + 4 * i
        classes = ", ".join(f"{name} {slots[base + 1 + j]:,}" for j, name in enumerate(CLASSES))
        print(f"{tracepoint}: nested {slots[base]:,}: {classes}")
    for key, count in sorted(bpf["task_work"].items(), key=lambda kv: -kv[1].value):
        print(f"task work, {count.value} event(s), kernel stack:")
        for address in list(bpf["task_work_stacks"].walk(key.value)) if key.value >= 0 else []:
            print("    " + bpf.ksym(address).decode())
    source = json.loads((Path(out) / "meta.json").read_text())["sources"]["ebpf"]
    detail = source.get("detail", {})
    print(f"memprof: missed {source.get('missed')}; nested_allocations {detail.get('nested_allocations')}; "
          f"interrupt_allocations {detail.get('interrupt_allocations')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the recording (overwritten; default: in a new private folder, printed)")
    parser.add_argument("command", nargs="*", help="the workload (default: examples/bin/kernel_churn 100000)")
    args = parser.parse_args()
    # Not a fixed name under /tmp, which any user could take first: a 0700 folder of root's.
    out = args.out or str(Path(tempfile.mkdtemp(prefix="nested_allocations.")) / "recording.memprof")
    from bcc import BPF
    bpf = BPF(text=PROGRAM, cflags=["-w"])  # the kernel headers' own warnings say nothing here
    record(bpf, out, args.command or [str(REPO / "examples/bin/kernel_churn"), "100000"])
    print_counts(bpf, out)
    print(f"the recording: {out}")


if __name__ == "__main__":
    main()
