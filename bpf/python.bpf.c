/* Python frames of the allocating thread, read from the target's CPython at the event.
 * A part of the program text (after common.bpf.c; kmem.bpf.c and uprobes.bpf.c hand their
 * finished allocation events to emit_alloc()).
 *
 * User space (memprof/sources/cpython/frames.py) finds each tracked process's interpreter, confirms
 * its struct layout (memprof/sources/cpython/interp.py) and writes a `struct py_conf` into
 * `py_procs`. A process without one gets no Python frames — never frames read with offsets
 * that were not confirmed.
 *
 * Per event, in programs of their own entered by tail call from the allocation program
 * (emit_alloc; one program verified once, where a walk inlined into each allocation program
 * made the kernel's check of each 52-129 ms here, most of them on the start's path): the
 * thread's own PyThreadState (found by pthread_self(), which on x86-64 glibc
 * is the thread pointer, task->thread.fsbase, and which CPython stores as
 * tstate->thread_id; cached per thread), then its frame chain, innermost first, no strings.
 * Since 3.11 a thread's frames are pushed one above the other on its data stack, so the
 * frames are read a page at a time (py_frame_at): a user read costs ~70 ns here whatever
 * its size up to a page, and a call chain's frames mostly share one or two pages. A frame
 * is (code object, instruction index); the chain is interned by a 64-bit hash into
 * `py_stacks`, and the event carries the hash. Each code object of a new chain is checked,
 * once per chain however often it recurs there (in a program of its own, entered by tail
 * call after the event is submitted, which learns a few frames a run and tail-calls itself):
 * one read of its head tells whether it is the object learned at that address before; if
 * not, its type is checked against PyCode_Type (anything else is not named, and counted),
 * and its name, file, first line and line table are copied into `py_codes`, so that user
 * space can name frames and compute lines even after the process has exited.
 *
 * Constants: PY_MAX_FRAMES (power of two), PY_STACK_ENTRIES, PY_CODE_ENTRIES,
 * TASK_FSBASE_OFF (offset of thread.fsbase in task_struct, from BTF).
 */
#include "parts.h" /* what the parts give each other */

#define PY_MAX_THREADS   256        /* thread-state list entries walked to find a thread, */
#define PY_THREADS_PER_RUN 64       /* ... this many a run of the walk (see PY_WALK_RUNS) */
#define PY_THREAD_RUNS   (PY_MAX_THREADS / PY_THREADS_PER_RUN)
#define PY_NAME_BYTES    128
#define PY_FILE_BYTES    256        /* the tail of long paths is kept: it names the file */
#define PY_LINES_BYTES   2048       /* line table bytes copied; longer tables are cut */
#define PY_ENTRY_BIT     0x80000000u /* lasti word: first frame of a C-level eval call */
#define PY_LASTI_NONE    0x7fffffffu /* lasti word: instruction unknown */
#define PY_OWNED_BY_CSTACK 3        /* 3.12+: a shim frame the eval loop pushes at entry */
#define PY_PAGE_BYTES    4096       /* frames are read from the start of their page at most */
#define PY_FRAME_MAX     256        /* frame_read is below this */
#define PY_CODE_HEAD_MAX 256        /* code_read is below this */
/* A learning run learns PY_LEARN_PER_RUN frames (8 of 64), then tail-calls itself for the
 * next ones: the verifier then checks that many copies of py_learn_code, not PY_MAX_FRAMES
 * (which took it 107-129 ms a program here, on the start's path: bench/verifier_load.py). At most PY_LEARN_RUNS runs.
 * Fewer, longer runs cost the verifier more once; more, shorter ones cost every new stack a
 * run's set-up more. */
#define PY_LEARN_RUNS    8
#define PY_LEARN_PER_RUN ((PY_MAX_FRAMES + PY_LEARN_RUNS - 1) / PY_LEARN_RUNS)
/* Slots of the learning's set of code objects already checked in the stack it learns (see
 * py_learn_codes): a power of two. */
