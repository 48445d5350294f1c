/* Maps and helpers shared by every memprof probe family: one ring buffer, one stack map,
 * the process filter, the address filter, counters. The first part of the program text
 * (memprof/sources/ebpf/loading.py joins the parts: bcc rewrites map calls such as
 * `events.ringbuf_reserve()` only in the text it is given, not in #included files).
 *
 * Constants (-D, from memprof/sources/ebpf/loading.py):
 *   RINGBUF_PAGES         ring buffer size in pages (power of two)
 *   STACK_ENTRIES         buckets in the stack map (kernel stacks)
 *   USTACK_DEPTH, USTACK_ENTRIES  frames kept per user stack, user stacks kept
 *   TRACKED_WORDS         u64 words of the tgid bitmap (pid_max / 64 + 1)
 *   ADDR_BITS_LOG2        log2 of the bits in the allocated-address filter
 *   TASK_NVCSW_OFF, TASK_NIVCSW_OFF  offsets of the context-switch counts in task_struct
 */
#include <uapi/linux/ptrace.h>
#include "memprof.h"
#include "parts.h" /* what the parts give each other */

/* Where an allocation comes from, cheaply: the kernel call site, plus the user stack
 * pointer at syscall entry and the word it points at — enough to keep two user paths into
 * one kernel call site apart without unwinding. The word tells apart two callers of one
 * frameless glibc wrapper at one depth (site_a and site_b both calling pipe() from main):
 * there it is the wrapper's return address, into each caller. */
struct site_key {
    u64 call_site;
    u64 user_sp;
    u64 word_at_sp;
    u32 tgid;
    u32 layer;
    u64 kernel_depth; /* 0, or for a mixed key's sub-keys: see kernel_depth() */
};

/* User stacks, keyed by a 64-bit hash of their frames: unlike the kernel's stack map, whose
 * bucket is the hash modulo its size and refuses a second stack for a taken bucket (-EEXIST),
 * two stacks here share a key only on a 64-bit collision. Least-recently-used: user space
 * reads a stack at the flush after the event that took it (every 0.5 s). */
#define USTACK_INDEX_MASK 127 /* USTACK_DEPTH < 128: an index the verifier sees in bounds */
#if USTACK_DEPTH > USTACK_INDEX_MASK
#error "USTACK_DEPTH must be below 128"
#endif
struct ustack_trace {
    u64 ip[USTACK_INDEX_MASK + 1]; /* USTACK_DEPTH frames, then zeros; the last: WORD_AT_SP_SLOT */
};
/* Kernel events' user stacks keep the word at the user stack pointer in their last slot
 * (0 for user-space allocators'): user space makes it the caller's frame where the .eh_frame
 * says the interrupted function is frameless (memprof/sources/symbols/frameless.py). */
#define WORD_AT_SP_SLOT USTACK_INDEX_MASK

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_STACK_TRACE(stacks, STACK_ENTRIES);
BPF_TABLE("lru_hash", u64, struct ustack_trace, ustacks, USTACK_ENTRIES);
/* The user stack being taken on this CPU; `busy` while it is (see python.bpf.c's py_scratch:
 * an event nested in the taking goes without a stack of its own). */
struct ustack_scratch {
    struct ustack_trace trace;
    u32 busy;
};
BPF_PERCPU_ARRAY(ustack_scratch, struct ustack_scratch, 1);
BPF_ARRAY(tracked, u64, TRACKED_WORDS);
/* Two bitmaps in one array: the address filter's 2^ADDR_BITS_LOG2 bits, then the held bits'
 * 2^HELD_BITS_LOG2 (see below). */
#define HELD_BITS_LOG2 22
#define ADDR_FILTER_WORDS ((1 << ADDR_BITS_LOG2) / 64)
BPF_ARRAY(addr_filter, u64, ADDR_FILTER_WORDS + (1 << HELD_BITS_LOG2) / 64);
BPF_PERCPU_ARRAY(counters, u64, MP_N_COUNTERS);
/* A reuse key's latest stacks. `takes`: stacks taken at the key so far (saturating at
 * SITE_LEARN_TAKES); `mixed`: two kernel stacks taken at the key differed — one call site
 * reached through sibling kernel paths at one user stack pointer (a pipe's two files, both
 * through alloc_empty_file in one pipe2) — and from then on its events look up a sub-key
 * of it instead (kernel_depth; see fill_stacks). */
