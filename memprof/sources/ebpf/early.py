"""Compiling and loading the BPF program before the recorder asks for it (issue 24: start-up).

bcc's compile (1.3-2.0 s on the project's VM) and the kernel's check of each program
(~0.5 s for all) are C calls that release the GIL; with bcc's compiled program in the
cache (compiled_cache.py) the compile is ~40 ms of reading it and creating the maps. `begin(options)` starts both on a thread
the moment `record` knows its options, so they overlap what start-up does meanwhile:
importing the recorder (numpy, pyarrow), checking the output, finding the libraries to
probe. `loading.compile_program` then takes the compiled object (`take`) when its text and
flags are those it would compile; otherwise (the options changed, or `begin` never ran) it
compiles as before. From a cached object, `take` waits only for the programs attached before
the command starts; the torch and cuda families' are checked on behind it (CachedBPF.load_behind);
a foreground load of a program that thread is loading waits for it. Where the cache has no
entry, `begin` forks children that compile the program's halves (compile_child.py: the
recorder never loads LLVM), and the thread rebuilds the object from what they send, as from
the cache.

Nothing of the thread reaches the terminal. While it runs, fd 2 is a file (clang's
diagnostics, a refused program's verifier log), and memprof's own `sys.stderr` writes to a
copy of the terminal's descriptor, from `begin` on. A failure here is kept quiet: the
foreground compiles or loads again, captures the diagnostics, and raises its typed error,
as it did before this module.

The thread is not a daemon: an exit while LLVM compiles (an early error, Ctrl-C) waits for
it, rather than running LLVM's global destructors under it. It has a working directory of
its own (unshare(CLONE_FS)), since bcc's compile changes into the kernel's build folder and
back; where the kernel refuses that, nothing is begun early. While bcc compiles, the thread
also has a mount namespace of its own, where /proc/kallsyms reads as the one line bcc's
front end looks for in it (_kallsyms_answered): ~0.1 s of each compile was bcc reading it all.
The foreground's compile, where it compiles, runs on such a thread too (compile_on_own_thread).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from memprof.quiet_threads import start_quiet

LOAD_THREADS = 4
_pending: "_Early | None" = None


@dataclass
class _Early:
    text: str
    cflags: list[str]
    options: Any  # the EbpfOptions compiled for: the thread lists the programs to load from them
    child: Any = None  # the compile_child.SplitCompile compiling it, where children were forked
    compiling: bool = False  # bcc compiles it, here or in children (not a cache entry's load)
    done: threading.Event = field(default_factory=threading.Event)
    bpf: Any = None  # bcc's BPF object, once compiled; None when the compile failed


def begin(options) -> None:
    """Start compiling the program for `options` (an EbpfOptions) and loading the programs
    every recording with them loads at its start. Does nothing where this process may not
    load BPF programs (the foreground then says why), or when a compile already began."""
    global _pending
    from memprof.capture.may_record import can_record
    if _pending is not None or not can_record():
        return
    from memprof.sources.ebpf.loading import program_source
    text, cflags = program_source(options, options.enabled)
    from memprof.sources.ebpf import compiled_cache
    uncached = not compiled_cache.has_entry(text, cflags)
    _pending = _Early(text, cflags, options, child=_compile_children(text, cflags) if uncached else None,
                      compiling=uncached)
    _ask_the_rest_and_forget_the_btf(options)
    _keep_own_stderr_on_terminal()
    start_quiet(threading.Thread(target=_compile, args=(_pending,), name="memprof-compile"))  # its loaders inherit


def _ask_the_rest_and_forget_the_btf(options) -> None:
    """The kernel BTF's answers a recording asks after program_source's (the kmem tracepoints'
    parameters, for their attach plan), asked now, and the parse a first run made for them
    dropped (~14 MB it would hold for the whole recording: btf_answers.py). Run before the
    compile thread, which asks them too, begins. Never raises: a question the BTF cannot
    answer is asked again, and said, where it is needed."""
    from memprof.sources.ebpf.btf import BtfError
    from memprof.sources.ebpf.btf_answers import forget_parse
    if options.enabled("kmem"):
        from memprof.sources.ebpf.kmem import plan_attach
        try:
            plan_attach()
        except (BtfError, OSError):
            pass
    forget_parse()


CHILD_ENV = "MEMPROF_COMPILE_CHILD"  # "0": compile on the thread, in the recorder (benches compare)


def _compile_children(text: str, cflags: list[str]):
    """A compile_child.SplitCompile compiling `text` (for a first run: the cache has no entry),
    forked now, while this process has one thread; None where the children are off
    (MEMPROF_COMPILE_CHILD=0) or cannot be forked: the thread then compiles in this process."""
    from memprof.sources.ebpf import compile_child
    if os.environ.get(CHILD_ENV, "1") == "0":
        return None
    return compile_child.fork_compile(text, cflags)


def take(text: str, cflags: list[str]):
    """The BPF object `begin` compiled from exactly `text` and `cflags`, waiting for it;
    None when there is none (never begun, other flags, or it failed: compile it here). Each
    compile is taken once; one compiled from other flags is released."""
    global _pending
    early, _pending = _pending, None
    if early is None:
        return None
    reader = _read_kernel_symbols_meanwhile() if early.compiling and early.options.enabled("kmem") else None
    early.done.wait()  # even when unused: its thread must give fd 2 back before anyone compiles
    if reader is not None:
        reader.compile_over()
    if early.text == text and early.cflags == cflags:
        return early.bpf
    if early.bpf is not None:
        early.bpf.cleanup()  # its maps: the ring buffer alone pins ringbuf_bytes of kernel memory
    return None


def programs_before(options) -> list[tuple[str, int]]:
    """The programs EbpfSource.start loads whatever the command, in place before the command
    starts: the kmem tracepoints' and the Python walk's and learning's (cpython/frames.py),
    as (program, bcc program type)."""
    from bcc import BPF
    from memprof.sources.cpython.options import tail_called_programs
    from memprof.sources.ebpf import kmem as K
    before = [(fn, BPF.RAW_TRACEPOINT) for _, fn in K.plan_attach()] if options.enabled("kmem") else []
    before += [(fn, kind) for _, fn, kind in tail_called_programs()]
    return list(dict.fromkeys(before))


def late_programs(options) -> list[tuple[str, int]]:
    """Every program of the torch and cuda families (library_probes: attached at the start if
    their library is already known, else verified for one mapped later), as (program, bcc
    program type). The native family's depend on the interposer's choice, made later: they
    are loaded in the foreground. Listed on the compile's thread, after the programs before
    the command: neither `begin` nor those loads wait for the families' module (uprobes.py)
    and what it imports."""
    from bcc import BPF
    from memprof.sources.ebpf import uprobes as U
    late = []
    for name, family in U.FAMILIES.items():
        if options.enabled(name):
            late += [(fn, BPF.KPROBE) for fn in U.family_programs(family, options.alloc_probes)]
    return list(dict.fromkeys(late))


CLONE_FS = 0x00000200  # <sched.h>: the working directory, root and umask
CLONE_NEWNS = 0x00020000  # <sched.h>: a mount namespace of the thread's own
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000  # <sys/mount.h>
MNT_DETACH = 2
KALLSYMS = b"/proc/kallsyms"
# bcc's front end asks kallsyms one question at every compile (BFrontendAction::
# DoMiscWorkAround): is there a bpf_probe_read_kernel, or must it stand in bpf_probe_read?
# Answering it, bcc 0.26 reads and indexes all of /proc/kallsyms (~120,000 symbols): ~0.1 s
# of a 0.7 s compile. memprof's answer is always yes: its parts call bpf_probe_read_user
# (read_user, bpf/parts.h), which came in the same kernel (5.5) and has no stand-in.
KALLSYMS_ANSWER = b"ffffffff81000000 T bpf_probe_read_kernel\n"


def _own_working_directory() -> bool:
    """Give the calling thread a working directory of its own (unshare(CLONE_FS)); False
    where the kernel refuses. bcc's compile changes the working directory into the kernel's
    build folder and back (its DirStack): on a thread sharing it, memprof's main thread
    would meanwhile resolve `./train.sh` or `-o run.memprof` in that folder."""
    return _libc().unshare(CLONE_FS) == 0


def compile_on_own_thread(text: str, cflags: list[str]):
    """bcc's BPF object for `text` and `cflags`, compiled as `begin`'s thread compiles it: on a
    thread with a working directory of its own and kallsyms answered (_compile_answered);
    raises what bcc's BPF() raised. Where the kernel refuses the thread its own working
    directory, compiled on the calling thread, as bcc compiles. For the foreground's compile
    (loading.compile_program) and bench/compile_cost.py."""
    outcome: dict = {}

    def compile_here() -> None:
        try:
            if _own_working_directory():
                outcome["bpf"] = _compile_answered(text, cflags)
        except BaseException as e:  # handed to the caller's thread, raised there
            outcome["error"] = e

    thread = threading.Thread(target=compile_here, name="memprof-compile")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    if "bpf" in outcome:
        return outcome["bpf"]
    from bcc import BPF
    return BPF(text=text.encode(), cflags=cflags)  # bytes: bcc warns of str


def _compile_answered(text: str, cflags: list[str]):
    """bcc's BPF object, compiled on the calling thread (which has its own working
    directory) with kallsyms answered."""
    from bcc import BPF
    with _kallsyms_answered():
        return BPF(text=text.encode(), cflags=cflags)  # bytes: bcc warns of str


@contextlib.contextmanager
def _kallsyms_answered():
    """While the block runs, /proc/kallsyms reads as KALLSYMS_ANSWER on the calling thread
    alone, which must have its own working directory (_own_working_directory); as it is
    where the kernel refuses. The thread moves to a mount namespace of its own, whose
    mounts are made private before anything is mounted, so nothing reaches the host's
    namespace; the line is in a tmpfs of that namespace, on no path anyone else can reach."""
    answered = _answer_kallsyms()
    try:
        yield answered
    finally:
        if answered:
            _libc().umount2(KALLSYMS, MNT_DETACH)


def _answer_kallsyms() -> bool:
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False  # in the first case nothing changed; in the second nothing is mounted
    # A tmpfs mounted on /tmp for the moment it takes to write the line and bind it over
    # kallsyms: the bind keeps the tmpfs, and /tmp is the thread's own again at once.
    if libc.mount(b"memprof", b"/tmp", b"tmpfs", 0, b"size=4k,mode=0700") != 0:
        return False
    try:
        fd = os.open("/tmp/kallsyms", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, KALLSYMS_ANSWER)
        finally:
            os.close(fd)
        return libc.mount(b"/tmp/kallsyms", KALLSYMS, None, MS_BIND, None) == 0
    except OSError:
        return False
    finally:
        libc.umount2(b"/tmp", MNT_DETACH)


@functools.lru_cache(maxsize=1)
def _libc():
    """libc with the prototypes of the calls above (mount's flags are an unsigned long)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    text = ctypes.c_char_p
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [text, text, text, ctypes.c_ulong, ctypes.c_void_p]
    libc.umount2.argtypes = [text, ctypes.c_int]
    return libc


def _compile(early: _Early) -> None:
    from memprof.sources.ebpf import compiled_cache
    from memprof.sources.ebpf.bpfload import captured_stderr
    try:
        if early.child is not None:
            with captured_stderr():  # a refused program's verifier log, written to fd 2 by the loads
                early.bpf = _from_child(early)
            return
        if not _own_working_directory():
            return  # the foreground compiles, as before (compile_on_own_thread is refused too)
        with captured_stderr():
            early.bpf = compiled_cache.load(early.text, early.cflags)
            if early.bpf is not None:  # from the cache: the late families' loads go on behind, quietly
                _load_as_from_the_cache(early.bpf, early.options)
                return
            early.compiling = True  # where the entry was there but not usable: take may have looked already
            try:
                early.bpf = _compile_answered(early.text, early.cflags)
            except Exception:  # bcc raises bare Exception; the foreground compiles again and says why
                return
            compiled_cache.store(early.bpf, early.text, early.cflags)
            # bcc writes a refused program's verifier log to fd 2, captured only until take returns
            _load_in_parallel(early.bpf, programs_before(early.options) + late_programs(early.options))
    except Exception:  # never a traceback from here: what failed is done again in the foreground
        pass
    finally:
        early.done.set()


def _from_child(early: _Early):
    """The CachedBPF on the maps `early.child`'s children compiled, its programs before the
    command loaded and the late families' loading behind, as from the cache, their joined
    entry stored for the next run; None when a child failed or the kernel refuses a part of it
    (the foreground then compiles, and says why)."""
    from memprof.sources.ebpf import compiled_cache
    from memprof.sources.ebpf.cached_bpf import CachedBPF  # before any descriptor is received
    received = early.child.receive()
    if received is None:
        return None
    entry, map_fds = received
    try:
        bpf = CachedBPF(entry, map_fds=map_fds)  # which closes the maps when it fails
    except Exception:  # a malformed entry, or bcc's bare Exception from an attach or a refusal
        return None
    _load_as_from_the_cache(bpf, early.options)
    compiled_cache.store_entry(entry, early.text, early.cflags)  # ~1 ms of JSON: the kernel took its programs
    return bpf


def _load_as_from_the_cache(bpf, options) -> None:
    """A CachedBPF's loads: the programs before the command now, on one thread per CPU; the
    late families' behind, quietly (the foreground's load of one says why it was refused)."""
    _load_in_parallel(bpf, programs_before(options))
    bpf.load_behind(late_programs(options))


def _read_kernel_symbols_meanwhile() -> "_ReaderBehindCompile":
    """kallsyms read on a thread of its own while bcc compiles (symbolize.read_kernel_symbols_ahead):
    the main thread waits for the compile meanwhile, and the recording's first flush needs
    the kernel's symbols. Begun by `take`, from the main thread: in the host's mount
    namespace (the compile thread's own reads /proc/kallsyms as one line, _kallsyms_answered),
    and once the main thread's imports are done. Begun with the compile, the reader at nice 19
    held the GIL while the compile children took both CPUs, and the main thread's imports
    waited for it (its `take` came 0.84-1.16 s into a first run instead of 0.27-0.5 s). The
    reader imports its module itself. Returns it: `take` calls its `compile_over()` when the
    compile is done."""
    reader = _ReaderBehindCompile(_read_kernel_symbols)
    start_quiet(threading.Thread(target=reader.run, name="memprof-kallsyms-ahead", daemon=True))
    return reader


def _read_kernel_symbols() -> None:
    from memprof.sources.symbols.symbolize import read_kernel_symbols_ahead
    read_kernel_symbols_ahead()


class _ReaderBehindCompile:
    """Runs `read` at the lowest priority (nice 19, its thread alone) until bcc's compile is
    over, then at the priority it began with. On two CPUs the read would otherwise take CPU
    from the compile, which is what the command waits for (begun beside the main thread's
    imports, it made bcc's BPF() 846-879 ms against 722-786 ms at nice 19, bench/RESULTS.md;
    it is begun at `take` now, with the main thread waiting). Once the compile
    is over the first flush waits for the read, and a command that keeps every CPU busy would
    starve it at nice 19: hence the way back. Only root lowers it, since only root (CAP_SYS_NICE)
    may raise it again; the thread's id is used only while the thread is known to run."""

    LOWEST = 19

    def __init__(self, read):
        self._read = read
        self._lock = threading.Lock()
        self._lowered_tid: int | None = None  # the reader's thread, while it runs lowered
        self._began_at = 0
        self._compile_over = False

    def run(self) -> None:
        with self._lock:
            if not self._compile_over and os.geteuid() == 0:
                with contextlib.suppress(OSError):
                    self._began_at = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: 0 is this thread
                    os.setpriority(os.PRIO_PROCESS, 0, self.LOWEST)
                    self._lowered_tid = threading.get_native_id()
        try:
            self._read()
        finally:
            with self._lock:
                self._lowered_tid = None

    def compile_over(self) -> None:
        """Give the reader its priority back, if it still runs lowered; never lower it after."""
        with self._lock:
            self._compile_over = True
            if self._lowered_tid is not None:
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, self._lowered_tid, self._began_at)
                self._lowered_tid = None


