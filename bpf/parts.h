/* What the parts of memprof's BPF program give each other.
 *
 * memprof/sources/ebpf/loading.py (program_text) joins the parts into one text, in this order:
 *
 *   common.bpf.c  python.bpf.c  kmem.bpf.c  uprobes.bpf.c  memprof.bpf.c
 *
 * (kmem.bpf.c only with the kmem family). Each part includes this header first, so every
 * function a part calls in another is declared here before any part's code: no part relies
 * on the order to see a function, and none calls another's helper without it being listed
 * here. Maps cannot be declared ahead (bcc's BPF_HASH and kin define them), so a map one
 * part uses from another is listed under its part below, and must come from an earlier
 * part. bpf/README.md ("Parts") says what each part uses; tests/unit/test_bpf_parts.py checks it
 * against the parts' text: a call into another part that is not declared here, a
 * declaration that no longer matches its definition, or a map used from another part that
 * is not listed fails it.
 */
#ifndef MEMPROF_PARTS_H
#define MEMPROF_PARTS_H

#include "memprof.h"

/* == every part: which half of a split compile compiles a program ==
 * A first run compiles the program in two children at once (memprof/sources/ebpf/
 * compile_child.py), one with -DMP_HALF=1 (the kernel's programs: kmem's, the process
 * tree's, the Python learning of a kernel event), one with -DMP_HALF=2 (the user-space
 * probes' and the other Python programs), and joins what they compiled on one set of maps.
 * In each half the other half's programs are static and unused, which clang does not emit.
 * Without MP_HALF (a compile of the whole program) every program is compiled. Every
 * program carries one of the two (tests/unit/test_bpf_parts.py). */
#if defined(MP_HALF) && MP_HALF == 2
#define MP_KERNEL_PROGRAM static __attribute__((unused))
#else
#define MP_KERNEL_PROGRAM
#endif
#if defined(MP_HALF) && MP_HALF == 1
#define MP_USER_PROGRAM static __attribute__((unused))
#else
#define MP_USER_PROGRAM
#endif

/* == every part: reading user memory ==
 * bpf_probe_read_user under a name of bcc's front end does not know. The front end checks
 * each call it sees to bpf_probe_read_user against kallsyms (to fall back to bpf_probe_read
 * on kernels before 5.5), and bcc 0.26's KSyms::resolve_name rebuilds its map of all the
 * kernel's symbols (~120,000 here) at every such check, as kallsyms repeats names and its
 * "already built" test compares counts: ~35 ms a call site, 0.3-0.4 s of every compile with
 * the parts' ten sites (bench/RESULTS.md). memprof needs a 5.11+ kernel (task storage). */
static long (*read_user)(void *dst, u32 size, const void *unsafe_ptr) = (void *)BPF_FUNC_probe_read_user;

/* == common.bpf.c: the ring buffer, the stack maps, the process and address filters == */
/* A system call as this_call() found it, kept across tail calls (still_this_call()). */
struct call_mark {
    u64 user_ip, user_sp, switches;
    u32 in_call;
    u32 pad;
};
/* The system call a tracked thread last began on this CPU (memprof.bpf.c's sys_enter
 * sets it): the thread, where the call began on its kernel stack (the address of the raw
 * sys_enter tracepoint's context), and how many events at mixed keys it has had so far.
 * Per CPU rather than per thread (a task-storage lookup cost twice as much per system call):
 * a thread that slept or moved mid-call finds another thread's, or none, and goes without. */
struct syscall_anchor {
    u64 stack;
    u64 here; /* kernel_depth()'s own address_in() slot (only task work reaches it: no nesting) */
    u64 mixed_events;
    u64 user_ip; /* the call's return address in user space: a later fault or interrupt has another */
    u64 user_sp;
    u64 switches; /* the thread's context switches at the call's start (see word_at_user_sp) */
    u64 word_at_sp; /* the word at user_sp, once an event of the call read it */
    u64 py_stack; /* the thread's Python stack id, once an event of the call walked it */
    u32 tid;
    u32 word_read;
    u32 py_walked;
    u32 pad;
};

static __always_inline void count(u32 slot);
static __always_inline int is_tracked(u32 tgid);
static __always_inline void set_tracked(u32 tgid, int on);
static __always_inline void remember_addr(u64 addr);
static __always_inline int maybe_ours(u64 addr);
static __always_inline void hold_addr(u64 addr);
static __always_inline int release_addr(u64 addr);
static __always_inline void init_event(struct mp_event *e, u8 kind);
static __always_inline struct mp_event *reserve(u8 kind);
static __always_inline void submit(struct mp_event *e);
static __always_inline void output(struct mp_event *e);
static __always_inline void fill_user_stack(struct pt_regs *ctx, struct mp_event *e, u64 mask, u64 call_site,
                                            u64 skip);
static __always_inline struct syscall_anchor *fill_stacks(void *ctx, struct mp_event *e, u64 mask, u64 site,
                                                          struct task_struct *task, struct pt_regs *regs);
static __always_inline void note_syscall_start(void *ctx, u64 pid_tgid);
static __always_inline struct syscall_anchor *still_this_call(struct call_mark mark);
static __always_inline struct call_mark mark_of_call(struct syscall_anchor *a);

/* == python.bpf.c: the allocating thread's Python frames ==
 * Maps memprof.bpf.c uses (a process's or thread's interpreter state, forgotten when it
 * exits or execs):
 *   maps: py_procs, py_threads */
static __always_inline void emit_alloc(void *ctx, struct mp_event *e, const int raw_tp, struct syscall_anchor *call);
static __always_inline u64 read_user_u64(u64 addr);
static __always_inline void py_inherit(u32 parent, u32 child);

/* == kmem.bpf.c, uprobes.bpf.c, memprof.bpf.c: programs only, nothing for other parts == */

#endif