struct site_stack {
    s64 kstack_id;
    u64 ustack;
    u32 takes;
    u32 mixed;
};
BPF_HASH(site_stacks, struct site_key, struct site_stack, 16384);
/* struct syscall_anchor: parts.h */
BPF_PERCPU_ARRAY(syscall_anchors, struct syscall_anchor, 1);

static __always_inline void count(u32 slot)
{
    u64 *c = counters.lookup(&slot);
    if (c)
        (*c)++;
}

/* Bit for a tgid in the tracked bitmap; array lookups are inlined by the verifier. */
static __always_inline u64 *tracked_word(u32 tgid, u64 *bit)
{
    u32 idx = tgid >> 6;
    *bit = 1ULL << (tgid & 63);
    return tracked.lookup(&idx);
}

static __always_inline int is_tracked(u32 tgid)
{
    u64 bit;
    u64 *w = tracked_word(tgid, &bit);
    return w && (*w & bit);
}

static __always_inline void set_tracked(u32 tgid, int on)
{
    u64 bit;
    u64 *w = tracked_word(tgid, &bit);
    if (!w)
        return;
    if (on)
        __sync_fetch_and_or(w, bit);
    else
        __sync_fetch_and_and(w, ~bit);
}

/* The word holding `addr`'s bit in the bitmap of 2^bits_log2 bits that starts at word `base`
 * of addr_filter (a multiplicative hash), and the bit (`*bit`). */
static __always_inline u64 *bitmap_word(u64 addr, u32 bits_log2, u32 base, u64 *bit)
{
    u64 h = (addr * 0x9E3779B97F4A7C15ULL) >> (64 - bits_log2);
    u32 idx = base + (u32)(h >> 6);
    *bit = 1ULL << (h & 63);
    return addr_filter.lookup(&idx);
}

static __always_inline void set_bit_once(u64 *w, u64 bit)
{
    if (w && !(*w & bit))
        __sync_fetch_and_or(w, bit);
}

/* The address filter remembers every address the target was handed (never cleared:
 * collisions only let extra frees through, which user space drops as unmatched). Frees
 * happen in any context — RCU callbacks, kworkers — so they cannot be filtered by process;
 * this keeps unrelated frees out of the ring buffer. */
static __always_inline void remember_addr(u64 addr)
{
    u64 bit;
    u64 *w = bitmap_word(addr, ADDR_BITS_LOG2, 0, &bit);
    set_bit_once(w, bit);
}

static __always_inline int maybe_ours(u64 addr)
{
    u64 bit;
    u64 *w = bitmap_word(addr, ADDR_BITS_LOG2, 0, &bit);
    return w && (*w & bit);
}

/* Which kernel allocations the target still holds, for the teardown (capture/session.py):
 * after the target's exit, memprof listens for the kernel's last frees of what it held. The
 * address filter cannot tell those from other processes' frees of addresses the target once
 * had — the kernel hands a freed address to its next taker at once — and those came by the
 * thousand after a training run's exit, keeping the teardown waiting. A held bit is set at
 * the target's allocation and cleared by the free that finds it set, which kmem.bpf.c flags
 * MP_FLAG_HELD. The bits are hashed, so two held addresses can share one: then one free
 * goes unflagged, or a foreign free is flagged. Only the teardown's wait reads the flag;
 * every free is recorded either way. 2^22 bits (512 KiB). */
static __always_inline void hold_addr(u64 addr)
{
    u64 bit;
    u64 *w = bitmap_word(addr, HELD_BITS_LOG2, ADDR_FILTER_WORDS, &bit);
    set_bit_once(w, bit);
}

/* 1 when `addr` was held (and is not any more). */
static __always_inline int release_addr(u64 addr)
{
    u64 bit;
    u64 *w = bitmap_word(addr, HELD_BITS_LOG2, ADDR_FILTER_WORDS, &bit);
    if (!w || !(*w & bit))
        return 0;
    __sync_fetch_and_and(w, ~bit);
    return 1;
}

/* An event of `kind` by the calling thread, stamped now, with no address, size or stacks. */
static __always_inline void init_event(struct mp_event *e, u8 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->kind = kind;
    e->layer = 0;
    e->flags = 0;
    e->device = -1;
    e->call_site = 0;
    e->size = 0;
    e->requested = 0;
    e->kstack_id = -1;
    e->pad = 0;
    e->ustack = 0;
    e->py_stack = 0;
}

/* A record of `kind` reserved in the ring buffer (see init_event); NULL, counted, when the
 * ring is full. */
