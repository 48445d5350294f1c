/* memprof kernel probes: the kmalloc family and the page allocator, through raw
 * tracepoints. A part of the program text, with the kmem family.
 *
 * Constants:
 *   STACK_SAMPLE_MASK     slab allocations take stacks when (tick & MASK) == 0; the others
 *                         reuse their site's latest stacks (see README.md)
 *   PAGE_STACK_SAMPLE_MASK the same for page allocations (which have no call site)
 *   KMEM_CACHE_SIZE_OFF / KMEM_CACHE_OBJSIZE_OFF   offsets in struct kmem_cache (from BTF)
 *   PAGE_SKIP_GFP         page allocations with any of these gfp bits are not recorded
 *                         (movable = user and page-cache pages, which RSS accounts for)
 *   PAGE_SHIFT_BYTES      log2 of the page size
 *   TASK_STACK_OFF        offset of `stack` (the kernel stack's lowest address) in task_struct
 *   KMEM_CACHE_ALLOC_TAKES_CACHE  kmem_cache_alloc passes the cache, not the sizes (6.0+)
 *   KERNEL_SAMPLE_BYTES   0 = every allocation; N = each taken with probability min(1, S / N)
 *                         (record --kernel-sample-bytes; kernel_sampled below)
 */
#include "parts.h" /* what the parts give each other */

/* [start, end) of the kernel's interrupt entry stubs (asm_common_interrupt and the
 * asm_sysvec_* after it), from kallsyms at start (kmem.py, interrupt_entry_text); {0, 0}
 * where they were not found. */
BPF_ARRAY(irq_entry_text, u64, 2);

/* 1 when the program runs in the current task's own work (a system call, a page fault), 0
 * in an interrupt: hard interrupts, the softirqs run on their way out or by
 * local_bh_enable(), the BPF allocator's irq_work refilling memprof's own maps, NMIs. Such
 * an allocation is not the interrupted task's though bpf_get_current_pid_tgid() names it: a
 * TCP ACK for whichever socket the packet was for, a network card's receive buffers.
 * Charged to the task, they were false leaks of whatever job had the CPU while the network
 * was busy. They are counted, not recorded. (Frees in an interrupt are recorded: RCU
 * callbacks free the task's files and sockets there.) Two ways in, on x86-64:
 * - an interrupt of kernel code runs on the CPU's interrupt stack (NMIs and machine checks
 *   on stacks of their own): the program's context, which lives on the stack it runs on,
 *   is then outside the task's stack, from task_struct.stack up to its pt_regs;
 * - an interrupt of user code runs on the task's stack, right below its pt_regs, whose
 *   orig_ax is then -1 (a system call's is its number) and the word below them the
 *   return address into the entry stub that called the handler.
 * The stack's bounds and orig_ax are BTF loads; only a non-syscall entry (an interrupt or
 * a page fault) reads the return address. */
static __always_inline int in_task_work(void *ctx, struct task_struct *task, struct pt_regs *regs)
{
    void *bottom = *(void **)((char *)task + TASK_STACK_OFF);
    if (!(bottom <= ctx && ctx < (void *)regs))
        goto interrupt; /* compared, never computed with: no address_in() */
    if ((long)regs->orig_ax >= 0)
        return 1;
    u32 first = 0, last = 1;
    u64 *start = irq_entry_text.lookup(&first), *end = irq_entry_text.lookup(&last);
    u64 returns_to = 0;
    if (!start || !end || bpf_probe_read_kernel(&returns_to, sizeof(returns_to), (char *)regs - sizeof(u64)) < 0)
        return 1;
    if (returns_to < *start || returns_to >= *end)
        return 1;
interrupt:
    count(MP_CNT_IRQ_ALLOCS);
    return 0;
}

/* record --kernel-sample-bytes N: an allocation of S bytes is taken with probability
 * min(1, S / N), and user space weighs it by max(1, N / S) (decode.py), so that byte and
 * count totals stay unbiased, as heap profilers such as tcmalloc's sample. Decided before
 * any of the allocation's work (its stacks, Python frames, record): the work is what costs
 * (bench/RESULTS.md, "Kernel churn against its floors"). The frees need their own filter:
 * the address filter, never cleared, passes the free of every address an allocation taken
 * once had, and the kernel hands a freed object's address to its next taker at once, so a
 * loop's frees were nearly all recorded though its allocations were not. sampled_live holds
 * the addresses of the taken allocations not yet freed; a free is recorded only when it
 * removes its address from there. */
#if KERNEL_SAMPLE_BYTES > 0
BPF_HASH(sampled_live, u64, u8, KERNEL_SAMPLED_LIVE);

