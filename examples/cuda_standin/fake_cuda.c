/* fake_cuda: a STAND-IN FOR THE CUDA DRIVER, FOR TESTS ONLY. It is not the NVIDIA driver and
 * talks to no GPU. Built as libcuda.so.1 (soname libcuda.so.1), it exports a few driver API
 * entry points under their real names, with cuda.h's signatures and CUresult codes, so that
 * memprof's uprobes on libcuda can be exercised on machines without a GPU.
 *
 * "Device" memory (cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync)
 * is address space only: a bump allocator hands out addresses from 0x7f0000000000 upwards,
 * each allocation starting on a 2 MiB boundary, never reused and never dereferenced.
 * Pinned "host" memory (cuMemAllocHost_v2, cuMemHostAlloc) is plain malloc, freed by
 * cuMemFreeHost. Every live allocation is kept in a fixed table (no malloc of its own), so
 * frees are checked (an unknown pointer is CUDA_ERROR_INVALID_VALUE) and no call can be
 * optimized away. Every entry point is out of line and exported, and none calls another, so
 * one call from the program is one hit on its function. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include "fake_cuda.h"

#define CUAPI __attribute__((noinline, visibility("default")))

#define DEVICE_BASE 0x7f0000000000ULL
#define DEVICE_END 0x800000000000ULL /* 1 TiB of fake address space, never reused */
#define DEVICE_ALIGN (2ULL << 20)
#define DEVICE_CAPACITY (80ULL << 30) /* live bytes allowed, like an 80 GB card */
#define PITCH_ALIGN 512
#define TABLE_SIZE (1u << 16)         /* live allocations tracked at once, at most */

enum kind { EMPTY = 0, DEVICE, MANAGED, ASYNC, HOST };

