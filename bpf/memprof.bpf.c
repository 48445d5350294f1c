/* memprof's BPF program, last part: follows the process tree (fork/exec/exit), notes each
 * system call's start for the kmem family, and marks the moment a process begins to exit.
 * memprof/sources/ebpf/loading.py joins the program text from common.bpf.c, the chosen
 * families (kmem.bpf.c, uprobes.bpf.c) and this file, so that every family shares one ring
 * buffer, one stack map and one process filter.
 *
 * Every program here is a raw tracepoint: bcc compiles each classic tracepoint program
 * (TRACEPOINT_PROBE) at ~80 ms more than the same program on a raw tracepoint, and six of
 * them were a third of every compile (bench/RESULTS.md). A raw tracepoint passes the
 * tracepoint's own arguments (its TP_PROTO, in ctx->args), not the classic event's fields:
 * what a field held is read from the structure it came from, at offsets from BTF.
 *
 * Constants:
 *   HAVE_EXIT_GROUP_DEAD  sched_process_exit passes group_dead (6.16+)
 *   TASK_PID_OFF          offset of `pid` (the thread's id) in task_struct
 *   TASK_TGID_OFF         offset of `tgid` (its process's id) in task_struct
 *   TASK_SIGNAL_OFF       offset of `signal` (its struct signal_struct *) in task_struct
 *   SIGNAL_GROUP_EXIT_CODE_OFF offset of group_exit_code in struct signal_struct
 *   TASK_TI_STATUS_OFF    offset of thread_info.status in task_struct (x86-64: TS_COMPAT)
 *   SIGACTION_HANDLER_OFF offset of sa.sa_handler in struct k_sigaction
 *   MP_KMEM_FAMILY        the kmem family is compiled (kernel_depth() needs the anchor)
 */
#include "parts.h" /* what the parts give each other */

/* ---- process tree: fork/exec/exit are rare ---- */

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

/* sched_process_fork(struct task_struct *parent, struct task_struct *child), in the parent:
 * a new task of a tracked process is tracked. Threads get a bit too (their tid), cleared
 * when they exit; only tgids are ever tested. Only a new process is told to user space: a
 * thread is not one (its tgid is its creator's), and each thread told was a process there
 * whose maps were read again every second and which never exited. */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return 0;
    u32 child = 0, child_tgid = 0;
    char *task = (char *)ctx->args[1];
    if (bpf_probe_read_kernel(&child, sizeof(child), task + TASK_PID_OFF) < 0 || !child)
        return 0;
    set_tracked(child, 1);
    if (bpf_probe_read_kernel(&child_tgid, sizeof(child_tgid), task + TASK_TGID_OFF) == 0 && child_tgid != child)
        return 0;
    py_inherit(tgid, child);
    lifecycle(MP_PROC_FORK, child, tgid);
    return 0;
}

/* sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm) */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return 0;
    /* The old image's interpreter is gone: no frames until user space finds the new one. */
    py_procs.delete(&tgid);
    py_threads.task_storage_delete(bpf_get_current_task_btf());
    struct mp_event *e = reserve(MP_PROC_EXEC);
    if (!e)
        return 0;
    e->addr = 0;
    e->pid = tgid;
    e->tid = (u32)ctx->args[1];
    /* The new program's name (exec has set it), 16 bytes over call_site and size: a compiler
     * or a tool that exits before user space reads /proc is named by it. */
    bpf_get_current_comm(&e->call_site, 2 * sizeof(e->call_site));
    submit(e);
    return 0;
}

/* sched_process_exit(struct task_struct *p[, bool group_dead]), in the exiting thread. */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, pid = (u32)id;
    if (!is_tracked(tgid))
        return 0;
#ifdef HAVE_EXIT_GROUP_DEAD
    int group_dead = (int)(ctx->args[1] & 1);
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

/* x86-64 system call numbers (the raw sys_enter tracepoint passes the number, not a name). */
#define MP_NR_MMAP 9
#define MP_NR_EXIT_GROUP 231
#define MP_PROT_EXEC 0x4
#define MP_TS_COMPAT 0x0002 /* thread_info.status: a 32-bit system call, numbered otherwise */

