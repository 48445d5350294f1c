/* memprof user-space allocator probes: uprobes (entry) and uretprobes (return) on the
 * PyTorch CPU allocator, the CUDA driver and the libc heap. A part of the program text;
 * uses the maps and helpers of common.bpf.c.
 *
 * Constants:
 *   USER_STACK_SAMPLE_MASK  allocations take their own user stack when (tick & MASK) == 0; the
 *                        others reuse their site's (fill_user_stack in common.bpf.c)
 *   NATIVE_SAMPLE_BYTES  0 = every libc allocation; N = each taken with probability
 *                        min(1, size/N) (user space weights a sampled one by max(1, N/size))
 *
 * An allocation is seen twice: at entry (its size, where the result will be written) and
 * at return (the address). The entry parks what it knows per thread *and layer*: layers nest
 * (c10::alloc_cpu calls posix_memalign, cuMemAllocHost calls malloc), and each must find its
 * own parked call at its return. A nested call of the same layer (glibc's malloc calling
 * mmap) is not recorded: the outer one is. */
#include "parts.h" /* what the parts give each other */

struct parked {
    u64 size;
    u64 out_ptr;      /* where the callee writes the address (CUDA, posix_memalign); 0: return value */
    u64 pitch_ptr;    /* cuMemAllocPitch: size = *pitch_ptr * size */
    u64 old_ptr;      /* realloc: the block being replaced */
    u64 sp;           /* the stack pointer at entry: tells a nested call from a stale slot */
    u8 flags;
    s8 device;
    u8 status_rc;     /* 1: the return value is a status (0 = success), the address is at out_ptr */
    u8 free_only;     /* realloc not sampled: record the old block's free, not the new block */
    u8 busy;          /* a call of this layer is in progress on this thread */
    u8 pad[3];
};

/* One slot per layer, in the thread's own storage (no hash lookups; freed with the thread). */
struct parked_calls {
    struct parked layer[8];
};
BPF_TASK_STORAGE(parked_calls, struct parked_calls);

static __always_inline struct parked *parked_slot(u8 layer, u64 flags)
{
    struct parked_calls *calls = parked_calls.task_storage_get(bpf_get_current_task_btf(), 0, flags);
    return calls ? &calls->layer[layer & 7] : 0;
}