static __always_inline int kernel_sampled(u64 size)
{
    if (size < KERNEL_SAMPLE_BYTES)
        return ((u64)bpf_get_prandom_u32() * KERNEL_SAMPLE_BYTES) < (size << 32);
    return 1;
}

/* 1 when `addr`, a taken allocation's, is remembered until its free; 0 when sampled_live is
 * full: the allocation is then left out and counted (its free could not be recognised). */
static __always_inline int keep_sampled(u64 addr)
{
    u8 taken = 1;
    if (sampled_live.update(&addr, &taken) == 0)
        return 1;
    count(MP_CNT_SAMPLED_FULL);
    return 0;
}

/* 1 when `addr` was a taken allocation's, now freed. Looked up before it is removed: a
 * removal takes the bucket's lock even when the address is not there, as most are not. */
static __always_inline int sampled_free(u64 addr)
{
    return sampled_live.lookup(&addr) && sampled_live.delete(&addr) == 0;
}
#else
static __always_inline int kernel_sampled(u64 size) { return 1; }
static __always_inline int keep_sampled(u64 addr) { return 1; }
static __always_inline int sampled_free(u64 addr) { return 1; }
#endif

/* Whether a slab allocation at `ptr` of `size` bytes is the target's and taken by the sampling. */
static __always_inline int slab_taken(u64 ptr, u64 size)
{
    return ptr && is_tracked(bpf_get_current_pid_tgid() >> 32) && kernel_sampled(size);
}

/* A slab allocation slab_taken() took. */
static __always_inline int on_slab_alloc(void *ctx, u64 call_site, u64 ptr, u64 size, u64 req)
{
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task); /* once: a helper call */
    if (!in_task_work(ctx, task, regs) || !keep_sampled(ptr))
        return 0;
    struct mp_event ev, *e = &ev; /* on the stack: emit_alloc may hand it to the Python walk */
    init_event(e, MP_SLAB_ALLOC);
    e->layer = MP_LAYER_KERNEL_SLAB;
    e->addr = ptr;
    e->call_site = call_site;
    e->size = size;
    e->requested = req;
    struct syscall_anchor *call = fill_stacks(ctx, e, STACK_SAMPLE_MASK, call_site, task, regs);
    remember_addr(ptr);
    hold_addr(ptr);
    emit_alloc(ctx, e, 1, call);
    return 0;
}

/* Returns 1 when a record was written. */
static __always_inline int emit_free(u64 addr, u8 kind, u32 size)
{
    if (!addr || !maybe_ours(addr) || !sampled_free(addr))
        return 0;
    int held = release_addr(addr); /* even when the record is lost: the address is not held now */
    struct mp_event *e = reserve(kind);
    if (!e)
        return 0;
    e->addr = addr;
    e->size = size;
    e->layer = kind == MP_SLAB_FREE ? MP_LAYER_KERNEL_SLAB : MP_LAYER_KERNEL_PAGE;
    if (held)
        e->flags |= MP_FLAG_HELD;
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
 * last.) Every nested free the backup sees is counted (MP_CNT_NESTED_FREES), so that only
 * the ones no program saw are reported as skipped (loading.Tracepoints.missed). */
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
    /* Counted whether or not it is recorded: the kernel counted the main program's skip,
     * and a nested free of memory the target never had (another task's RCU callbacks, run
     * in a softirq that interrupted the target's free) was still seen, and rightly not
     * recorded. Counting only the recorded ones left those in "skipped by the kernel". */
    count(MP_CNT_NESTED_FREES + tp);
    emit_free(addr, kind, size);
    return 0;
}

/* kmalloc(call_site, ptr, bytes_req, bytes_alloc, gfp_flags, node) */
MP_KERNEL_PROGRAM int mp_kmalloc(struct bpf_raw_tracepoint_args *ctx)
{
    if (!slab_taken(ctx->args[1], ctx->args[3]))
        return 0;
    return on_slab_alloc(ctx, ctx->args[0], ctx->args[1], ctx->args[3], ctx->args[2]);
}

/* One of the two kmem_cache_alloc programs is compiled, the one this kernel's prototype
 * takes (kmem.py, KMEM_CACHE_ALLOC_TAKES_CACHE): each inlines the whole event path, ~40 ms
 * of every compile. */
