/* memprof's libc heap interposer: LD_PRELOADed into a command `memprof record` starts with
 * `--sources +native`. It replaces the uprobes on libc's malloc family, which cost three
 * traps per malloc/free pair (entry, return, free: ~12 us here, bench/RESULTS.md), with
 * one call into an empty marker function per *recorded* event, where memprof's uprobe waits.
 *
 * Contract:
 *   - Every call is forwarded to glibc's own allocator (__libc_malloc, …): the heap, its
 *     tuning (MALLOC_ARENA_MAX, mallopt) and malloc_usable_size are glibc's, unchanged.
 *   - An allocation of S bytes is recorded with probability min(1, S / N), N being
 *     MEMPROF_NATIVE_SAMPLE_BYTES (0 or unset: every allocation). memprof weighs a recorded
 *     one by max(1, N / S), so totals are unbiased (memprof/sources/ebpf/decode.py).
 *   - A recorded allocation calls memprof_native_alloc(address, size, call_site) after it
 *     succeeds; a free or munmap of an address that may have been recorded calls
 *     memprof_native_free(address) *before* the block is released (so that another
 *     thread's reuse of the address cannot come first). "May": a bitmap of recorded
 *     addresses, never cleared (two live blocks may share a bit); a false positive costs one
 *     trap, and memprof drops frees it never saw allocated.
 *   - Nothing here takes a lock, allocates, or makes a system call of its own (but the
 *     constructor, once at load: it registers reseed_after_fork with pthread_atfork).
 *
 * Built by scripts/setup.sh: cc -O2 -shared -fPIC -fno-semantic-interposition -fno-omit-frame-pointer
 * -fno-optimize-sibling-calls -fno-ipa-icf. Frame pointers: memprof's uprobe at the marker's
 * entry walks the stack through this library's frame to the allocation's caller; no
 * sibling calls: a tail call into the marker would leave no frame here to walk through;
 * no identical-code folding: the two markers must stay two addresses. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

#define EXPORT __attribute__((visibility("default")))
/* A marker is a one-byte nop and a return, nothing else (naked: no frame of its own). A uprobe
 * on a nop is one the kernel emulates without single-stepping (+586 ns a hit here).
 * Not the 5-byte nop it began as: Linux 6.18 optimizes a uprobe there, rewriting the nop
 * into a call to a "[uprobes-trampoline]" page that a fork does not give the child, while the
 * rewritten text is; a child of a process whose marker was optimized died (SIGSEGV) at its
 * first recorded allocation: every DataLoader worker, every shell command substitution.
 * The optimized hit was +447 ns (bench/uprobe_trap_cost.py; bench/RESULTS.md). */
#define MARKER __attribute__((naked, noinline, used, visibility("default")))
#define MARKER_BODY "nop\n\tret"

/* ---- the markers memprof's uprobes wait on (bpf/uprobes.bpf.c: mp_preload_alloc/free) ---- */

MARKER void memprof_native_alloc(void *address, size_t size, void *call_site)
{
    (void)address, (void)size, (void)call_site;
    __asm__ volatile(MARKER_BODY);
}

MARKER void memprof_native_free(void *address)
{
    (void)address;
    __asm__ volatile(MARKER_BODY);
}

/* ---- sampling ---- */

static uint64_t sample_bytes;   /* N; read once from the environment */
static int sample_bytes_read;

static uint64_t sampling_bytes(void)
{
    if (__builtin_expect(!sample_bytes_read, 0)) {
        /* getenv neither allocates nor locks; a race here reads the same value twice. */
        const char *text = getenv("MEMPROF_NATIVE_SAMPLE_BYTES");
        uint64_t n = 0;
        for (; text && *text >= '0' && *text <= '9'; text++)
            n = n * 10 + (uint64_t)(*text - '0');
        sample_bytes = n;
        __atomic_store_n(&sample_bytes_read, 1, __ATOMIC_RELEASE);
    }
    return sample_bytes;
}

static __thread uint64_t rng_state __attribute__((tls_model("initial-exec")));