/* sys_enter(struct pt_regs *regs, long id), at every system call of every task: a tracked
 * thread's call notes where it began on the kernel stack (kernel_depth() in common.bpf.c,
 * which keys sibling kernel paths apart from it), and two calls matter to the process tree:
 * - mmap of an executable file (dlopen, lazy loading as torch does for libcuda): user space
 *   re-reads the process's maps at its next poll and probes allocators that just appeared;
 * - exit_group: the process begins to exit.
 * Their arguments are the task's registers at entry (pt_regs, BTF loads: rdx is mmap's
 * prot, r8 its fd). A 32-bit call has other numbers and is left out, as the classic
 * syscalls tracepoints did. */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(sys_enter)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if (!is_tracked(pid_tgid >> 32))
        return 0;
#ifdef MP_KMEM_FAMILY
    note_syscall_start(ctx, pid_tgid);
#endif
    long nr = (long)ctx->args[1];
    if (nr != MP_NR_MMAP && nr != MP_NR_EXIT_GROUP)
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    if (*(u32 *)((char *)task + TASK_TI_STATUS_OFF) & MP_TS_COMPAT)
        return 0;
    if (nr == MP_NR_EXIT_GROUP) {
        exit_mark(0);
        return 0;
    }
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    if ((regs->dx & MP_PROT_EXEC) && (long)regs->r8 >= 0)
        lifecycle(MP_MAP_EXEC, pid_tgid >> 32, 0);
    return 0;
}

/* Signals whose default action terminates the process (signal(7)). */
#define MP_FATAL_DEFAULT ((1ULL << 1) | (1ULL << 2) | (1ULL << 3) | (1ULL << 4) | (1ULL << 5) | \
    (1ULL << 6) | (1ULL << 7) | (1ULL << 8) | (1ULL << 9) | (1ULL << 11) | (1ULL << 13) | \
    (1ULL << 14) | (1ULL << 15) | (1ULL << 24) | (1ULL << 25) | (1ULL << 26) | (1ULL << 27) | \
    (1ULL << 31))

/* The signal a SIGKILL being delivered stands for: a fatal signal that dumps no core (SIGTERM
 * left to its default) is turned by the kernel into SIGKILL for every thread of the group
 * before delivery (complete_signal), which notes the signal itself in the group's
 * group_exit_code; 9 where that says nothing else (a kill -9). */
static __always_inline int killing_signal(void)
{
    char *signal = 0;
    int code = 0;
    if (bpf_probe_read_kernel(&signal, sizeof(signal), (char *)bpf_get_current_task() + TASK_SIGNAL_OFF) < 0 || !signal
        || bpf_probe_read_kernel(&code, sizeof(code), signal + SIGNAL_GROUP_EXIT_CODE_OFF) < 0)
        return 9;
    code &= 0x7f; /* the core-dump bit is 0x80 */
    return code > 0 && code < 64 ? code : 9;
}

/* signal_deliver(int sig, struct kernel_siginfo *info, struct k_sigaction *ka): a signal
 * that kills (SIGKILL, or one whose action is the default and the default terminates). */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(signal_deliver)
{
    int sig = (int)ctx->args[0];
    if (sig <= 0 || sig >= 64 || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 handler = 1;
    if (sig != 9 && bpf_probe_read_kernel(&handler, sizeof(handler), (char *)ctx->args[2] + SIGACTION_HANDLER_OFF) < 0)
        return 0;
    if (sig == 9)
        exit_mark(killing_signal());
    else if (handler == 0 && ((MP_FATAL_DEFAULT >> sig) & 1))
        exit_mark(sig);
    return 0;
}

/* uprobe on Py_FinalizeEx: a Python target begins interpreter teardown. */
MP_USER_PROGRAM int mp_py_finalize(struct pt_regs *ctx)
{
    exit_mark(1000);
    return 0;
}