#ifdef KMEM_CACHE_ALLOC_TAKES_CACHE
#ifdef SKIP_PATH_NAME_BUFFERS
/* The slab caches whose objects never outlive their system call: names_cache, the buffer of
 * a path name that getname() takes and putname() gives back within each stat, open or exec
 * (40 % of a PyTorch job's slab allocations: the import system stats every path it tries).
 * Their allocations are counted (MP_CNT_SCRATCH_SKIPPED), not recorded: none can be a leak
 * or outlive the call, and each cost a Python walk. Their frees are not recorded either,
 * their addresses never being remembered (maybe_ours). Per cache pointer, learned from
 * the cache's name at its first allocation by a tracked task; only where names_cache is a
 * cache of its own (kmem.py, names_cache_is_its_own: SLUB did not merge it with others). */
BPF_HASH(scratch_caches, u64, u8, 4096);

static __always_inline int scratch_cache(const char *cache)
{
    u64 key = (u64)cache;
    u8 *known = scratch_caches.lookup(&key);
    if (known)
        return *known;
    const char *name = 0;
    union { char text[16]; u64 words[2]; } head = {};
    bpf_probe_read_kernel(&name, sizeof(name), cache + KMEM_CACHE_NAME_OFF);
    if (name)
        bpf_probe_read_kernel_str(head.text, sizeof(head.text), name);
    /* "names_ca" "che\0", as two little-endian words */
    u8 scratch = head.words[0] == 0x61635f73656d616eULL && (head.words[1] & 0xffffffffULL) == 0x656863ULL;
    scratch_caches.update(&key, &scratch);
    return scratch;
}
#else
/* names_cache shares its slab cache with others here (kmem.py, names_cache_is_its_own):
 * its buffers are recorded like any allocation. */
static __always_inline int scratch_cache(const char *cache) { return 0; }
#endif

/* 1 when the allocation is a path-name buffer, counted instead of recorded. */
static __always_inline int skip_scratch(const char *cache)
{
    if (!scratch_cache(cache))
        return 0;
    count(MP_CNT_SCRATCH_SKIPPED);
    return 1;
}

/* kmem_cache_alloc(call_site, ptr, struct kmem_cache *s, gfp_flags, node) since 6.0;
 * the sizes live in the cache, at offsets read from BTF. */
MP_KERNEL_PROGRAM int mp_kmem_cache_alloc(struct bpf_raw_tracepoint_args *ctx)
{
    u64 ptr = ctx->args[1];
    if (!ptr || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    const char *cache = (const char *)ctx->args[2];
#if KERNEL_SAMPLE_BYTES == 0
    if (skip_scratch(cache)) /* before the sizes' read */
        return 0;
#endif
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
#if KERNEL_SAMPLE_BYTES > 0
    /* Sampled, the draw comes first and the names_cache look-up only for the allocations it
     * takes (MP_CNT_SCRATCH_SKIPPED then counts taken ones). */
    if (!kernel_sampled(size) || skip_scratch(cache))
        return 0;
#endif
    return on_slab_alloc(ctx, ctx->args[0], ptr, size, object_size);
}
#else
/* kmem_cache_alloc before 6.0 carried the sizes: (call_site, ptr, bytes_req, bytes_alloc, gfp) */
MP_KERNEL_PROGRAM int mp_kmem_cache_alloc_sized(struct bpf_raw_tracepoint_args *ctx)
{
    if (!slab_taken(ctx->args[1], ctx->args[3]))
        return 0;
    return on_slab_alloc(ctx, ctx->args[0], ctx->args[1], ctx->args[3], ctx->args[2]);
}
#endif

/* kfree(call_site, ptr) and kmem_cache_free(call_site, ptr, …): one program each, so the
 * kernel's per-program miss counters say which tracepoint lost events. */
MP_KERNEL_PROGRAM int mp_kfree(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_KFREE, ctx->args[1], MP_SLAB_FREE, 0);
}

MP_KERNEL_PROGRAM int mp_kfree_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_KFREE, ctx->args[1], MP_SLAB_FREE, 0);
}

MP_KERNEL_PROGRAM int mp_kmem_cache_free(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_KMEM_CACHE_FREE, ctx->args[1], MP_SLAB_FREE, 0);
}

MP_KERNEL_PROGRAM int mp_kmem_cache_free_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_KMEM_CACHE_FREE, ctx->args[1], MP_SLAB_FREE, 0);
}

#define PAGE_BYTES(order) (1U << (PAGE_SHIFT_BYTES + ((order) & 31)))
/* Page allocations have no call site. Within one syscall path (one user stack pointer) the
 * kinds of page a kernel path takes differ in order and gfp flags: a pipe's data page is
 * order 0 and GFP_HIGHUSER|__GFP_ACCOUNT, a new slab for the dentry cache order 2 and
 * __GFP_RECLAIMABLE|__GFP_COMP. Keyed by those, each kind keeps its own cached stacks: with
 * the syscall alone, a slab page inherited the pipe page's stack and was reported as a
 * held pipe page. Never a kernel address, so never a slab call site. */