static __always_inline struct mp_event *reserve(u8 kind)
{
    struct mp_event *e = events.ringbuf_reserve(sizeof(struct mp_event));
    if (!e) {
        count(MP_CNT_RINGBUF_FULL);
        return 0;
    }
    init_event(e, kind);
    return e;
}

/* Wake-ups are left to user space, which polls on a timer: a wake-up per record would
 * cost an irq_work per event. */
static __always_inline void submit(struct mp_event *e)
{
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* An event built outside the ring (an allocation's, on the BPF stack or in the Python walk's
 * scratch: it outlives its program there, see python.bpf.c's emit_alloc) copied into it. */
static __always_inline void output(struct mp_event *e)
{
    if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP) < 0)
        count(MP_CNT_RINGBUF_FULL);
}

/* Stacks are expensive (an unwind per event); take them for one allocation in
 * (MASK + 1), and for the first allocation of each call site; the others inherit the latest
 * stacks taken at their call site in the same process. */
struct user_entry {
    u64 ip; /* where user space resumes: for a system call, the instruction after `syscall` */
    u64 sp;
};

/* The task's user instruction and stack pointers at kernel entry (pt_regs' ip and sp: two
 * loads, no unwinding, no user memory access). A loop reaching one syscall through one call
 * path does so at one stack depth, two paths (a helper and its caller) at two — with or
 * without frame pointers. `regs` is bpf_task_pt_regs()'s typed (BTF) pointer, which an
 * event's program takes once (a helper call) and hands on: these are plain loads the kernel
 * guards against faults itself, not a bpf_probe_read_kernel() call each: ~20-40 ns less per
 * event (bench/RESULTS.md). */
static __always_inline struct user_entry task_user_entry(struct pt_regs *regs)
{
    struct user_entry entry = {.ip = regs->ip, .sp = regs->sp};
    return entry;
}

/* How many times the task has been switched out, voluntarily or not (BTF loads). */
static __always_inline u64 task_switches(struct task_struct *task)
{
    return *(unsigned long *)((char *)task + TASK_NVCSW_OFF) + *(unsigned long *)((char *)task + TASK_NIVCSW_OFF);
}

/* Take a sample tick: 1 when this allocation takes its own stacks (one in mask + 1). */
static __always_inline int stack_sample_due(u64 mask)
{
    u32 slot = MP_CNT_SAMPLE_TICK;
    u64 *tick = counters.lookup(&slot);
    if (!tick)
        return 1;
    (*tick)++;
    return ((*tick - 1) & mask) == 0;
}

static __always_inline u64 hash_user_stack(struct ustack_trace *buf, void *ctx, u64 skip, u64 word_at_sp);

/* take_user_stack() when this event interrupted another's taking (see `struct
 * ustack_scratch`): no stack, and none to remember for the site either — the site's next
 * event may well take one. Even, so never a key (keys are odd). */
#define USTACK_NESTED 2ULL

/* The current task's user stack (innermost `skip` frames left out) and `word_at_sp`, stored
 * in `ustacks`: its key there, 0 when it could not be taken, or USTACK_NESTED. */
static __always_inline u64 take_user_stack(void *ctx, u64 skip, u64 word_at_sp)
{
    u32 zero = 0;
    struct ustack_scratch *scratch = ustack_scratch.lookup(&zero);
    if (!scratch)
        return 0;
    if (scratch->busy) {
        count(MP_CNT_SCRATCH_BUSY);
        return USTACK_NESTED;
    }
    scratch->busy = 1;
    u64 key = hash_user_stack(&scratch->trace, ctx, skip, word_at_sp);
    scratch->busy = 0;
    return key;
}

/* take_user_stack's work, with the scratch `buf` held. */
static __always_inline u64 hash_user_stack(struct ustack_trace *buf, void *ctx, u64 skip, u64 word_at_sp)
{
    long bytes = bpf_get_stack(ctx, buf->ip, USTACK_DEPTH * sizeof(u64), BPF_F_USER_STACK | (skip & BPF_F_SKIP_FIELD_MASK));
    if (bytes <= 0) {
        count(MP_CNT_STACK_FAIL);
        return 0;
    }
    u32 frames = bytes / sizeof(u64);
    u64 hash = 0xcbf29ce484222325ULL;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < USTACK_DEPTH; i++) {
        if (i >= frames)
            break;
        hash = (hash ^ buf->ip[i & USTACK_INDEX_MASK]) * 0x100000001b3ULL;
    }
    buf->ip[WORD_AT_SP_SLOT] = word_at_sp; /* bpf_get_stack zeroed the slots it did not fill, not this one */
    hash = (hash ^ word_at_sp) * 0x100000001b3ULL;
    hash |= 1; /* never 0, which means "none" */
    if (!ustacks.lookup(&hash) && ustacks.update(&hash, buf) < 0) {
        count(MP_CNT_STACK_FAIL);
        return 0;
    }
    return hash;
}