#define PY_LEARN_SEEN    32
/* The walk the same way: PY_WALK_PER_RUN frames a run (16 of 64), at most PY_WALK_RUNS runs,
 * after at most PY_THREAD_RUNS runs of the search for the thread's state (a thread's first
 * event; the search alone was 16,000 of the 20,000 instructions the verifier processed in a
 * walk program here). With the allocation program's call into the walk and the learning's
 * runs, a chain makes at most 1 + (PY_THREAD_RUNS + PY_WALK_RUNS - 1) + 1 + (PY_LEARN_RUNS
 * - 1) = 16 tail calls of the kernel's 33. */
#define PY_WALK_RUNS     4
#define PY_WALK_PER_RUN  ((PY_MAX_FRAMES + PY_WALK_RUNS - 1) / PY_WALK_RUNS)

/* Offsets of one interpreter (see memprof/sources/cpython/offsets_table.py); -1: no such field. */
struct py_conf {
    u64 interp_head;     /* address of _PyRuntime.interpreters.head in the process */
    u64 code_type;       /* address of PyCode_Type in the process */
    s32 interp_tstate_head, tstate_next, tstate_thread_id, tstate_frame, cframe_current_frame;
    s32 frame_previous, frame_code, frame_instr, frame_owner, frame_is_entry;
    s32 code_filename, code_name, code_qualname, code_firstlineno, code_linetable, code_adaptive;
    s32 unicode_length, unicode_state, unicode_ascii_data, unicode_compact_data;
    s32 bytes_size, bytes_data;
    s32 minor;           /* 10..13 */
    s32 frame_read;      /* bytes of a frame to read: covers every frame field used */
    s32 code_read;       /* bytes of a code object to read: its type and every code_ field but
                          * code_adaptive (which is an address, never read) */
};

struct py_stack {
    u32 tgid;
    u32 depth;                    /* frames, innermost first */
    u64 code[PY_MAX_FRAMES];      /* code object addresses */
    u32 lasti[PY_MAX_FRAMES];     /* instruction index (code units) | PY_ENTRY_BIT */
};

struct py_code_key {
    u64 code;
    u32 tgid;
    u32 pad;
};

struct py_code {
    u64 name_ptr, file_ptr, lines_ptr; /* identify the code object behind an address: a freed
                                        * code object's address is reused by another */
    s32 firstlineno;
    u32 minor;                   /* the interpreter's minor version: the line table's format */
    u32 lines_len;               /* the table's full length; > PY_LINES_BYTES: cut */
    u32 name_len, file_len;      /* characters */
    u8 name_state, file_state;   /* PyASCIIObject.state's low byte: kind, compact, ascii */
    u16 pad;
    u32 file_skip;               /* bytes of the file name left out at its start */
    u8 name[PY_NAME_BYTES];
    u8 file[PY_FILE_BYTES];
    u8 lines[PY_LINES_BYTES];
};

struct py_scratch {
    struct py_stack stack;
    /* User memory [window_start, window_start + window_len) as last read: the frame being
     * walked and whatever lies below it on its page (its callers, on a data stack). */
    u8 window[2 * PY_PAGE_BYTES];
    u64 window_start;
    u32 window_len;
    struct py_code code;
    u8 code_head[PY_CODE_HEAD_MAX]; /* a code object's first code_read bytes */
    u32 learn;       /* the stack in `stack` is new: its code objects are to be learned */
    u32 learn_from;  /* ... from this frame on (the earlier ones were, by an earlier run) */
    u64 learning;    /* which learning this is: py_intern() counts one per new stack */
    /* Code objects the learning of `learning` already checked, each in slot hash(code): a
     * slot whose `learning` is another holds nothing (no clearing per stack). */
    struct { u64 code; u64 learning; } learn_seen[PY_LEARN_SEEN];
    /* The walk, across its runs: the allocation event it completes and outputs, the next
     * frame to read (0: the chain's end), the hash so far, and the runs made (0: none). */
    struct mp_event event;
    struct py_conf conf; /* the event's process's, copied once: its runs and the learning's
                          * read it here rather than look it up again */
    u64 walk_frame;
    u64 walk_hash;
    u32 walk_runs;
    u32 walking;     /* `event` waits for its Python stack */
    u64 thread_cursor; /* the next thread state to compare while searching (0: not searching) */
    u32 search_runs;
    u32 pad2;
    struct call_mark call; /* the system call `event` is in, if any: its stack is the call's */
    /* A walk or a learning is using this CPU's scratch. Programs can nest on a CPU, and a
     * nested walk would overwrite the depth and frames of the one it interrupted (which
     * would store a stack of duplicated frames under its hash). The nested event goes
     * without Python frames instead, and is counted. (An interrupt's allocation, the usual
     * way in, stops at kmem.bpf.c's in_task_work before any walk; the guard stays.) */
    u32 busy;
};