#define PAGE_SITE(order, gfp) ((((u64)(order) & 31) << 32) | (u32)(gfp))

/* mm_page_alloc(struct page *page, unsigned int order, gfp_t gfp, int migratetype) */
MP_KERNEL_PROGRAM int mp_page_alloc(struct bpf_raw_tracepoint_args *ctx)
{
    u64 page = ctx->args[0];
    u32 order = (u32)ctx->args[1];
    u32 gfp = (u32)ctx->args[2];
    if (!page || (gfp & PAGE_SKIP_GFP) || !is_tracked(bpf_get_current_pid_tgid() >> 32) ||
        !kernel_sampled(PAGE_BYTES(order)))
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    if (!in_task_work(ctx, task, regs) || !keep_sampled(page))
        return 0;
    struct mp_event ev, *e = &ev;
    init_event(e, MP_PAGE_ALLOC);
    e->layer = MP_LAYER_KERNEL_PAGE;
    e->addr = page;
    e->size = PAGE_BYTES(order);
    e->requested = e->size;
    e->call_site = 0;
    struct syscall_anchor *call = fill_stacks(ctx, e, PAGE_STACK_SAMPLE_MASK, PAGE_SITE(order, gfp), task, regs);
    remember_addr(page);
    hold_addr(page);
    emit_alloc(ctx, e, 1, call);
    return 0;
}

/* mm_page_free(struct page *page, unsigned int order) */
MP_KERNEL_PROGRAM int mp_mm_page_free(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_PAGE_FREE, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES((u32)ctx->args[1]));
}

MP_KERNEL_PROGRAM int mp_mm_page_free_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_PAGE_FREE, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES((u32)ctx->args[1]));
}

/* mm_page_free_batched(struct page *page): order-0 pages freed from a list */
MP_KERNEL_PROGRAM int mp_mm_page_free_batched(struct bpf_raw_tracepoint_args *ctx)
{
    return on_free(MP_TP_PAGE_FREE_BATCHED, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES(0));
}

MP_KERNEL_PROGRAM int mp_mm_page_free_batched_nested(struct bpf_raw_tracepoint_args *ctx)
{
    return on_nested_free(MP_TP_PAGE_FREE_BATCHED, ctx->args[0], MP_PAGE_FREE, PAGE_BYTES(0));
}


#ifdef UNSEEN_SWITCH_NEXT_ARG
/* ---- switches no program saw: where frees go missing (bpf/README.md "Missed frees", 4) ----
 * On some machines no BPF program runs while a certain task is current (the Firecracker VM
 * memprof is developed on: its PID 1), and the kernel frees what RCU callbacks free in a
 * softirq on that task's time unseen. Such a task is found without knowing why: per CPU,
 * the task switched in is noted, and the next switch, which runs with the outgoing task
 * current, must come from it. When it comes from another, the noted task's own switch out
 * ran no program: it is counted in `unseen_tasks` (by its pid_tgid). One per-CPU lookup and
 * one 8-byte read (task_struct's pid and tgid, adjacent: the layout of
 * bpf_get_current_pid_tgid()) per context switch. */
struct switched_in {
    u64 pid_tgid;  /* the task switched in last on this CPU (idle: 0) */
    u64 known;     /* 0 until this CPU's first switch is seen */
};
BPF_PERCPU_ARRAY(last_switched_in, struct switched_in, 1);
BPF_HASH(unseen_tasks, u64, u64, 1024);

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, …), run
 * with prev current. */
MP_KERNEL_PROGRAM RAW_TRACEPOINT_PROBE(sched_switch)
{
    u32 slot = 0;
    struct switched_in *last = last_switched_in.lookup(&slot);
    if (!last)
        return 0;
    u64 outgoing = bpf_get_current_pid_tgid(); /* prev: the tracepoint runs before the switch */
    if (last->known && last->pid_tgid != outgoing) {
        u64 one = 1, *times = unseen_tasks.lookup(&last->pid_tgid);
        if (times)
            __sync_fetch_and_add(times, 1);
        else
            unseen_tasks.update(&last->pid_tgid, &one);
    }
    u64 next = 0;
    last->known = bpf_probe_read_kernel(&next, sizeof(next),
                                        (char *)ctx->args[UNSEEN_SWITCH_NEXT_ARG] + TASK_PID_OFF) == 0;
    last->pid_tgid = next;
    return 0;
}
#endif
