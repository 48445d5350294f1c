"""Which user-space allocator functions to probe, in which libraries, and where to find
those libraries — before the target maps them where the path is known (the command's
Python environment, LD_LIBRARY_PATH, the loader's cache), and as soon as they appear in a
process's mappings otherwise."""
from __future__ import annotations

import functools
import glob
import os
import select
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprof import own_env
from memprof.model import Layer
from memprof.sources.ebpf.callsite import CallSite, find_call_site
from memprof.sources.ebpf.options import CALL_SITE

if TYPE_CHECKING:
    from memprof.capture.target import RunAs

ENTRY, RETURN = "entry", "return"


@dataclass(frozen=True)
class AtCall:
    """A one-trap alternative to an allocator's entry and return probes: `program` on the
    allocator's call to `callee`, which receives (address, size) as its first two arguments
    (see memprof/sources/ebpf/callsite.py for when it is used)."""

    callee: str
    program: str


@dataclass(frozen=True)
class Probe:
    """One function to probe: `program` runs at entry; functions that allocate also get
    `return_program` at return (where the address is known), or, where `at_call` is found
    in the library, that one probe instead of both."""

    symbol: str
    program: str
    return_program: str | None = None
    optional: bool = True  # missing from this build of the library: skip it
    at_call: AtCall | None = None


@dataclass(frozen=True)
class Place:
    """One uprobe of a Probe: `program` at `offset` bytes into its symbol (ENTRY), or at the
    symbol's return (RETURN, offset 0)."""

    kind: str
    offset: int
    program: str


def places(path: str, probe: Probe, alloc_probes: str = CALL_SITE) -> tuple[tuple[Place, ...], str | None]:
    """Where to attach `probe` in the library at `path`: its call to `at_call.callee`, where
    memprof/sources/ebpf/callsite.py finds it (one trap per allocation), else its entry and, for an
    allocator, its return. `alloc_probes` is `record --alloc-probes` ("call-site" or
    "entry-return"). Also returns, in words, how an allocator with a call-site alternative
    is probed (meta.json's allocation_probes); None for the other probes."""
    site = _call_site(path, probe, alloc_probes)
    if site is not None and site.offset is not None:
        return (Place(ENTRY, site.offset, probe.at_call.program),), site.why
    found = (Place(ENTRY, 0, probe.program),)
    if probe.return_program:
        found += (Place(RETURN, 0, probe.return_program),)
    return found, None if site is None else f"entry and return ({site.why})"


def _call_site(path: str, probe: Probe, alloc_probes: str) -> CallSite | None:
    """Where `probe` can take an allocation in one trap (offset None: why not); None when
    it has no such alternative."""
    if probe.at_call is None:
        return None
    if alloc_probes != CALL_SITE:
        return CallSite(None, "--alloc-probes entry-return")
    return find_call_site(path, probe.symbol, probe.at_call.callee)


@dataclass(frozen=True)
class Family:
    """Probes on one library, recorded into one layer."""

    name: str          # the --sources name
    layer: Layer
    library: str       # basename prefix as it appears in /proc/PID/maps
    probes: tuple[Probe, ...]
    default_on: bool


TORCH = Family("torch", Layer.TORCH_CPU, "libc10.so", (
    Probe("_ZN3c109alloc_cpuEm", "mp_c10_alloc_cpu", "mp_torch_return", optional=False,
          at_call=AtCall("_ZN3c108NUMAMoveEPvmi", "mp_c10_alloc_at_call")),
    Probe("_ZN3c108free_cpuEPv", "mp_c10_free_cpu", optional=False),
), default_on=True)

CUDA = Family("cuda", Layer.CUDA_DRIVER, "libcuda.so", (
    Probe("cuMemAlloc_v2", "mp_cu_mem_alloc", "mp_cuda_return"),
    Probe("cuMemAllocPitch_v2", "mp_cu_mem_alloc_pitch", "mp_cuda_return"),
    Probe("cuMemAllocManaged", "mp_cu_mem_alloc_managed", "mp_cuda_return"),
    Probe("cuMemAllocAsync", "mp_cu_mem_alloc_async", "mp_cuda_return"),
    Probe("cuMemAllocHost_v2", "mp_cu_mem_alloc_host", "mp_cuda_return"),
    Probe("cuMemHostAlloc", "mp_cu_mem_host_alloc", "mp_cuda_return"),
    Probe("cuMemCreate", "mp_cu_mem_create", "mp_cuda_return"),
    Probe("cuMemFree_v2", "mp_cu_mem_free"),
    Probe("cuMemFreeAsync", "mp_cu_mem_free"),
    Probe("cuMemFreeHost", "mp_cu_mem_free_host"),
    Probe("cuMemRelease", "mp_cu_mem_free"),
), default_on=True)