BPF_HASH(py_procs, u32, struct py_conf, 4096);
/* Per thread: its PyThreadState, found under this thread pointer (the thread's own storage:
 * freed with the thread, cleared at exec). */
struct py_thread {
    u64 tstate;
    u64 fsbase;
};
BPF_TASK_STORAGE(py_threads, struct py_thread);
/* Both least-recently-used: user space decodes a stack or code object the first time it
 * meets it and keeps it, so what these maps evict is what it has already read (unless more
 * than their size is new within one flush). Preallocated, so that an insert never allocates
 * kernel memory inside the target's own allocation events. */
BPF_TABLE("lru_hash", u64, struct py_stack, py_stacks, PY_STACK_ENTRIES);
BPF_TABLE("lru_hash", struct py_code_key, struct py_code, py_codes, PY_CODE_ENTRIES);
BPF_PERCPU_ARRAY(py_scratch, struct py_scratch, 1);
/* The walk's and the code learning's programs, entered by tail call (one array per calling
 * program type: the kernel ties a program array to one type). */
BPF_PROG_ARRAY(py_walk_tp, 1);
BPF_PROG_ARRAY(py_walk_up, 1);
BPF_PROG_ARRAY(py_learn_tp, 1);
BPF_PROG_ARRAY(py_learn_up, 1);

/* Tail calls into the walk's and the learning's programs of the caller's type (`raw_tp`: a
 * raw tracepoint's, else a uprobe's). They return only when the call failed. */
static __always_inline void py_enter_walk(void *ctx, const int raw_tp)
{
    if (raw_tp)
        py_walk_tp.call(ctx, 0);
    else
        py_walk_up.call(ctx, 0);
}

static __always_inline void py_enter_learning(void *ctx, const int raw_tp)
{
    if (raw_tp)
        py_learn_tp.call(ctx, 0);
    else
        py_learn_up.call(ctx, 0);
}

static __always_inline u64 read_user_u64(u64 addr)
{
    u64 v = 0;
    read_user(&v, sizeof(v), (void *)addr);
    return v;
}

static __always_inline u64 thread_pointer(void)
{
    u64 fsbase = 0;
    void *task = (void *)bpf_get_current_task();
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), task + TASK_FSBASE_OFF);
    return fsbase;
}

/* The calling thread's own PyThreadState (not the GIL holder's: PyTorch releases the GIL
 * inside ops, ctypes around foreign calls) as cached for this thread; 0 when it is not, and
 * then py_search_threads looks for it. */
static __always_inline u64 py_cached_thread_state(void)
{
    struct py_thread *cached = py_threads.task_storage_get(bpf_get_current_task_btf(), 0,
                                                           BPF_LOCAL_STORAGE_GET_F_CREATE);
    return cached && cached->tstate && cached->fsbase == thread_pointer() ? cached->tstate : 0;
}

/* The interpreter's first thread state: where a search begins. */
static __always_inline u64 py_first_thread_state(struct py_conf *c)
{
    u64 interp = read_user_u64(c->interp_head);
    return interp ? read_user_u64(interp + c->interp_tstate_head) : 0;
}

/* PY_THREADS_PER_RUN entries of the interpreter's thread-state list from `*cursor` on: the
 * calling thread's state when one of them is it (cached for the thread, `*cursor` 0), else 0
 * with `*cursor` at the next entry (0: the list's end). */