/* xorshift64*: per thread, seeded from the thread's own address and the time stamp counter. */
static uint64_t next_random(void)
{
    uint64_t x = rng_state;
    if (__builtin_expect(x == 0, 0))
        x = ((uint64_t)(uintptr_t)&rng_state ^ __builtin_ia32_rdtsc()) | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* In a forked child: draw from a seed of its own. A child goes on from its parent's state, so
 * two workers forked from one process drew the same sequence and took the same allocations:
 * each one's estimate unbiased, but their errors added up instead of averaging out. */
static void reseed_after_fork(void)
{
    rng_state = 0;
}

__attribute__((constructor)) static void register_reseed(void)
{
    pthread_atfork(0, 0, reseed_after_fork);
}

/* Record an allocation of `size` bytes: with probability min(1, size / N). The same test as
 * the uprobes' native_sampled() in bpf/uprobes.bpf.c. */
static int sampled(uint64_t size)
{
    uint64_t n = sampling_bytes();
    if (n == 0 || size >= n)
        return 1;
    return (next_random() >> 32) * n < (size << 32);
}

/* ---- which addresses may have been recorded ---- */

#define SEEN_BITS_LOG2 24 /* 2 MiB of bits, touched only where recorded addresses fall */
static uint64_t seen[(1u << SEEN_BITS_LOG2) / 64];

static uint64_t seen_slot(const void *address)
{
    return ((uint64_t)(uintptr_t)address >> 4) * 0x9E3779B97F4A7C15ULL >> (64 - SEEN_BITS_LOG2);
}

static void remember(const void *address)
{
    uint64_t slot = seen_slot(address);
    uint64_t bit = 1ULL << (slot & 63);
    if (!(__atomic_load_n(&seen[slot >> 6], __ATOMIC_RELAXED) & bit))
        __atomic_fetch_or(&seen[slot >> 6], bit, __ATOMIC_RELAXED);
}

static int may_be_recorded(const void *address)
{
    uint64_t slot = seen_slot(address);
    return (__atomic_load_n(&seen[slot >> 6], __ATOMIC_RELAXED) >> (slot & 63)) & 1;
}

static inline __attribute__((always_inline)) void *allocated(void *address, uint64_t size, void *call_site)
{
    if (address && sampled(size)) {
        remember(address);
        memprof_native_alloc(address, size, call_site);
    }
    return address;
}

static inline __attribute__((always_inline)) void releasing(void *address)
{
    if (address && may_be_recorded(address))
        memprof_native_free(address);
}

/* ---- the malloc family ---- */

EXPORT void *malloc(size_t size)
{
    return allocated(__libc_malloc(size), size, __builtin_return_address(0));
}

EXPORT void free(void *ptr)
{
    releasing(ptr);
    __libc_free(ptr);
}

EXPORT void *calloc(size_t n, size_t size)
{
    void *p = __libc_calloc(n, size);
    return allocated(p, p ? (uint64_t)n * size : 0, __builtin_return_address(0));
}

EXPORT void *realloc(void *ptr, size_t size)
{
    void *site = __builtin_return_address(0);
    if (!ptr)
        return allocated(__libc_malloc(size), size, site);
    int recorded = may_be_recorded(ptr);
    if (recorded)
        memprof_native_free(ptr); /* before the old block can be reused */
    void *p = __libc_realloc(ptr, size);
    if (!p && size != 0 && recorded)
        memprof_native_alloc(ptr, size, site); /* it failed: the old block lives on (size: a bound) */
    return allocated(p, size, site);
}

EXPORT void *reallocarray(void *ptr, size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return 0;
    }
    void *site = __builtin_return_address(0);
    int recorded = ptr && may_be_recorded(ptr);
    if (recorded)
        memprof_native_free(ptr);
    void *p = ptr ? __libc_realloc(ptr, bytes) : __libc_malloc(bytes);
    if (!p && bytes != 0 && recorded)
        memprof_native_alloc(ptr, bytes, site);
    return allocated(p, bytes, site);
}

EXPORT void *memalign(size_t alignment, size_t size)
{
    return allocated(__libc_memalign(alignment, size), size, __builtin_return_address(0));
}

EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    return allocated(__libc_memalign(alignment, size), size, __builtin_return_address(0));
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0 || alignment == 0)
        return EINVAL;
    int saved = errno;
    void *p = __libc_memalign(alignment, size);
    if (!p) {
        errno = saved;
        return ENOMEM;
    }
    *out = allocated(p, size, __builtin_return_address(0));
    return 0;
}

EXPORT void *valloc(size_t size)
{
    return allocated(__libc_valloc(size), size, __builtin_return_address(0));
}

EXPORT void *pvalloc(size_t size)
{
    return allocated(__libc_pvalloc(size), size, __builtin_return_address(0));
}

/* ---- mmap and munmap: the application's own calls (glibc's malloc maps its large blocks
 * internally, which its malloc record already covers). Straight to the system call: the
 * glibc wrapper's own work is the offset check the kernel repeats. ---- */

EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    void *p = (void *)syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
    if (p == MAP_FAILED)
        return p;
    return allocated(p, length, __builtin_return_address(0));
}

EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
    __attribute__((alias("mmap")));

EXPORT int munmap(void *addr, size_t length)
{
    releasing(addr);
    return (int)syscall(SYS_munmap, addr, length);
}