/* User-space allocators: the user stack, sampled the same way, per site = the allocator's
 * return address (the caller's next instruction) + the stack pointer. `skip`: innermost
 * frames left out (a probe inside the allocator leaves out the allocator's own frame, so
 * that its stacks read as those taken at its return). */
static __always_inline void fill_user_stack(struct pt_regs *ctx, struct mp_event *e, u64 mask, u64 call_site,
                                            u64 skip)
{
    struct site_key key = {.call_site = call_site, .user_sp = PT_REGS_SP(ctx), .tgid = e->pid, .layer = e->layer};
    if (!stack_sample_due(mask)) {
        struct site_stack *cached = site_stacks.lookup(&key);
        if (cached) {
            e->ustack = cached->ustack;
            return;
        }
    }
    e->ustack = take_user_stack(ctx, skip, 0);
    if (e->ustack == USTACK_NESTED) {
        e->ustack = 0;
        return;
    }
    e->flags |= MP_FLAG_STACK_SAMPLED;
    struct site_stack taken = {.kstack_id = -1, .ustack = e->ustack};
    if (site_stacks.update(&key, &taken) < 0)
        count(MP_CNT_SITE_FULL);
}

/* The address `p` holds, as a number, by way of `slot`, a word of a per-CPU map value that
 * no program nested on this CPU uses meanwhile: the verifier lets the privileged programs
 * memprof loads store a pointer in a map value, and a load from one is a number (never
 * dereferenced). No helper call: bpf_probe_read_kernel() of the pointer cost ~20-30 ns. */
static __always_inline u64 address_in(u64 *slot, void *p)
{
    *(void *volatile *)slot = p;
    return *(volatile u64 *)slot;
}

#define KSTACK_WINDOW 16384ULL       /* THREAD_SIZE and IRQ_STACK_SIZE on x86-64 */
#define KDEPTH_FROM_SYSCALL (1ULL << 62)
#define KDEPTH_IN_STACK (1ULL << 63)
#define KDEPTH_ORDINALS 255ULL       /* events counted per system call; later ones share the last */

/* Which of a mixed key's paths this event is likely on, as a sub-key: where on the kernel
 * stack its probe runs, and its place among the mixed keys' events of the current system
 * call. Sibling paths through one call site differ in one or the other: a pipe's two files
 * come through alloc_empty_file at two depths; a socketpair's two sockets through one depth
 * (two calls from __sys_socketpair), first and second. Depth is counted from the system
 * call's start, as the kernel moves each call's frames by a random offset below its fixed
 * pt_regs (CONFIG_RANDOMIZE_KSTACK_OFFSET). Outside a system call seen starting (its thread
 * and user return address `user_ip` do not match: a page fault, a call
 * begun before memprof attached) the position within the 16 KiB stack stands in, which no
 * random offset moves there. Each sub-key learns its own stacks, so only cost, not truth, is
 * at stake: a sub-key found mixed again takes a kernel stack per event. `ctx`: the raw
 * tracepoint's context, which lives on the kernel stack. */
static __always_inline u64 kernel_depth(void *ctx, u64 user_ip)
{
    u32 zero = 0;
    struct syscall_anchor *a = syscall_anchors.lookup(&zero);
    if (!a)
        return KDEPTH_IN_STACK;
    u64 here = address_in(&a->here, ctx);
    if (a->tid != (u32)bpf_get_current_pid_tgid() || a->user_ip != user_ip ||
        a->stack <= here || a->stack - here >= KSTACK_WINDOW)
        return KDEPTH_IN_STACK | (here & (KSTACK_WINDOW - 1));
    u64 ordinal = a->mixed_events < KDEPTH_ORDINALS ? a->mixed_events : KDEPTH_ORDINALS;
    a->mixed_events++;
    return KDEPTH_FROM_SYSCALL | (ordinal << 16) | (a->stack - here);
}