static __always_inline u64 py_search_threads(struct py_conf *c, u64 *cursor)
{
    u64 self = thread_pointer(), t = *cursor;
    for (int i = 0; i < PY_THREADS_PER_RUN && t; i++) {
        if (read_user_u64(t + c->tstate_thread_id) == self) {
            struct py_thread *cached = py_threads.task_storage_get(bpf_get_current_task_btf(), 0,
                                                                   BPF_LOCAL_STORAGE_GET_F_CREATE);
            if (cached) {
                cached->tstate = t;
                cached->fsbase = self;
            }
            *cursor = 0;
            return t;
        }
        t = read_user_u64(t + c->tstate_next);
    }
    *cursor = t;
    return 0;
}

static __always_inline u64 py_top_frame(struct py_conf *c, u64 tstate)
{
    u64 f = read_user_u64(tstate + c->tstate_frame);
    if (c->cframe_current_frame >= 0 && f) /* 3.11, 3.12: tstate->cframe->current_frame */
        f = read_user_u64(f + c->cframe_current_frame);
    return f;
}

static __always_inline u64 frame_field_u64(u8 *frame, s32 off)
{
    return *(u64 *)(frame + (off & 0xf8));
}

/* The frame at user address `frame`, `read` bytes of it, in the scratch window: from the last
 * window read when it holds them, else from a new read of the frame and everything below it
 * on its page (3.10's frames are separate heap objects: just the frame). NULL when the
 * memory cannot be read. */
static __always_inline u8 *py_frame_at(struct py_conf *c, struct py_scratch *s, u64 frame, u32 read)
{
    u64 off = frame - s->window_start;
    if (s->window_len && frame >= s->window_start && off + read <= s->window_len)
        return s->window + (off & (PY_PAGE_BYTES - 1));
    u32 below = c->minor == 10 ? 0 : frame & (PY_PAGE_BYTES - 1);
    /* below + read < PY_PAGE_BYTES + PY_FRAME_MAX; the mask says so to the verifier */
    u32 len = (below + read) & (2 * PY_PAGE_BYTES - 1);
    s->window_len = 0;
    if (read_user(s->window, len, (void *)(frame - below)) < 0)
        return 0;
    s->window_start = frame - below;
    s->window_len = len;
    return s->window + (below & (PY_PAGE_BYTES - 1));
}

/* Copy a str object's characters (its raw code units: 1, 2 or 4 bytes each, see `state`) into
 * `dst` of `cap` bytes; when they do not fit, `tail` keeps the end rather than the start. */
static __always_inline void py_read_str(struct py_conf *c, u64 str, u8 *dst, const u32 cap, int tail,
                                        u32 *len_out, u8 *state_out, u32 *skip_out)
{
    u64 len = read_user_u64(str + c->unicode_length);
    u32 state = 0;
    read_user(&state, sizeof(state), (void *)(str + c->unicode_state));
    u32 kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    *len_out = len;
    *state_out = state;
    if (!str || !compact || (kind != 1 && kind != 2 && kind != 4))
        return; /* a legacy (non-compact) string: user space says the name is unknown */
    u64 data = str + (ascii ? c->unicode_ascii_data : c->unicode_compact_data);
    u64 bytes = len * kind, skip = 0;
    if (bytes > cap) {
        if (tail)
            skip = (bytes - cap) / kind * kind;
        bytes = cap;
    }
    *skip_out = skip;
    if (bytes > 0 && bytes <= cap)
        read_user(dst, bytes, (void *)(data + skip));
}

static __always_inline u64 head_u64(u8 *head, s32 off)
{
    return *(u64 *)(head + (off & 0xf8));
}

/* First sight of a code object in this process: check it is one, copy what names it.
 * A learning meets mostly code objects it learned before (every new stack of an import
 * repeats importlib's frames), and must still tell whether the address now holds another
 * code object: one read of the object's head gives all it compares, where a read per field
 * cost ~70 ns each (half of what Python frames cost `import torch`, bench/RESULTS.md). */