def _load_in_parallel(bpf, programs: list[tuple[str, int]]) -> None:
    """Load `programs` into `bpf` on one thread per CPU (at most LOAD_THREADS). The kernel
    checks each program in the loading thread, in a system call that releases the GIL: eight
    of the 27 default programs take ~50 ms each here. bcc keeps each loaded program for the
    foreground's load_func; one that fails is loaded again there, which shows the verifier's
    log."""
    queue = list(programs)

    def load_some() -> None:
        while True:
            try:
                name, kind = queue.pop()
            except IndexError:
                return
            try:
                bpf.load_func(name.encode(), kind)  # bytes: bcc warns of str names
            except Exception:  # bcc raises bare Exception
                pass

    # Plain threads, not a ThreadPoolExecutor: when memprof exits early (a usage error) while
    # the compile runs, concurrent.futures refuses new work once the interpreter shuts down.
    workers = [threading.Thread(target=load_some, name="memprof-load")
               for _ in range(max(1, min(LOAD_THREADS, os.cpu_count() or 1)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _keep_own_stderr_on_terminal() -> None:
    """Point `sys.stderr` at a copy of fd 2, so memprof's own messages reach the terminal
    while the thread has fd 2 on a file. The copy is close-on-exec (os.dup): commands memprof
    starts get fd 2 itself, which is back on the terminal by then (`take` waits for it).
    Left as it is where sys.stderr is not fd 2 (a test's capture, CliRunner)."""
    stream = sys.stderr
    try:
        if stream is None or stream.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):
        return
    stream.flush()
    sys.stderr = open(os.dup(2), "w", buffering=1, encoding=stream.encoding, errors=stream.errors)