/* At a tracked thread's system call entry (memprof.bpf.c's raw sys_enter program, `ctx` its
 * context, `pid_tgid` the thread's): note where the call began on the kernel stack, after
 * the kernel moved it by its random offset, and start its count of events at mixed keys —
 * what kernel_depth() counts from — and what word_at_user_sp() checks before it takes the
 * word at the user stack pointer from here. */
static __always_inline void note_syscall_start(void *ctx, u64 pid_tgid)
{
    u32 zero = 0;
    struct syscall_anchor *a = syscall_anchors.lookup(&zero);
    if (!a)
        return;
    struct task_struct *task = bpf_get_current_task_btf();
    struct user_entry entry = task_user_entry((struct pt_regs *)bpf_task_pt_regs(task));
    a->tid = (u32)pid_tgid;
    address_in(&a->stack, ctx);
    a->user_ip = entry.ip;
    a->user_sp = entry.sp;
    a->switches = task_switches(task);
    a->word_read = 0;
    a->py_walked = 0;
    a->mixed_events = 0;
}

/* The current kernel stack's id in `stacks`, or < 0. The map keeps one stack per bucket
 * (a hash of its frames, modulo its size) and refuses another stack for a taken bucket
 * (-EEXIST). A recording of examples/bin/kernel_leak has about 90 distinct kernel stacks,
 * in 32768 buckets: by the birthday bound two share one in about one recording in nine (2 of
 * 5 here), and every take of the stack that lost failed for the whole run — its events fell
 * back to their call site, or reused a sibling's stack. Without its innermost
 * frame (the tracing frame, which user space drops anyway) the same stack hashes to another
 * bucket: only a second collision loses it. */
#define MP_EEXIST 17
static __always_inline s64 take_kernel_stack(void *ctx)
{
    s64 id = stacks.get_stackid(ctx, 0);
    if (id == -MP_EEXIST)
        id = stacks.get_stackid(ctx, 1);
    if (id < 0)
        count(MP_CNT_STACK_FAIL);
    return id;
}

/* A key's first SITE_LEARN_TAKES events take their own stacks, so that sibling paths that
 * alternate (as a pipe's two files do) mark the key mixed before its first reuse. Paths that
 * take turns more slowly are caught at the key's next sampled event (one in mask + 1). */
#define SITE_LEARN_TAKES 2

/* A key's cache after it took `kstack_id` and `ustack`: marked mixed when the kernel stack
 * differs from the one taken there before — a failed take (< 0) included, as it leaves the
 * key's path unknown, and a mixed key's events that fail are then charged to their call
 * site alone rather than to another path's stack. Writes race
 * between CPUs harmlessly: each field is one aligned store, and `mixed` only ever becomes 1. */
static __always_inline void remember_taken(struct site_stack *cached, s64 kstack_id, u64 ustack)
{
    if (kstack_id != cached->kstack_id && !cached->mixed) {
        cached->mixed = 1;
        count(MP_CNT_SITE_MIXED);
    }
    cached->kstack_id = kstack_id;
    cached->ustack = ustack;
    if (cached->takes < SITE_LEARN_TAKES)
        cached->takes++;
}

/* This CPU's anchor when it is the system call the current thread is in, else 0.
 * The anchor is per CPU: it is this call's only while it names this thread, the thread's
 * user entry (ip and sp) and its context-switch count at the call's start. A thread switched
 * out since (it may have moved to another CPU, whose anchor may hold an earlier call of its
 * own from the same place, reached through another caller) gets 0, as does an event outside
 * a system call seen starting (a page fault). While it is the call's, the thread has run no
 * user instruction since the call began: what the call's first event read of user space
 * (the word at the stack pointer, the Python stack) holds for its later events. */
static __always_inline struct syscall_anchor *this_call(struct task_struct *task, struct user_entry entry)
{
    u32 zero = 0;
    struct syscall_anchor *a = syscall_anchors.lookup(&zero);
    if (a && a->tid == (u32)bpf_get_current_pid_tgid() && a->user_ip == entry.ip &&
        a->user_sp == entry.sp && a->switches == task_switches(task))
        return a;
    return 0;
}

/* The call `mark` names (mark_of_call()) if it is still the current thread's call, as an
 * event's program found it before its tail calls (which can be preempted: the thread's
 * switch count then moved), else 0. */
static __always_inline struct syscall_anchor *still_this_call(struct call_mark mark)
{
    if (!mark.in_call)
        return 0;
    struct user_entry entry = {.ip = mark.user_ip, .sp = mark.user_sp};
    struct syscall_anchor *a = this_call(bpf_get_current_task_btf(), entry);
    return a && a->switches == mark.switches ? a : 0; /* (this_call: and the task's count is still it) */
}

