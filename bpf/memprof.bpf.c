/* memprof's BPF program, last part: follows the process tree (fork/exec/exit) and marks the
 * moment a process begins to exit. memprof/sources/ebpf/loading.py joins the program text from
 * common.bpf.c, the chosen families (kmem.bpf.c, uprobes.bpf.c) and this file, so that
 * every family shares one ring buffer, one stack map and one process filter.
 *
 * Constants:
 *   HAVE_EXIT_GROUP_DEAD  sched_process_exit has the group_dead field (6.x+)
 */
#include "parts.h" /* what the parts give each other */

/* ---- process tree: fork/exec/exit are rare, classic tracepoints are fine ---- */

static __always_inline void lifecycle(u8 kind, u32 pid, u32 other)
{
    struct mp_event *e = reserve(kind);
    if (!e)
        return;
    e->addr = 0;
    e->pid = pid;
    e->tid = other;
    submit(e);
}

/* A new task of a tracked process is tracked. Threads get a bit too (their tid), cleared
 * when they exit; only tgids are ever tested. */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return 0;
    set_tracked(args->child_pid, 1);
    lifecycle(MP_PROC_FORK, args->child_pid, tgid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (is_tracked(tgid)) {
        /* The old image's interpreter is gone: no frames until user space finds the new one. */
        py_procs.delete(&tgid);
        py_threads.task_storage_delete(bpf_get_current_task_btf());
        lifecycle(MP_PROC_EXEC, tgid, args->old_pid);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, pid = (u32)id;
    if (!is_tracked(tgid))
        return 0;
#ifdef HAVE_EXIT_GROUP_DEAD
    int group_dead = args->group_dead;
#else
    int group_dead = pid == tgid;
#endif
    if (pid != tgid)
        set_tracked(pid, 0);
    if (group_dead) {
        py_procs.delete(&tgid);
        lifecycle(MP_PROC_EXIT, tgid, pid);
        set_tracked(tgid, 0);
    }
    return 0;
}

/* A library mapped executable (dlopen, lazy loading as torch does for libcuda): user space
 * re-reads the process's maps at its next poll and probes allocators that just appeared. */
TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if ((args->prot & 0x4 /* PROT_EXEC */) && (long)args->fd >= 0 && is_tracked(tgid))
        lifecycle(MP_MAP_EXEC, tgid, 0);
    return 0;
}

/* The moment a process begins to exit, before the kernel's teardown frees what it held. */
static __always_inline void exit_mark(u32 why)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return;
    struct mp_event *e = reserve(MP_EXIT_MARK);
    if (!e)
        return;
    e->addr = 0;
    e->requested = why;
    submit(e);
}

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    exit_mark(0);
    return 0;
}

/* Signals whose default action terminates the process (signal(7)). */
#define MP_FATAL_DEFAULT ((1ULL << 1) | (1ULL << 2) | (1ULL << 3) | (1ULL << 4) | (1ULL << 5) | \
    (1ULL << 6) | (1ULL << 7) | (1ULL << 8) | (1ULL << 9) | (1ULL << 11) | (1ULL << 13) | \
    (1ULL << 14) | (1ULL << 15) | (1ULL << 24) | (1ULL << 25) | (1ULL << 26) | (1ULL << 27) | \
    (1ULL << 31))

TRACEPOINT_PROBE(signal, signal_deliver)
{
    int sig = args->sig;
    if (sig <= 0 || sig >= 64)
        return 0;
    if (sig == 9 || (args->sa_handler == 0 && ((MP_FATAL_DEFAULT >> sig) & 1)))
        exit_mark(sig);
    return 0;
}

/* uprobe on Py_FinalizeEx: a Python target begins interpreter teardown. */
int mp_py_finalize(struct pt_regs *ctx)
{
    exit_mark(1000);
    return 0;
}