_NATIVE_PROBES = (
    ("malloc", "mp_malloc", True), ("calloc", "mp_calloc", True), ("realloc", "mp_realloc", True),
    ("posix_memalign", "mp_posix_memalign", True), ("aligned_alloc", "mp_memalign", True),
    ("memalign", "mp_memalign", True), ("valloc", "mp_valloc", True), ("mmap", "mp_mmap", True),
    ("free", "mp_free", False), ("munmap", "mp_free", False),
)


def native_family(prefix: str = "", library: str = "libc.so") -> Family:
    """The libc heap, or an allocator exporting the same names with `prefix` (je_, tc_)."""
    probes = tuple(Probe(prefix + name, prog, "mp_native_return" if returns else None, optional=name not in ("malloc", "free"))
                   for name, prog, returns in _NATIVE_PROBES)
    return Family("native", Layer.NATIVE_HEAP, library, probes, default_on=False)


def preload_family() -> Family:
    """The libc heap through memprof's LD_PRELOAD interposer (memprof/preload): one uprobe
    on each of its two markers, called only for what it recorded (it samples and filters)."""
    from memprof import preload
    probes = (Probe(preload.ALLOC_MARKER, "mp_preload_alloc", optional=False),
              Probe(preload.FREE_MARKER, "mp_preload_free", optional=False))
    return Family("native", Layer.NATIVE_HEAP, preload.LIBRARY_NAME, probes, default_on=False)


FAMILIES = {"torch": TORCH, "cuda": CUDA}


def family_programs(family: Family, alloc_probes: str = CALL_SITE) -> tuple[str, ...]:
    """Every BPF program `places()` may attach for `family` in some library: each probe's
    call-site program (with `alloc_probes` "call-site"), and its entry and return programs,
    which stand in wherever a build lacks the call site. In order, without repeats."""
    names: list[str] = []
    for probe in family.probes:
        if probe.at_call is not None and alloc_probes == CALL_SITE:
            names.append(probe.at_call.program)
        names.append(probe.program)
        if probe.return_program:
            names.append(probe.return_program)
    return tuple(dict.fromkeys(names))


def find_known_libraries(command_path: str | None, environ=os.environ,
                         run_as: "RunAs | None" = None) -> dict[str, list[str]]:
    """Library paths we can probe before the target starts: family name -> paths.

    The command's Python environment (its torch, as its interpreter reports it, run as
    `run_as`: see _python_site_dirs), LD_LIBRARY_PATH, and the loader's cache (libcuda.so.1
    of the installed driver). Libraries found later in the target's mappings are probed then."""
    found: dict[str, list[str]] = {"torch": [], "cuda": []}
    for site in _python_site_dirs(command_path, run_as):  # what the user's program printed: no patterns
        candidate = os.path.join(site, "torch", "lib", "libc10.so")
        if os.path.isfile(candidate):
            found["torch"].append(candidate)
    for directory in filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")):
        found["cuda"] += [p for p in glob.glob(os.path.join(directory, "libcuda.so*")) if os.path.isfile(p)]
    found["cuda"] += _ldconfig("libcuda.so.1")
    return {k: sorted({os.path.realpath(p) for p in v}) for k, v in found.items()}


def family_of_mapping(path: str) -> str | None:
    base = os.path.basename(path)
    for name, family in FAMILIES.items():
        if base.startswith(family.library):
            return name
    return None


