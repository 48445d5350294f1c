/* Types and prototypes of the CUDA driver API subset that fake_cuda.c stands in for. The
 * typedefs, names, signatures and result codes match NVIDIA's cuda.h (CUDA 12); only the
 * handful of entry points below exist. Not the driver: see fake_cuda.c. */
#ifndef MEMPROF_EXAMPLES_FAKE_CUDA_H
#define MEMPROF_EXAMPLES_FAKE_CUDA_H
#include <stddef.h>

#if defined(_WIN64) || defined(__LP64__)
typedef unsigned long long CUdeviceptr_v2;
#else
typedef unsigned int CUdeviceptr_v2;
#endif
typedef CUdeviceptr_v2 CUdeviceptr;
typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;
typedef struct CUstream_st *CUstream;

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
} CUresult;

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

CUresult cuInit(unsigned int Flags);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);

/* Stand-in only (no such symbol in the driver): lets a program check that it loaded the
 * stand-in and not a real driver, and read the stand-in's own bookkeeping. */
struct memprof_fake_cuda_stats {
    unsigned long long device_allocs, device_frees, device_live, device_live_bytes;
    unsigned long long host_allocs, host_frees, host_live, host_live_bytes;
};
void memprof_fake_cuda_stats(struct memprof_fake_cuda_stats *out);
#endif