static __always_inline int py_learn_code(struct py_conf *c, struct py_scratch *s, u32 tgid, u64 code)
{
    struct py_code_key key = {.code = code, .tgid = tgid};
    u32 read = c->code_read & (PY_CODE_HEAD_MAX - 1); /* the mask says so to the verifier */
    if (read < 16)
        return -1;
    u8 *head = s->code_head;
    count(MP_CNT_PY_CODE_READS);
    if (read_user(head, read, (void *)code) < 0) {
        count(MP_CNT_PY_BAD_CODE);
        return -1;
    }
    s32 firstlineno = *(s32 *)(head + (c->code_firstlineno & 0xfc));
    u64 name = head_u64(head, c->code_qualname >= 0 ? c->code_qualname : c->code_name);
    u64 file = head_u64(head, c->code_filename);
    u64 table = head_u64(head, c->code_linetable);
    struct py_code *known = py_codes.lookup(&key);
    if (known && known->name_ptr == name && known->file_ptr == file && known->lines_ptr == table &&
        known->firstlineno == firstlineno)
        return 0;
    if (head_u64(head, 8) != c->code_type) {
        count(MP_CNT_PY_BAD_CODE);
        return -1;
    }
    if (known)
        count(MP_CNT_PY_RELEARNED);
    struct py_code *pc = &s->code;
    pc->firstlineno = firstlineno;
    pc->minor = c->minor;
    pc->name_ptr = name;
    pc->file_ptr = file;
    pc->lines_ptr = table;
    u32 unused = 0;
    pc->name_len = pc->file_len = pc->file_skip = 0;
    pc->name_state = pc->file_state = 0;
    py_read_str(c, name, pc->name, PY_NAME_BYTES, 0, &pc->name_len, &pc->name_state, &unused);
    py_read_str(c, file, pc->file, PY_FILE_BYTES, 1, &pc->file_len, &pc->file_state, &pc->file_skip);
    u64 n = table ? read_user_u64(table + c->bytes_size) : 0;
    pc->lines_len = n;
    if (n > PY_LINES_BYTES)
        n = PY_LINES_BYTES;
    if (n > 0 && n <= PY_LINES_BYTES)
        read_user(pc->lines, n, (void *)(table + c->bytes_data));
    if (py_codes.update(&key, pc) < 0)
        count(MP_CNT_PY_MAP_FULL);
    return 0;
}

/* A frame's instruction index in code units, with PY_ENTRY_BIT where it is the first frame
 * of its eval call; PY_LASTI_NONE when the frame has not started. */
static __always_inline u32 py_lasti(struct py_conf *c, u8 *frame, u64 code)
{
    u32 lasti = PY_LASTI_NONE;
    if (c->minor == 10) {
        s32 l = *(s32 *)(frame + (c->frame_instr & 0xfc));
        if (l >= 0)
            lasti = l;
        return lasti | PY_ENTRY_BIT; /* 3.10: every Python call is its own eval call */
    }
    u64 instr = frame_field_u64(frame, c->frame_instr);
    u64 first = code + c->code_adaptive;
    if (instr >= first && instr - first < (1ULL << 31))
        lasti = (instr - first) / 2;
    if (c->frame_is_entry >= 0 && frame[c->frame_is_entry & 0xff])
        lasti |= PY_ENTRY_BIT;
    return lasti;
}

/* The allocation event `e`, finished but for its Python stack, to the ring buffer. When its
 * process has Python frames to read, `e` is copied into this CPU's scratch and the walk
 * program (py_walk_tp or py_walk_up, `raw_tp` says which) completes and outputs it: there,
 * the scratch is busy from here until the event is out. An event that finds the scratch busy
 * (one nested in a walk or a learning) goes without Python frames, and
 * is counted: a nested walk would overwrite the interrupted one's depth and frames. A failed
 * tail call, counted too, outputs the event here, without them.
 * `call`: the system call the event is in (common.bpf.c, this_call()), or 0. A thread makes
 * several allocations in one call (an open, a pipe2: 2 to 12) and runs no Python until it
 * returns, so the call's first walk is noted in its anchor and its later events take that
 * stack: a quarter of the training bench's kernel allocations (bench/RESULTS.md). */