/* What still_this_call() compares: the call `a` is (none when a is 0). */
static __always_inline struct call_mark mark_of_call(struct syscall_anchor *a)
{
    struct call_mark mark = {};
    if (a) {
        mark.user_ip = a->user_ip;
        mark.user_sp = a->user_sp;
        mark.switches = a->switches;
        mark.in_call = 1;
    }
    return mark;
}

/* The word at the user stack pointer of `entry` (0 where it is not resident), which keys
 * two callers of one frameless wrapper apart (see struct site_key). A user read costs ~70 ns
 * (bpf/README.md) and a system call makes several allocations (a pipe2 nine slab objects, a
 * socketpair twelve) at one user stack pointer, which does not move while the call runs:
 * the call's first event reads the word into the system call's anchor (this_call()), and
 * its later events take it there. `a`: this_call()'s anchor, or 0. */
static __always_inline u64 word_at_user_sp(struct syscall_anchor *a, struct user_entry entry)
{
    u64 word = 0;
    if (a && a->word_read)
        return a->word_at_sp;
    if (entry.sp && read_user(&word, sizeof(word), (void *)entry.sp) < 0)
        word = 0; /* not resident: the key and the stack go without it */
    if (a) {
        a->word_at_sp = word;
        a->word_read = 1;
    }
    return word;
}

/* Native stacks are sampled; the Python stack is read for every event (by emit_alloc, in
 * python.bpf.c: it is what a reused native stack cannot tell apart, one C call path runs
 * every Python function). `site`: the
 * kernel call site, or for page allocations (which have none) a stand-in from the order and
 * gfp flags, see PAGE_SITE. The reuse key (site, user stack pointer, the word there) cannot
 * tell sibling kernel paths apart (a pipe's two files, both through alloc_empty_file in one
 * pipe2): a key seen to lead to two kernel stacks is marked mixed, and its events are then
 * keyed by their kernel stack depth and place in their system call too (kernel_depth). A
 * sub-key that is mixed again takes its own kernel stack for every event, with the key's
 * user stack.
 * An unwind per event would be the simple answer, and costs 2.2 µs per event here: kernel
 * churn went from 2.2x to 4.5x (bench/RESULTS.md).
 * Returns the system call the event is in (this_call()), or 0: emit_alloc() takes the
 * Python stack an earlier event of the same call walked. */
static __always_inline struct syscall_anchor *fill_stacks(void *ctx, struct mp_event *e, u64 mask, u64 site,
                                                          struct task_struct *task, struct pt_regs *regs)
{
    struct user_entry entry = task_user_entry(regs);
    struct syscall_anchor *call = this_call(task, entry);
    u64 user_sp = entry.sp, word_at_sp = word_at_user_sp(call, entry);
    struct site_key key = {.call_site = site, .user_sp = user_sp, .word_at_sp = word_at_sp, .tgid = e->pid, .layer = e->layer};
    struct site_stack *cached = site_stacks.lookup(&key);
    if (cached && cached->mixed) {
        /* Sibling paths share this key: each sub-key keeps stacks of its own, and one
         * found mixed again takes its own kernel stacks. */
        key.kernel_depth = kernel_depth(ctx, entry.ip);
        cached = site_stacks.lookup(&key);
    }
    int due = stack_sample_due(mask);
    if (cached && !due && cached->takes >= SITE_LEARN_TAKES) {
        e->ustack = cached->ustack;
        if (!cached->mixed) {
            e->kstack_id = cached->kstack_id;
            return call;
        }
        e->kstack_id = take_kernel_stack(ctx);
        return call;
    }
    e->kstack_id = take_kernel_stack(ctx);
    e->ustack = take_user_stack(ctx, 0, word_at_sp);
    e->flags |= MP_FLAG_STACK_SAMPLED;
    if (e->ustack == USTACK_NESTED) {
        /* Its kernel stack is its own; a site's cache holds both, so it is left as it was. */
        e->ustack = 0;
        return call;
    }
    if (cached) {
        remember_taken(cached, e->kstack_id, e->ustack);
        return call;
    }
    struct site_stack taken = {.kstack_id = e->kstack_id, .ustack = e->ustack, .takes = 1};
    if (site_stacks.update(&key, &taken) < 0)
        count(MP_CNT_SITE_FULL);
    return call;
}
