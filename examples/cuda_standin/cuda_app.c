/* cuda_app: the known CUDA leak, run against the driver stand-in (fake_cuda.c). Like the CUDA
 * runtime under PyTorch, it loads the driver lazily with dlopen("libcuda.so.1") and looks its
 * entry points up with dlsym; run it with LD_LIBRARY_PATH=examples/bin/cuda_standin. It
 * refuses to run on a real driver (the stand-in exports a marker symbol the driver lacks).
 *
 * After cuInit it prints "pid=N" and sleeps START_MS, so a profiler sees libcuda mapped
 * before the first allocation. Then, interleaved:
 *   device: 23 buffers of 1 MiB kept (cuMemAlloc_v2 from keep_device_buffer) among
 *           100 of 1 MiB freed again (cuMemAlloc_v2 + cuMemFree_v2 in churn_device_buffer);
 *   host:   5 pinned buffers of 256 KiB kept (cuMemAllocHost_v2 from keep_host_buffer) among
 *           7 freed again (cuMemAllocHost_v2 + cuMemFreeHost in churn_host_buffer).
 * It prints "kept_device=23 kept_host=5" (and the stand-in's own bookkeeping), sleeps HOLD_MS
 * and exits without freeing what it kept: 23 MiB of device memory and 1.25 MiB of host.
 *
 * usage: cuda_app [START_MS [HOLD_MS]]   (defaults 300 and 800) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "fake_cuda.h"

#define KEEP_DEVICE 23
#define CHURN_DEVICE 100
#define DEVICE_BYTES (1u << 20)
#define KEEP_HOST 5
#define CHURN_HOST 7
#define HOST_BYTES (256u << 10)

static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuCtxGetDevice)(CUdevice *);
static CUresult (*p_cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree_v2)(CUdeviceptr);
static CUresult (*p_cuMemAllocHost_v2)(void **, size_t);
static CUresult (*p_cuMemFreeHost)(void *);
static void (*p_stats)(struct memprof_fake_cuda_stats *);

/* Not static: with internal linkage and never read, the compiler drops the stores to them. */
CUdeviceptr kept_device[KEEP_DEVICE];
void *kept_host[KEEP_HOST];
static char stdout_buf[4096]; /* so stdio takes no malloc'd buffer of its own */

static void die(const char *what, int rc)
{
    fprintf(stderr, "cuda_app: %s failed (CUresult %d)\n", what, rc);
    exit(1);
}

/* Out of line, so each kind of call has its own user frame in every chain. */
__attribute__((noipa)) CUdeviceptr keep_device_buffer(size_t bytes)
{
    CUdeviceptr d = 0;
    CUresult rc = p_cuMemAlloc_v2(&d, bytes);
    if (rc != CUDA_SUCCESS)
        die("cuMemAlloc_v2", rc);
    return d;
}

__attribute__((noipa)) void churn_device_buffer(size_t bytes)
{
    CUdeviceptr d = 0;
    CUresult rc = p_cuMemAlloc_v2(&d, bytes);
    if (rc != CUDA_SUCCESS)
        die("cuMemAlloc_v2", rc);
    if ((rc = p_cuMemFree_v2(d)) != CUDA_SUCCESS)
        die("cuMemFree_v2", rc);
}

__attribute__((noipa)) void *keep_host_buffer(size_t bytes)
{
    void *p = NULL;
    CUresult rc = p_cuMemAllocHost_v2(&p, bytes);
    if (rc != CUDA_SUCCESS)
        die("cuMemAllocHost_v2", rc);
    *(volatile char *)p = 1;
    return p;
}

__attribute__((noipa)) void churn_host_buffer(size_t bytes)
{
    void *p = NULL;
    CUresult rc = p_cuMemAllocHost_v2(&p, bytes);
    if (rc != CUDA_SUCCESS)
        die("cuMemAllocHost_v2", rc);
    *(volatile char *)p = 1;
    if ((rc = p_cuMemFreeHost(p)) != CUDA_SUCCESS)
        die("cuMemFreeHost", rc);
}

static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "cuda_app: %s not found in libcuda.so.1\n", name);
        exit(2);
    }
    return f;
}

int main(int argc, char **argv)
{
    int start_ms = argc > 1 ? atoi(argv[1]) : 300;
    int hold_ms = argc > 2 ? atoi(argv[2]) : 800;
    setvbuf(stdout, stdout_buf, _IOLBF, sizeof stdout_buf);

    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cuda_app: %s (set LD_LIBRARY_PATH=examples/bin/cuda_standin)\n",
                dlerror());
        return 2;
    }
    if (!dlsym(lib, "memprof_fake_cuda_stats")) {
        fprintf(stderr, "cuda_app: the libcuda.so.1 found is not the stand-in; "
                        "set LD_LIBRARY_PATH=examples/bin/cuda_standin\n");
        return 2;
    }
    *(void **)&p_cuInit = sym(lib, "cuInit");
    *(void **)&p_cuCtxGetDevice = sym(lib, "cuCtxGetDevice");
    *(void **)&p_cuMemAlloc_v2 = sym(lib, "cuMemAlloc_v2");
    *(void **)&p_cuMemFree_v2 = sym(lib, "cuMemFree_v2");
    *(void **)&p_cuMemAllocHost_v2 = sym(lib, "cuMemAllocHost_v2");
    *(void **)&p_cuMemFreeHost = sym(lib, "cuMemFreeHost");
    *(void **)&p_stats = sym(lib, "memprof_fake_cuda_stats");

    CUresult rc;
    CUdevice dev = -1;
    if ((rc = p_cuInit(0)) != CUDA_SUCCESS)
        die("cuInit", rc);
    if ((rc = p_cuCtxGetDevice(&dev)) != CUDA_SUCCESS)
        die("cuCtxGetDevice", rc);

    printf("pid=%d\n", (int)getpid());
    usleep(start_ms * 1000);

    /* Keep where i * K / N steps up: exactly K of N, spread evenly. */
    int kd = 0, kh = 0;
    for (int i = 0; i < KEEP_DEVICE + CHURN_DEVICE; i++) {
        if ((i + 1) * KEEP_DEVICE / (KEEP_DEVICE + CHURN_DEVICE) !=
            i * KEEP_DEVICE / (KEEP_DEVICE + CHURN_DEVICE))
            kept_device[kd++] = keep_device_buffer(DEVICE_BYTES);
        else
            churn_device_buffer(DEVICE_BYTES);
    }
    for (int i = 0; i < KEEP_HOST + CHURN_HOST; i++) {
        if ((i + 1) * KEEP_HOST / (KEEP_HOST + CHURN_HOST) != i * KEEP_HOST / (KEEP_HOST + CHURN_HOST))
            kept_host[kh++] = keep_host_buffer(HOST_BYTES);
        else
            churn_host_buffer(HOST_BYTES);
    }

    struct memprof_fake_cuda_stats s;
    p_stats(&s);
    printf("kept_device=%d kept_host=%d\n", kd, kh);
    printf("standin device_allocs=%llu device_frees=%llu device_live_bytes=%llu "
           "host_allocs=%llu host_frees=%llu host_live_bytes=%llu\n",
           s.device_allocs, s.device_frees, s.device_live_bytes, s.host_allocs, s.host_frees,
           s.host_live_bytes);
    usleep(hold_ms * 1000);
    return 0; /* the kept buffers are never freed */
}
