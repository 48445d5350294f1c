/* Record layouts shared by memprof's BPF programs and memprof/sources/ebpf/records.py.
 *
 * Every record leaving the kernel is one fixed-size `struct mp_event` (64 bytes; 72 with the
 * ring buffer's 8-byte header), so user space decodes a batch as one strided numpy view.
 * Change a field here and in records.py together; test_records_layout checks they agree. */
#ifndef MEMPROF_H
#define MEMPROF_H

/* Event kinds. Allocation/free kinds come first; lifecycle kinds follow. */
#define MP_SLAB_ALLOC   1   /* kmalloc / kmem_cache_alloc (and their _node variants) */
#define MP_SLAB_FREE    2   /* kfree / kmem_cache_free */
#define MP_PAGE_ALLOC   3   /* mm_page_alloc: addr = struct page *, size = PAGE_SIZE << order */
#define MP_PAGE_FREE    4   /* mm_page_free / mm_page_free_batched */
#define MP_USER_ALLOC   5   /* a user-space allocator returned a block (layer says which) */
#define MP_USER_FREE    6   /* a user-space allocator was asked to free a block */
#define MP_PROC_FORK    8   /* a tracked process forked: pid = child tgid, tid = parent tgid */
#define MP_PROC_EXEC    9   /* a tracked process exec'd: call_site and size hold its new comm (16 bytes) */
#define MP_PROC_EXIT   10   /* a tracked thread group died (last thread exited) */
#define MP_EXIT_MARK   11   /* a tracked process began to exit: exit_group, fatal signal, Py_Finalize */
#define MP_MAP_EXEC    12   /* a tracked process maps a file executable (a library loaded late) */

/* Counter slots (per-CPU array `counters`). */
#define MP_CNT_RINGBUF_FULL   0  /* records dropped: the ring buffer refused a reservation */
#define MP_CNT_STACK_FAIL     1  /* a kernel or user stack capture failed (map full or hash collision) */
#define MP_CNT_SAMPLE_TICK    2  /* per-CPU allocation counter driving stack sampling */
#define MP_CNT_SITE_FULL      3  /* call-site stack cache had no room */
#define MP_CNT_NESTED_FREES   4  /* + MP_TP_*: frees a backup program saw, the main one skipped (recorded where the target's) */
#define MP_CNT_PY_NO_THREAD   8  /* a Python process's thread had no PyThreadState we could find */
#define MP_CNT_PY_BAD_CODE    9  /* a frame chain led to something that is not a code object: dropped */
#define MP_CNT_PY_MAP_FULL   10  /* py_stacks or py_codes had no room: the event has no Python frames */
#define MP_CNT_PY_RELEARNED  11  /* a code object's address now holds another one: user space drops its cache */
#define MP_CNT_SCRATCH_BUSY  12  /* an event nested in another program's use of a per-CPU scratch: it went
                                  * without Python frames or its own user stack */
#define MP_CNT_SITE_MIXED    13  /* a reuse key led to two kernel stacks: its events take their own */
#define MP_CNT_PY_TAIL_FAILED 14 /* a tail call of the Python walk or learning failed: an event went without Python
                                  * frames, a stack was cut short, or its later frames stay unnamed */
#define MP_CNT_IRQ_ALLOCS    15  /* kernel allocations made in an interrupt while a tracked task was current:
                                  * not the task's, not recorded (kmem.bpf.c, in_task_work) */
#define MP_CNT_PY_CODE_READS 16  /* code objects' heads read by the learning (python.bpf.c, py_learn_code) */
#define MP_CNT_PY_CALL_STACKS 17 /* events given the Python stack an earlier event of their system call walked */
#define MP_CNT_SCRATCH_SKIPPED 18 /* path-name buffers (names_cache) counted, not recorded (kmem.bpf.c, scratch_cache) */
#define MP_CNT_SAMPLED_FULL  19  /* sampled kernel allocations left out: sampled_live had no room (kmem.bpf.c) */
#define MP_N_COUNTERS        20

/* Free tracepoints, indexing the per-CPU `free_busy` flags. */
#define MP_TP_KFREE              0
#define MP_TP_KMEM_CACHE_FREE    1
#define MP_TP_PAGE_FREE          2
#define MP_TP_PAGE_FREE_BATCHED  3
#define MP_N_FREE_TPS            4

/* Layers (the `layer` byte), as memprof/sources/ebpf/records.py names them. */
#define MP_LAYER_KERNEL_SLAB  0
#define MP_LAYER_KERNEL_PAGE  1
#define MP_LAYER_TORCH_CPU    2
#define MP_LAYER_CUDA_DRIVER  3
#define MP_LAYER_NATIVE       4

/* Flags (the `flags` byte). */
#define MP_FLAG_STACK_SAMPLED 0x01  /* this event took its own stacks (others reuse their site's) */
#define MP_FLAG_HOST          0x02  /* CUDA: pinned host memory, not device memory */
#define MP_FLAG_ASYNC         0x04  /* CUDA: stream-ordered (cuMemAllocAsync) */
#define MP_FLAG_MANAGED       0x08  /* CUDA: unified memory */
#define MP_FLAG_PHYSICAL      0x10  /* CUDA: a physical allocation (cuMemCreate), mapped separately */
#define MP_FLAG_HELD          0x20  /* kernel frees: of an allocation the target held (see kmem.bpf.c) */

struct mp_event {
    __u64 ts_ns;        /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
    __u64 addr;         /* object address; struct page address for pages; CUDA handle for cuMemCreate */
    __u64 call_site;    /* kernel allocations' direct caller (_RET_IP_), 0 where unknown */
    __u64 size;         /* bytes handed out (pages: PAGE_SIZE << order); 0 on frees that do not know */
    __u32 pid;          /* tgid */
    __u32 tid;
    __s32 kstack_id;    /* id in `stacks` (the kernel stack), negative when none */
    __u32 requested;    /* bytes asked for (0 when unknown); exit marks: why (see records.py) */
    __u8  kind;         /* MP_* above */
    __u8  layer;        /* MP_LAYER_* */
    __u8  flags;        /* MP_FLAG_* */
    __s8  device;       /* CUDA device index, -1 when unknown or not a device */
    __u32 pad;
    __u64 ustack;       /* key in `ustacks` (a hash of the user stack's frames), 0 when none */
    __u64 py_stack;     /* key in `py_stacks` (bpf/python.bpf.c) of the thread's Python frames; 0: none */
};

#endif
