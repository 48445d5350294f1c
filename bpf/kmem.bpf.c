/* memprof kernel source: the kmalloc family and the page allocator, filtered to the
 * target's process tree, one fixed-size record per event through a BPF ring buffer.
 *
 * Configured by -D constants from memprof/sources/kmem.py (never by string replacement):
 *   RINGBUF_PAGES         ring buffer size in pages (power of two)
 *   STACK_ENTRIES         buckets in the stack map
 *   STACK_SAMPLE_MASK     slab allocations capture stacks when (tick & MASK) == 0;
 *                         the others reuse their call site's latest stacks (see README.md)
 *   PAGE_STACK_SAMPLE_MASK the same for page allocations (which have no call site)
 *   TRACKED_WORDS         u64 words of the tgid bitmap (pid_max / 64 + 1)
 *   ADDR_BITS_LOG2        log2 of the bits in the allocated-address filter
 *   KMEM_CACHE_SIZE_OFF / KMEM_CACHE_OBJSIZE_OFF   offsets in struct kmem_cache (from BTF)
 *   PAGE_SKIP_GFP         page allocations with any of these gfp bits are not recorded
 *                         (movable = user and page-cache pages, which RSS accounts for)
 *   PAGE_SHIFT_BYTES      log2 of the page size
 *   HAVE_EXIT_GROUP_DEAD  sched_process_exit has the group_dead field (6.x+)
 */
#include <uapi/linux/ptrace.h>
#include "memprof.h"

/* Where an allocation comes from, cheaply: the kernel call site, plus the user stack
 * pointer at syscall entry — enough to keep two user paths into one kernel call site apart
 * without unwinding. */
struct site_key {
    u64 call_site;
    u64 user_sp;
    u32 tgid;
    u32 layer;
};

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_STACK_TRACE(stacks, STACK_ENTRIES);
BPF_ARRAY(tracked, u64, TRACKED_WORDS);
BPF_ARRAY(addr_filter, u64, (1 << ADDR_BITS_LOG2) / 64);
BPF_PERCPU_ARRAY(counters, u64, MP_N_COUNTERS);
BPF_HASH(site_stacks, struct site_key, u64, 16384);

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

/* The address filter remembers every address the target was handed (multiplicative hash
 * into a bitmap, never cleared: collisions only let extra frees through, which user space
 * drops as unmatched). Frees happen in any context — RCU callbacks, kworkers — so they cannot
 * be filtered by process; this keeps unrelated frees out of the ring buffer. */
static __always_inline u64 *addr_word(u64 addr, u64 *bit)
{
    u64 h = (addr * 0x9E3779B97F4A7C15ULL) >> (64 - ADDR_BITS_LOG2);
    u32 idx = h >> 6;
    *bit = 1ULL << (h & 63);
    return addr_filter.lookup(&idx);
}

static __always_inline void remember_addr(u64 addr)
{
    u64 bit;
    u64 *w = addr_word(addr, &bit);
    if (w && !(*w & bit))
        __sync_fetch_and_or(w, bit);
}

static __always_inline int maybe_ours(u64 addr)
{
    u64 bit;
    u64 *w = addr_word(addr, &bit);
    return w && (*w & bit);
}

static __always_inline struct mp_event *reserve(u8 kind)
{
    struct mp_event *e = events.ringbuf_reserve(sizeof(struct mp_event));
    if (!e) {
        count(MP_CNT_RINGBUF_FULL);
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->kind = kind;
    e->sampled = 0;
    e->call_site = 0;
    e->size = 0;
    e->requested = 0;
    e->kstack_id = -1;
    e->ustack_id = -1;
    return e;
}

/* Wake-ups are left to user space, which polls on a timer: a wake-up per record would
 * cost an irq_work per event. */
static __always_inline void submit(struct mp_event *e)
{
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* Stacks are expensive (an unwind per event); take them for one allocation in
 * (MASK + 1), and for the first allocation of each call site; the others inherit the latest
 * stacks taken at their call site in the same process. */
/* The task's user stack pointer at kernel entry: one kernel read, no unwinding, no user
 * memory access. A loop reaching one syscall through one call path does so at one stack
 * depth, two paths (a helper and its caller) at two — with or without frame pointers. */
static __always_inline u64 task_user_sp(void)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 sp = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp);
    return sp;
}