struct slot {
    uint64_t addr;
    uint64_t size;
    int kind;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static uint64_t next_device = DEVICE_BASE;
static struct slot table[TABLE_SIZE];
static struct memprof_fake_cuda_stats stats;

static unsigned hash(uint64_t addr)
{
    addr ^= addr >> 33;
    addr *= 0xff51afd7ed558ccdULL;
    addr ^= addr >> 33;
    return (unsigned)addr & (TABLE_SIZE - 1);
}

/* Linear probing; called with the lock held. Returns 0, or -1 when the table is full. */
static int table_put(uint64_t addr, uint64_t size, int kind)
{
    if (stats.device_live + stats.host_live >= TABLE_SIZE - 1)
        return -1;
    unsigned i = hash(addr);
    while (table[i].kind != EMPTY)
        i = (i + 1) & (TABLE_SIZE - 1);
    table[i] = (struct slot){addr, size, kind};
    return 0;
}

/* Removes addr if it is live with one of the kinds in mask (1 << kind); backward-shift
 * deletion keeps probe chains intact. Returns the removed slot's kind, or EMPTY. */
static int table_take(uint64_t addr, unsigned mask, uint64_t *size)
{
    unsigned i = hash(addr);
    while (table[i].kind != EMPTY && table[i].addr != addr)
        i = (i + 1) & (TABLE_SIZE - 1);
    if (table[i].kind == EMPTY || !(mask & (1u << table[i].kind)))
        return EMPTY;
    int kind = table[i].kind;
    *size = table[i].size;
    unsigned hole = i;
    for (unsigned j = (i + 1) & (TABLE_SIZE - 1); table[j].kind != EMPTY;
         j = (j + 1) & (TABLE_SIZE - 1)) {
        unsigned home = hash(table[j].addr);
        /* move j into the hole unless its home lies cyclically in (hole, j] */
        if ((j > hole && (home <= hole || home > j)) || (j < hole && home <= hole && home > j)) {
            table[hole] = table[j];
            hole = j;
        }
    }
    table[hole].kind = EMPTY;
    return kind;
}

static CUresult device_alloc(CUdeviceptr *dptr, size_t bytesize, int kind)
{
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    uint64_t span = (bytesize + DEVICE_ALIGN - 1) & ~(DEVICE_ALIGN - 1);
    if (!initialized)
        rc = CUDA_ERROR_NOT_INITIALIZED;
    else if (span < bytesize || stats.device_live_bytes + bytesize > DEVICE_CAPACITY ||
             span > DEVICE_END - next_device || table_put(next_device, bytesize, kind) < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        *dptr = (CUdeviceptr)next_device;
        next_device += span;
        stats.device_allocs++;
        stats.device_live++;
        stats.device_live_bytes += bytesize;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static CUresult device_free(CUdeviceptr dptr)
{
    if (dptr == 0)
        return CUDA_SUCCESS; /* freeing 0 is a no-op, as with cudaFree(NULL) */
    CUresult rc = CUDA_SUCCESS;
    uint64_t size = 0;
    pthread_mutex_lock(&lock);
    if (!initialized)
        rc = CUDA_ERROR_NOT_INITIALIZED;
    else if (table_take(dptr, 1u << DEVICE | 1u << MANAGED | 1u << ASYNC, &size) == EMPTY)
        rc = CUDA_ERROR_INVALID_VALUE;
    else {
        stats.device_frees++;
        stats.device_live--;
        stats.device_live_bytes -= size;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static CUresult host_alloc(void **pp, size_t bytesize)
{
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int ready = initialized;
    pthread_mutex_unlock(&lock);
    if (!ready)
        return CUDA_ERROR_NOT_INITIALIZED;
    void *p = malloc(bytesize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (table_put((uintptr_t)p, bytesize, HOST) < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        stats.host_allocs++;
        stats.host_live++;
        stats.host_live_bytes += bytesize;
    }
    pthread_mutex_unlock(&lock);
    if (rc != CUDA_SUCCESS) {
        free(p);
        return rc;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUAPI CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    initialized = 1;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* The stand-in has one device, 0, whose primary context is current once cuInit is done. */
CUAPI CUresult cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int ready = initialized;
    pthread_mutex_unlock(&lock);
    if (!ready)
        return CUDA_ERROR_NOT_INITIALIZED;
    *device = 0;
    return CUDA_SUCCESS;
}

CUAPI CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return device_alloc(dptr, bytesize, DEVICE);
}

CUAPI CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return device_free(dptr);
}

/* Pitch is the row width rounded up to 512 bytes; the allocation is pitch * Height bytes. */
CUAPI CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                  size_t Height, unsigned int ElementSizeBytes)
{
    if (!pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + PITCH_ALIGN - 1) & ~(size_t)(PITCH_ALIGN - 1);
    if (pitch < WidthInBytes || Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = device_alloc(dptr, pitch * Height, DEVICE);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

CUAPI CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(pp, bytesize);
}

CUAPI CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

CUAPI CUresult cuMemFreeHost(void *p)
{
    if (!p)
        return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    uint64_t size = 0;
    pthread_mutex_lock(&lock);
    if (!initialized)
        rc = CUDA_ERROR_NOT_INITIALIZED;
    else if (table_take((uintptr_t)p, 1u << HOST, &size) == EMPTY)
        rc = CUDA_ERROR_INVALID_VALUE;
    else {
        stats.host_frees++;
        stats.host_live--;
        stats.host_live_bytes -= size;
    }
    pthread_mutex_unlock(&lock);
    if (rc == CUDA_SUCCESS)
        free(p);
    return rc;
}

CUAPI CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(dptr, bytesize, MANAGED);
}

/* Stream-ordered in the driver; here the allocation and the free take effect at once. */
CUAPI CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return device_alloc(dptr, bytesize, ASYNC);
}

CUAPI CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return device_free(dptr);
}

CUAPI void memprof_fake_cuda_stats(struct memprof_fake_cuda_stats *out)
{
    pthread_mutex_lock(&lock);
    *out = stats;
    pthread_mutex_unlock(&lock);
}