static __always_inline struct parked *park(struct pt_regs *ctx, u8 layer, u64 size, u64 out_ptr, u8 status_rc,
                                           u8 flags, s8 device)
{
    if (!is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    struct parked *p = parked_slot(layer, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!p)
        return 0;
    u64 sp = PT_REGS_SP(ctx);
    /* Busy with a deeper stack pointer: we are nested inside that call. Busy with a shallower
     * one: that call never returned normally (an exception unwound through it) — reuse. */
    if (p->busy && sp < p->sp)
        return 0;
    p->size = size;
    p->out_ptr = out_ptr;
    p->pitch_ptr = 0;
    p->old_ptr = 0;
    p->sp = sp;
    p->flags = flags;
    p->device = device;
    p->status_rc = status_rc;
    p->free_only = 0;
    p->busy = 1;
    return p;
}

/* libc: take a native allocation with probability min(1, size / NATIVE_SAMPLE_BYTES). */
static __always_inline int native_sampled(u64 size)
{
#if NATIVE_SAMPLE_BYTES > 0
    if (size < NATIVE_SAMPLE_BYTES)
        return ((u64)bpf_get_prandom_u32() * NATIVE_SAMPLE_BYTES) < (size << 32);
#endif
    return 1;
}

/* Whether a layer's frees go through the address filter. The libc heap's do: with sampling,
 * most frees in the process are of blocks that were never recorded, and the filter keeps them
 * out of the ring buffer. PyTorch's and the driver's do not: every one of their blocks
 * allocated while recording is recorded, so the filter would pass nearly every free anyway —
 * at the price of two random reads in an 8 MiB bitmap per block (a cache and TLB miss each
 * when the addresses vary; see bpf/README.md). What it would have kept out, frees of
 * blocks allocated before `record --pid` attached, user space counts as unmatched frees. */
static __always_inline int filters_frees(u8 layer)
{
    return layer == MP_LAYER_NATIVE;
}

/* `call_site`: the allocator's return address in its caller (the site's key); `skip`: frames
 * of the allocator itself on top of the stack. */
static __always_inline void emit_user_alloc(struct pt_regs *ctx, u8 layer, u8 flags, s8 device, u64 addr, u64 size,
                                            u64 call_site, u64 skip)
{
    struct mp_event ev, *e = &ev; /* on the stack: emit_alloc may hand it to the Python walk */
    init_event(e, MP_USER_ALLOC);
    e->addr = addr;
    e->size = size;
    e->layer = layer;
    e->flags = flags;
    e->device = device;
    fill_user_stack(ctx, e, USER_STACK_SAMPLE_MASK, call_site, skip);
    if (filters_frees(layer))
        remember_addr(addr ^ layer);
    emit_alloc(ctx, e, 0, 0); /* a user-space probe: in no system call */
}

static __always_inline void emit_user_free(u8 layer, u64 addr, u8 flags)
{
    if (!addr || (filters_frees(layer) && !maybe_ours(addr ^ layer)))
        return;
    struct mp_event *e = reserve(MP_USER_FREE);
    if (!e)
        return;
    e->addr = addr;
    e->layer = layer;
    e->flags = flags;
    submit(e);
}

static __always_inline int on_free_call(u8 layer, u64 addr, u8 flags)
{
    if (is_tracked(bpf_get_current_pid_tgid() >> 32))
        emit_user_free(layer, addr, flags);
    return 0;
}

static __always_inline int unpark(struct pt_regs *ctx, u8 layer)
{
    struct parked *pp = parked_slot(layer, 0);
    if (!pp || !pp->busy)
        return 0;
    struct parked p = *pp;
    pp->busy = 0;
    u64 rc = PT_REGS_RC(ctx);
    u64 addr = rc, size = p.size;
    if (p.status_rc) {
        if (rc != 0)
            return 0; /* failed: nothing allocated */
        addr = 0;
        read_user(&addr, sizeof(addr), (void *)p.out_ptr);
    }
    if (p.pitch_ptr) {
        u64 pitch = 0;
        read_user(&pitch, sizeof(pitch), (void *)p.pitch_ptr);
        size = pitch * p.size;
    }
    if (!addr || addr == (u64)-1) /* NULL, or MAP_FAILED: nothing changed */
        return 0;
    if (p.old_ptr)
        emit_user_free(layer, p.old_ptr, 0); /* realloc: the old block is gone (or is the new one) */
    if (!p.free_only)
        emit_user_alloc(ctx, layer, p.flags, p.device, addr, size, PT_REGS_IP(ctx), 0);
    return 0;
}

MP_USER_PROGRAM int mp_torch_return(struct pt_regs *ctx) { return unpark(ctx, MP_LAYER_TORCH_CPU); }

/* ---- PyTorch CPU allocator (libc10.so): c10::alloc_cpu(size_t), c10::free_cpu(void *) ---- */
MP_USER_PROGRAM int mp_c10_alloc_cpu(struct pt_regs *ctx) { park(ctx, MP_LAYER_TORCH_CPU, PT_REGS_PARM1(ctx), 0, 0, 0, -1); return 0; }

/* The one-trap alternative to the pair above, where memprof/sources/ebpf/callsite.py found it: a
 * uprobe on alloc_cpu's `call c10::NUMAMove(void *data, size_t nbytes, int node)`, which every
 * successful allocation makes. The arguments are in their registers; alloc_cpu has a frame
 * pointer (checked), so its own return address — the site, as at a uretprobe — is at %rbp + 8;
 * its frame is left off the stack, which then reads as one taken at its return. */
MP_USER_PROGRAM int mp_c10_alloc_at_call(struct pt_regs *ctx)
{
    u64 addr = PT_REGS_PARM1(ctx);
    if (!addr || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 caller = read_user_u64(ctx->bp + 8);
    emit_user_alloc(ctx, MP_LAYER_TORCH_CPU, 0, -1, addr, PT_REGS_PARM2(ctx), caller, 1);
    return 0;
}
MP_USER_PROGRAM int mp_c10_free_cpu(struct pt_regs *ctx) { return on_free_call(MP_LAYER_TORCH_CPU, PT_REGS_PARM1(ctx), 0); }

/* ---- CUDA driver (libcuda.so.1): results are CUresult, addresses written through arg 1 ----
 * Compiled whenever the cuda family is on (the default), found or not: a driver outside the
 * places searched before the start is probed when a process maps it (library_probes.py). */
#ifdef MP_CUDA_FAMILY
MP_USER_PROGRAM int mp_cuda_return(struct pt_regs *ctx) { return unpark(ctx, MP_LAYER_CUDA_DRIVER); }
#define CUDA_PARK(size, flags, device) \
    park(ctx, MP_LAYER_CUDA_DRIVER, (size), PT_REGS_PARM1(ctx), 1, (flags), (device))

MP_USER_PROGRAM int mp_cu_mem_alloc(struct pt_regs *ctx)          /* cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) */
{ CUDA_PARK(PT_REGS_PARM2(ctx), 0, -1); return 0; }
MP_USER_PROGRAM int mp_cu_mem_alloc_async(struct pt_regs *ctx)    /* cuMemAllocAsync(dptr*, bytesize, stream) */
{ CUDA_PARK(PT_REGS_PARM2(ctx), MP_FLAG_ASYNC, -1); return 0; }
MP_USER_PROGRAM int mp_cu_mem_alloc_managed(struct pt_regs *ctx)  /* cuMemAllocManaged(dptr*, bytesize, flags) */
{ CUDA_PARK(PT_REGS_PARM2(ctx), MP_FLAG_MANAGED, -1); return 0; }
MP_USER_PROGRAM int mp_cu_mem_alloc_host(struct pt_regs *ctx)     /* cuMemAllocHost_v2(void **pp, bytesize) */
{ CUDA_PARK(PT_REGS_PARM2(ctx), MP_FLAG_HOST, -1); return 0; }
MP_USER_PROGRAM int mp_cu_mem_host_alloc(struct pt_regs *ctx)     /* cuMemHostAlloc(void **pp, bytesize, flags) */
{ CUDA_PARK(PT_REGS_PARM2(ctx), MP_FLAG_HOST, -1); return 0; }
MP_USER_PROGRAM int mp_cu_mem_alloc_pitch(struct pt_regs *ctx)    /* cuMemAllocPitch_v2(dptr*, size_t *pPitch, width, height, elem) */
{
    struct parked *p = CUDA_PARK(PT_REGS_PARM4(ctx), 0, -1);
    if (p)
        p->pitch_ptr = PT_REGS_PARM2(ctx);
    return 0;
}
MP_USER_PROGRAM int mp_cu_mem_create(struct pt_regs *ctx)         /* cuMemCreate(handle*, size, const CUmemAllocationProp *prop, flags) */
{
    /* prop->location.id: CUmemAllocationProp { type, requestedHandleTypes, location {type, id}, … } */
    s32 device = -1;
    read_user(&device, sizeof(device), (void *)(PT_REGS_PARM3(ctx) + 12));
    CUDA_PARK(PT_REGS_PARM2(ctx), MP_FLAG_PHYSICAL, (s8)device);
    return 0;
}
/* cuMemFree_v2(dptr), cuMemFreeAsync(dptr, stream), cuMemRelease(handle); cuMemFreeHost(p) */
MP_USER_PROGRAM int mp_cu_mem_free(struct pt_regs *ctx) { return on_free_call(MP_LAYER_CUDA_DRIVER, PT_REGS_PARM1(ctx), 0); }
MP_USER_PROGRAM int mp_cu_mem_free_host(struct pt_regs *ctx) { return on_free_call(MP_LAYER_CUDA_DRIVER, PT_REGS_PARM1(ctx), MP_FLAG_HOST); }
#endif /* MP_CUDA_FAMILY */

/* ---- libc heap ----
 * Compiled only for a recording that asks for it (`--sources +native`; loading.py passes
 * -DMP_NATIVE_FAMILY): these are 11 of the object's programs, each inlining the whole event
 * path, and inlining and code generation are most of bcc's compile (bench/RESULTS.md,
 * "`record` start-up latency"). */
#ifdef MP_NATIVE_FAMILY
MP_USER_PROGRAM int mp_native_return(struct pt_regs *ctx) { return unpark(ctx, MP_LAYER_NATIVE); }
static __always_inline int native_park(struct pt_regs *ctx, u64 size, u64 out_ptr, u8 status_rc)
{
    if (native_sampled(size))
        park(ctx, MP_LAYER_NATIVE, size, out_ptr, status_rc, 0, -1);
    return 0;
}
MP_USER_PROGRAM int mp_malloc(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM1(ctx), 0, 0); }
MP_USER_PROGRAM int mp_calloc(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx), 0, 0); }
MP_USER_PROGRAM int mp_valloc(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM1(ctx), 0, 0); }
MP_USER_PROGRAM int mp_memalign(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM2(ctx), 0, 0); }   /* memalign/aligned_alloc(align, size) */
MP_USER_PROGRAM int mp_posix_memalign(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx), 1); }
MP_USER_PROGRAM int mp_mmap(struct pt_regs *ctx) { return native_park(ctx, PT_REGS_PARM2(ctx), 0, 0); }       /* mmap(addr, len, …) */
MP_USER_PROGRAM int mp_realloc(struct pt_regs *ctx)                                                      /* realloc(ptr, size) */
{
    /* Parked even when not sampled, so that the old block's free is seen. */
    u64 size = PT_REGS_PARM2(ctx);
    struct parked *p = park(ctx, MP_LAYER_NATIVE, size, 0, 0, 0, -1);
    if (p) {
        p->old_ptr = PT_REGS_PARM1(ctx);
        p->free_only = !native_sampled(size);
    }
    return 0;
}
MP_USER_PROGRAM int mp_free(struct pt_regs *ctx) { return on_free_call(MP_LAYER_NATIVE, PT_REGS_PARM1(ctx), 0); }

/* ---- libc heap through memprof's LD_PRELOAD interposer (memprof/preload/memprof_preload.c) ----
 * It has already sampled (MEMPROF_NATIVE_SAMPLE_BYTES) and filtered frees; each call here is
 * one event. memprof_native_alloc(address, size, call_site), from inside the interposer's
 * malloc: the stack is taken leaving out the marker's own frame (at its entry, the frame
 * pointer is still the interposer's, whose return address is the allocation's caller). */
MP_USER_PROGRAM int mp_preload_alloc(struct pt_regs *ctx)
{
    u64 addr = PT_REGS_PARM1(ctx);
    if (!addr || !is_tracked(bpf_get_current_pid_tgid() >> 32))
        return 0;
    emit_user_alloc(ctx, MP_LAYER_NATIVE, 0, -1, addr, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 1);
    return 0;
}
MP_USER_PROGRAM int mp_preload_free(struct pt_regs *ctx) { return on_free_call(MP_LAYER_NATIVE, PT_REGS_PARM1(ctx), 0); }
#endif /* MP_NATIVE_FAMILY */