static __always_inline void fill_stacks(void *ctx, struct mp_event *e, u32 layer, u64 mask)
{
    struct site_key key = {.call_site = e->call_site, .user_sp = task_user_sp(), .tgid = e->pid, .layer = layer};
    u32 slot = MP_CNT_SAMPLE_TICK;
    u64 *tick = counters.lookup(&slot);
    int sample = 1;
    if (tick) {
        sample = (*tick & mask) == 0;
        (*tick)++;
    }
    if (!sample) {
        u64 *cached = site_stacks.lookup(&key);
        if (cached) {
            e->kstack_id = (s32)(*cached >> 32);
            e->ustack_id = (s32)(u32)*cached;
            return;
        }
    }
    e->kstack_id = stacks.get_stackid(ctx, 0);
    e->ustack_id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    e->sampled = 1;
    if (e->kstack_id < 0)
        count(MP_CNT_STACK_FAIL);
    u64 packed = ((u64)(u32)e->kstack_id << 32) | (u32)e->ustack_id;
    if (site_stacks.update(&key, &packed) < 0)
        count(MP_CNT_SITE_FULL);
}

static __always_inline int on_slab_alloc(void *ctx, u64 call_site, u64 ptr, u64 size, u64 req)
{
    if (!ptr || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    struct mp_event *e = reserve(MP_SLAB_ALLOC);
    if (!e)
        return 0;
    e->addr = ptr;
    e->call_site = call_site;
    e->size = size;
    e->requested = req;
    fill_stacks(ctx, e, 0, STACK_SAMPLE_MASK);
    remember_addr(ptr);
    submit(e);
    return 0;
}

/* Returns 1 when a record was written. */
static __always_inline int emit_free(u64 addr, u8 kind, u32 size)
{
    if (!addr || !maybe_ours(addr))
        return 0;
    struct mp_event *e = reserve(kind);
    if (!e)
        return 0;
    e->addr = addr;
    e->size = size;
    submit(e);
    return 1;
}

/* Frees nested in our own free program are skipped by the kernel (a program never runs
 * twice at once on a CPU: bcc issue #2997) — and that is how RCU callbacks free inodes,
 * dentries and sockets: in a softirq on the way out of an interrupt that hit the target's
 * own kfree. Each free tracepoint therefore has two programs, attached main first (probes
 * of one tracepoint run in attach order), and the backup runs right after the main one for
 * every event. Per CPU, the main one counts the events it handled and notes the last one's
 * address; the backup remembers the count it last saw. When the count moved and names this
 * address, the main one handled the event; otherwise the kernel skipped the main one —
 * a nested free — and the backup records it. (Comparing addresses alone is not enough:
 * slab reuse is LIFO, so a nested free is often of the very address the main one recorded
 * last.) */
struct free_seq {
    u64 main_done;   /* events the main program finished, this CPU */
    u64 main_addr;   /* the address of the last one */
    u64 backup_seen; /* main_done when the backup last stood aside */
};
BPF_PERCPU_ARRAY(free_seqs, struct free_seq, MP_N_FREE_TPS);

static __always_inline int on_free(u32 tp, u64 addr, u8 kind, u32 size)
{
    emit_free(addr, kind, size);
    struct free_seq *seq = free_seqs.lookup(&tp);
    if (seq) {
        seq->main_addr = addr;
        seq->main_done++;
    }
    return 0;
}

static __always_inline int on_nested_free(u32 tp, u64 addr, u8 kind, u32 size)
{
    struct free_seq *seq = free_seqs.lookup(&tp);
    if (!seq)
        return 0;
    if (seq->main_done != seq->backup_seen && seq->main_addr == addr) {
        seq->backup_seen = seq->main_done; /* the main program handled this very event */
        return 0;
    }
    if (emit_free(addr, kind, size))
        count(MP_CNT_NESTED_FREES + tp);
    return 0;
}

/* kmalloc(call_site, ptr, bytes_req, bytes_alloc, gfp_flags, node) */
int mp_kmalloc(struct bpf_raw_tracepoint_args *ctx)
{
    return on_slab_alloc(ctx, ctx->args[0], ctx->args[1], ctx->args[3], ctx->args[2]);
}

/* kmem_cache_alloc(call_site, ptr, struct kmem_cache *s, gfp_flags, node) since 6.0;
 * the sizes live in the cache, at offsets read from BTF. */
int mp_kmem_cache_alloc(struct bpf_raw_tracepoint_args *ctx)
{
    u64 ptr = ctx->args[1];
    if (!ptr || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    const char *cache = (const char *)ctx->args[2];
    u32 size = 0, object_size = 0;
#if KMEM_CACHE_OBJSIZE_OFF == KMEM_CACHE_SIZE_OFF + 4
    /* Adjacent (every SLUB layout so far): one read instead of two. */
    u64 both = 0;
    bpf_probe_read_kernel(&both, sizeof(both), cache + KMEM_CACHE_SIZE_OFF);
    size = (u32)both;
    object_size = (u32)(both >> 32);
#else
    bpf_probe_read_kernel(&size, sizeof(size), cache + KMEM_CACHE_SIZE_OFF);
    bpf_probe_read_kernel(&object_size, sizeof(object_size), cache + KMEM_CACHE_OBJSIZE_OFF);
#endif
    return on_slab_alloc(ctx, ctx->args[0], ptr, size, object_size);
}

/* kmem_cache_alloc before 6.0 carried the sizes: (call_site, ptr, bytes_req, bytes_alloc, gfp) */
int mp_kmem_cache_alloc_sized(struct bpf_raw_tracepoint_args *ctx)
{
    return on_slab_alloc(ctx, ctx->args[0], ctx->args[1], ctx->args[3], ctx->args[2]);
}

/* kfree(call_site, ptr) and kmem_cache_free(call_site, ptr, …): one program each, so the
 * kernel's per-program miss counters say which tracepoint lost events. */
int mp_kfree(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_KFREE, ctx->args[1], MP_SLAB_FREE, 0);
}

int mp_kfree_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_KFREE, ctx->args[1], MP_SLAB_FREE, 0);
}