static __always_inline void emit_alloc(void *ctx, struct mp_event *e, const int raw_tp, struct syscall_anchor *call)
{
    u32 zero = 0, tgid = e->pid;
    struct py_conf *c = py_procs.lookup(&tgid);
    if (c && call && call->py_walked) {
        e->py_stack = call->py_stack; /* walked by an earlier event of this call */
        count(MP_CNT_PY_CALL_STACKS);
        output(e);
        return;
    }
    struct py_scratch *s = c ? py_scratch.lookup(&zero) : 0;
    if (s && s->busy) {
        count(MP_CNT_SCRATCH_BUSY);
        s = 0;
    }
    if (s) {
        s->busy = 1;
        s->walking = 1;
        s->walk_runs = 0; /* no run made: the first begins the walk */
        s->search_runs = 0;
        s->event = *e;
        s->conf = *c;
        s->call = mark_of_call(call);
        py_enter_walk(ctx, raw_tp);
        s->walking = 0;
        s->busy = 0;
        count(MP_CNT_PY_TAIL_FAILED);
    }
    output(e);
}

/* The walk's first step: its stack emptied, and the thread's top frame found through its
 * cached state, or else a search for the state begun (thread_cursor). */
static __always_inline void py_walk_start(struct py_conf *c, struct py_scratch *s, u32 tgid)
{
    s->window_len = 0; /* what an earlier event read is stale */
    s->stack.depth = 0;
    s->walk_hash = 0xcbf29ce484222325ULL ^ tgid;
    s->walk_frame = 0;
    s->thread_cursor = 0;
    u64 tstate = py_cached_thread_state();
    if (tstate)
        s->walk_frame = py_top_frame(c, tstate);
    else if (!(s->thread_cursor = py_first_thread_state(c)))
        count(MP_CNT_PY_NO_THREAD);
}

/* One run of the search for the thread's state: the top frame once found; counted when the
 * list ends or PY_MAX_THREADS entries were compared without it. */
static __always_inline void py_walk_search(struct py_conf *c, struct py_scratch *s)
{
    u64 cursor = s->thread_cursor;
    u64 tstate = py_search_threads(c, &cursor);
    s->search_runs++;
    if (!tstate && cursor && s->search_runs >= PY_THREAD_RUNS)
        cursor = 0;
    s->thread_cursor = cursor;
    if (tstate)
        s->walk_frame = py_top_frame(c, tstate);
    else if (!cursor)
        count(MP_CNT_PY_NO_THREAD);
}

/* Up to PY_WALK_PER_RUN frames from s->walk_frame on, appended to s->stack and hashed into
 * s->walk_hash; s->walk_frame is left at the next one (0: the chain's end, or memory that
 * cannot be read). */
static __always_inline void py_walk_frames(struct py_conf *c, struct py_scratch *s)
{
    u64 frame = s->walk_frame, hash = s->walk_hash;
    u32 read = c->frame_read;
    if (read == 0 || read >= PY_FRAME_MAX)
        frame = 0;
    /* The depth lives in the map value, not in a register: the verifier then does not
     * follow every (iteration, depth) pair apart, which it would for a precise register.
     * (A volatile read: a frame found in the window makes no helper call that would make
     * clang reload it.) */
    for (int i = 0; i < PY_WALK_PER_RUN && frame; i++) {
        u8 *fr = py_frame_at(c, s, frame, read);
        if (!fr) {
            frame = 0;
            break;
        }
        u64 previous = frame_field_u64(fr, c->frame_previous);
        u32 d = *(volatile u32 *)&s->stack.depth;
        if (c->frame_owner >= 0 && fr[c->frame_owner & 0xff] == PY_OWNED_BY_CSTACK) {
            /* 3.12+: the frame below this shim was the first of its eval call */
            if (d > 0)
                s->stack.lasti[(d - 1) & (PY_MAX_FRAMES - 1)] |= PY_ENTRY_BIT;
            frame = previous;
            continue;
        }
        u64 code = frame_field_u64(fr, c->frame_code);
        u32 lasti = py_lasti(c, fr, code);
        s->stack.code[d & (PY_MAX_FRAMES - 1)] = code;
        s->stack.lasti[d & (PY_MAX_FRAMES - 1)] = lasti;
        s->stack.depth = d + 1;
        hash = (hash ^ code) * 0x100000001b3ULL;
        hash = (hash ^ lasti) * 0x100000001b3ULL;
        frame = previous;
    }
    s->walk_frame = frame;
    s->walk_hash = hash;
}