# Run by the command's interpreter with -S, so that no .pth file or sitecustomize of the
# target's environment runs. -S also skips site's venv step, which on Python 3.11 and older
# is what points sys.prefix at a virtual environment; site.venv() would do it but also
# processes the venv's .pth files, so this code does only its first part, as site.py does it:
# a pyvenv.cfg beside the executable or one level up makes the folder above the executable's
# sys.prefix (some getsitepackages(), Debian's, look at sys.prefix to tell a venv) and the
# first prefix searched. Its first line leaves only absolute folders on the path, with
# builtins alone (under -S, 3.10 has not imported os yet): -c puts the working directory
# first, where an os.py or site.py would be what the imports below run.
_SITE_DIRS_CODE = """import sys; sys.path[:] = [p for p in sys.path if p.startswith("/")]
import os, site
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
prefixes = list(site.PREFIXES)
for folder in (exe_dir, os.path.dirname(exe_dir)):
    if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
        sys.prefix = sys.exec_prefix = os.path.dirname(exe_dir)
        prefixes.insert(0, sys.prefix)
        break
print("\\n".join(site.getsitepackages(prefixes) + [site.getusersitepackages()] + sys.path))
"""
_SITE_DIRS_TIMEOUT_S = 10
_SITE_DIRS_MAX_BYTES = 1 << 20  # a real answer is a few KiB


def _python_site_dirs(command_path: str | None, run_as: "RunAs | None" = None) -> list[str]:
    """site-packages of the command's interpreter (a virtual environment's too), when the
    command is a Python or a script whose #! line names one (torchrun: its libc10 is then
    probed before the start, not at the first re-read of the mappings), as that
    interpreter reports them (~20 ms).

    The interpreter is the user's program (their virtual environment's, or any file they
    named), so it runs as the command will: as `run_as` (the user sudo names) with the
    environment the command gets, never as root on their behalf (docs/SECURITY.md). Root
    only reads what it prints, at most _SITE_DIRS_MAX_BYTES within _SITE_DIRS_TIMEOUT_S:
    folders to look for libc10.so in, whose files are read as the target's libraries are."""
    from memprof.sources.cpython.frames import command_python  # record imports it anyway (source.py)
    python = command_python(command_path) if command_path else None
    if python is None:
        return []
    out = _bounded_output([python, "-S", "-c", _SITE_DIRS_CODE], run_as)
    return [line for line in out.splitlines() if line.endswith(("site-packages", "dist-packages"))]


def _as_command_user(run_as: "RunAs | None") -> dict:
    """subprocess arguments that run a program as the recorded command runs (see
    capture/target.py's child): `run_as`'s uid, gid and groups, HOME, USER and LOGNAME, and
    the environment memprof was given; no descriptor but the pipes (close_fds)."""
    env = own_env.for_commands(os.environ, run_as)
    if run_as is None:
        return {"env": env}
    return {"env": env, "user": run_as.uid, "group": run_as.gid, "extra_groups": list(run_as.groups)}


def _bounded_output(argv: list[str], run_as: "RunAs | None") -> str:
    """What `argv`, run as `run_as`, writes to stdout: "" when it cannot start, or prints
    more than _SITE_DIRS_MAX_BYTES, or runs past _SITE_DIRS_TIMEOUT_S (it is then killed)."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, close_fds=True, **_as_command_user(run_as))
    except (OSError, subprocess.SubprocessError):
        return ""
    deadline, chunks, size = time.monotonic() + _SITE_DIRS_TIMEOUT_S, [], 0
    with proc:
        fd = proc.stdout.fileno()
        while (left := deadline - time.monotonic()) > 0 and size <= _SITE_DIRS_MAX_BYTES:
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        complete = left > 0 and size <= _SITE_DIRS_MAX_BYTES
        try:  # it may close its output and go on running: the same deadline holds
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) if complete else 0)
        except subprocess.TimeoutExpired:
            complete = False
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    return b"".join(chunks).decode(errors="replace") if complete else ""


@functools.cache
def _loader_cache() -> tuple[str, ...]:
    """The loader cache's lines, as `ldconfig -p` prints them: read once per process (every
    recording asked it two or three times), from root's own /sbin/ldconfig by its full path,
    never one found on PATH."""
    try:
        out = subprocess.run(["/sbin/ldconfig", "-p"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=5, env={"LC_ALL": "C", "LANG": "C"}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(out.splitlines())


def _ldconfig(name: str) -> list[str]:
    return [line.split("=>")[-1].strip() for line in _loader_cache() if line.strip().startswith(name)]


def libc_paths() -> list[str]:
    """The C library of this machine (where the loader's cache names it)."""
    return sorted({os.path.realpath(p) for p in _ldconfig("libc.so.6")})


def is_native_library(path: str, prefix: str = "") -> bool:
    """libc itself; with an allocator prefix (je_, tc_), any library named for it too."""
    base = os.path.basename(path)
    if base.startswith("libc.so"):
        return not prefix
    return bool(prefix) and any(name in base for name in ("jemalloc", "tcmalloc", "mimalloc"))