int mp_kmem_cache_free(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_KMEM_CACHE_FREE, ctx->args[1], MP_SLAB_FREE, 0);
}

int mp_kmem_cache_free_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_KMEM_CACHE_FREE, ctx->args[1], MP_SLAB_FREE, 0);
}

#define PAGE_BYTES(order) (1U << (PAGE_SHIFT_BYTES + ((order) & 31)))

/* mm_page_alloc(struct page *page, unsigned int order, gfp_t gfp, int migratetype) */
int mp_page_alloc(struct bpf_raw_tracepoint_args *ctx)
{
    u64 page = ctx->args[0];
    u32 order = (u32)ctx->args[1];
    u32 gfp = (u32)ctx->args[2];
    if (!page || (gfp & PAGE_SKIP_GFP) || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    struct mp_event *e = reserve(MP_PAGE_ALLOC);
    if (!e)
        return 0;
    e->addr = page;
    e->size = PAGE_BYTES(order);
    e->requested = e->size;
    e->call_site = 0;
    fill_stacks(ctx, e, 1, PAGE_STACK_SAMPLE_MASK);
    remember_addr(page);
    submit(e);
    return 0;
}

/* mm_page_free(struct page *page, unsigned int order) */
int mp_mm_page_free(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_PAGE_FREE, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES((u32)ctx->args[1]));
}

int mp_mm_page_free_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_PAGE_FREE, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES((u32)ctx->args[1]));
}

/* mm_page_free_batched(struct page *page): order-0 pages freed from a list */
int mp_mm_page_free_batched(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_PAGE_FREE_BATCHED, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES(0));
}

int mp_mm_page_free_batched_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_PAGE_FREE_BATCHED, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES(0));
}

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
    if (is_tracked(tgid))
        lifecycle(MP_PROC_EXEC, tgid, args->old_pid);
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
        lifecycle(MP_PROC_EXIT, tgid, pid);
        set_tracked(tgid, 0);
    }
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