/* The walked stack's id (its hash), interned into py_stacks, and marked for learning when it
 * is new; 0 when it has no frames. */
static __always_inline u64 py_intern(struct py_scratch *s, u32 tgid)
{
    u64 hash = s->walk_hash;
    if (s->stack.depth == 0)
        return 0;
    if (py_stacks.lookup(&hash))
        return hash;
    s->stack.tgid = tgid;
    if (py_stacks.update(&hash, &s->stack) < 0) {
        count(MP_CNT_PY_MAP_FULL);
        return 0;
    }
    s->learn = 1;
    s->learn_from = 0;
    s->learning++;
    return hash;
}

/* One run of the walk (see emit_alloc): the next PY_WALK_PER_RUN frames, then a tail call
 * of itself while frames remain (PY_MAX_FRAMES at most, shim frames included, as one loop
 * read them); at the end, the event out with its stack's id, the scratch free, and a new
 * stack's learning entered. A failed tail call ends the stack where it is (counted). */
static __always_inline int py_walk_run(void *ctx, const int raw_tp)
{
    u32 zero = 0;
    struct py_scratch *s = py_scratch.lookup(&zero);
    if (!s || !s->busy || !s->walking) /* entered only by emit_alloc's tail call, and our own */
        return 0;
    u32 tgid = s->event.pid;
    struct py_conf *c = &s->conf;
    if (s->walk_runs == 0 && s->search_runs == 0)
        py_walk_start(c, s, tgid);
    if (s->thread_cursor) {
        py_walk_search(c, s);
    } else {
        py_walk_frames(c, s);
        s->walk_runs++;
    }
    if (s->thread_cursor || (s->walk_frame && s->walk_runs < PY_WALK_RUNS)) {
        py_enter_walk(ctx, raw_tp);
        count(MP_CNT_PY_TAIL_FAILED);
    }
    s->event.py_stack = py_intern(s, tgid);
    struct syscall_anchor *call = still_this_call(s->call);
    if (call) {
        call->py_stack = s->event.py_stack;
        call->py_walked = 1;
    }
    s->walking = 0;
    output(&s->event);
    s->busy = 0;
    if (s->learn)
        py_enter_learning(ctx, raw_tp);
    return 0;
}

MP_USER_PROGRAM int mp_py_walk_tp(struct bpf_raw_tracepoint_args *ctx) { return py_walk_run(ctx, 1); }
MP_USER_PROGRAM int mp_py_walk_up(struct pt_regs *ctx) { return py_walk_run(ctx, 0); }

/* Learn the code objects of the stack py_walk_run() just interned, PY_LEARN_PER_RUN frames a
 * run, then tail-call the same program for the rest. A code object that recurs in the stack
 * is checked once: all of a stack's frames were live at once, each holding its code object,
 * and the thread has not run since (its event's program, and these, run before it returns
 * to user space), so one address there is one object. An import's stack repeats importlib's
 * few functions at every level: a training run's chains held 54 Python frames on average,
 * of 18 distinct functions (bench/RESULTS.md). Between runs the scratch is not busy: a nested event that walks then may replace the stack (and its learning)
 * before the rest of this one is learned, whose frames then stay unnamed (user space counts
 * them), as an event that finds the scratch busy goes without frames. */
static __always_inline int py_learn_codes(void *ctx, const int raw_tp)
{
    u32 zero = 0, tgid = bpf_get_current_pid_tgid() >> 32;
    struct py_scratch *s = py_scratch.lookup(&zero);
    if (!s || !s->learn || s->busy) /* busy: nested in a walk or a learning (see `busy`) */
        return 0;
    struct py_conf *c = &s->conf; /* the walk's copy: this thread's process's */
    s->busy = 1;
    u32 from = s->learn_from, depth = s->stack.depth;
    for (int k = 0; k < PY_LEARN_PER_RUN; k++) {
        u32 i = from + k;
        if (i >= depth) /* depth <= PY_MAX_FRAMES */
            break;
        /* `from` is a map value, unknown to the verifier: the index is masked, and the
         * barrier keeps clang from dropping the mask or folding it into a pointer it steps */
        u32 at = i & (PY_MAX_FRAMES - 1);
        asm volatile("" : "+r"(at));
        u64 code = s->stack.code[at];
        u32 slot = ((code * 0x9E3779B97F4A7C15ULL) >> 59) & (PY_LEARN_SEEN - 1);
        if (s->learn_seen[slot].code == code && s->learn_seen[slot].learning == s->learning)
            continue; /* checked lower in this same stack: the same object (see above) */
        if (py_learn_code(c, s, tgid, code) == 0) {
            s->learn_seen[slot].code = code;
            s->learn_seen[slot].learning = s->learning;
        }
    }
    u32 next = from + PY_LEARN_PER_RUN;
    int more = next < depth && next < PY_MAX_FRAMES;
    s->learn = more;
    s->learn_from = next;
    s->busy = 0;
    if (more) {
        py_enter_learning(ctx, raw_tp);
        s->learn = 0; /* the tail call failed: the rest stay unlearned */
        count(MP_CNT_PY_TAIL_FAILED);
    }
    return 0;
}

MP_KERNEL_PROGRAM int mp_py_learn_tp(struct bpf_raw_tracepoint_args *ctx) { return py_learn_codes(ctx, 1); }
MP_USER_PROGRAM int mp_py_learn_up(struct pt_regs *ctx) { return py_learn_codes(ctx, 0); }

/* ---- registration at interpreter start ----
 * User space registers a process once it has read its maps, which for a shared build (a
 * python3.X linked against libpython) is after the loader has mapped libpython: one ring
 * buffer poll later, and by then a short program's first Python code may have run (the
 * main thread's chains had no Python frames while the slower start of `+native`'s traps
 * hid the race). So each confirmed runtime file also gets a uprobe at Py_InitializeFromConfig
 * (once per process, before any Python code), whose program registers the process itself:
 * the file's offsets, with link-time addresses, wait in `py_templates` (one slot per file,
 * one program per slot), and the load bias is the probe's address minus the function's
 * link-time address. */
struct py_template {
    struct py_conf conf;  /* interp_head, code_type: link-time addresses */
    u64 init_vaddr;       /* link-time address of the probed function */
};
BPF_ARRAY(py_templates, struct py_template, PY_INIT_SLOTS);
/* tgid -> slot of each process registered here: user space names its interpreter in
 * meta.json even when the process exited before its maps were read. */
BPF_TABLE("lru_hash", u32, u32, py_started, 4096);

/* A forked child runs its parent's interpreter at the same addresses: its Python frames from
 * its first allocation, not from when user space has read its maps (a DataLoader worker that
 * allocated at once had none). Its threads' states are found anew (py_threads is per task);
 * an exec deletes the copy, and user space's register() writes the same one later. */
static __always_inline void py_inherit(u32 parent, u32 child)
{
    struct py_conf *conf = py_procs.lookup(&parent);
    if (conf) {
        struct py_conf copy = *conf;
        py_procs.update(&child, &copy);
    }
}

static __always_inline int py_init(struct pt_regs *ctx, u32 slot)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid) || py_procs.lookup(&tgid))
        return 0;
    struct py_template *t = py_templates.lookup(&slot);
    if (!t || !t->init_vaddr)
        return 0;
    struct py_conf conf = t->conf;
    u64 bias = PT_REGS_IP(ctx) - t->init_vaddr;
    conf.interp_head += bias;
    conf.code_type += bias;
    py_procs.update(&tgid, &conf);
    py_started.update(&tgid, &slot);
    return 0;
}

MP_USER_PROGRAM int mp_py_init_0(struct pt_regs *ctx) { return py_init(ctx, 0); }
MP_USER_PROGRAM int mp_py_init_1(struct pt_regs *ctx) { return py_init(ctx, 1); }
MP_USER_PROGRAM int mp_py_init_2(struct pt_regs *ctx) { return py_init(ctx, 2); }
MP_USER_PROGRAM int mp_py_init_3(struct pt_regs *ctx) { return py_init(ctx, 3); }
