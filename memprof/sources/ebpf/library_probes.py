"""Uprobes on user-space allocators: which libraries get them, and when.

Libraries found before the command starts (the command's Python environment, libc) are
probed then; others as the target maps them (dlopen, lazy loading: `probe_new_mappings`,
called whenever the process table sees new mappings). Which symbols of a library are
probed, and where (entry, return, call sites), is uprobes.py's and callsite.py's."""
from __future__ import annotations

import os
import time

from memprof.errors import NoPrivilegeError, SourceUnavailableError
from memprof.sources.cpython.frames import python_runtimes
from memprof.sources.ebpf import uprobes as U
from memprof.sources.ebpf.bpfload import load_program
from memprof.sources.symbols.files import HeldFiles, is_regular_file, split_process_root
from memprof.sources.symbols.symbolize import parse_maps, reachable, snapshot_maps

# When a library's probes were placed (meta.json sources.ebpf.detail.uprobes[path].placed):
# found by path (the command's Python environment, …), or mapped by a process record --pid attached to:
BEFORE_START = "before the command started"
ON_MAPPING = "when the target mapped it"       # seen in the target's mappings (dlopen, lazy loading)
# torch/lib files read ahead (SymbolPrewarm): where nearly every frame of a PyTorch chain lies.
_TORCH_SYMBOL_FILES = ("libc10.so", "libtorch_cpu.so", "libtorch_python.so")


def attach_place(bpf, path: str, symbol: str, place: U.Place, program: str | None = None) -> None:
    """Attach one uprobe (or uretprobe) of `symbol` in `path`, running `place.program`, or
    `program` instead (bench/train_overhead.py attaches an empty one in the same places)."""
    fn_name = program or place.program
    if place.kind == U.RETURN:
        bpf.attach_uretprobe(name=path, sym=symbol, fn_name=fn_name)
    else:
        bpf.attach_uprobe(name=path, sym=symbol, sym_off=place.offset, fn_name=fn_name)


def enabled_families(options) -> dict[str, U.Family]:
    """The user-space families `options` (an EbpfOptions) enables, by name."""
    fams = {name: fam for name, fam in U.FAMILIES.items() if name in options.families}
    if "native" in options.families:
        fams["native"] = U.preload_family() if options.native_preload else U.native_family(options.allocator_prefix)
    return fams


def known_libraries(options, command_path: str | None, run_as=None) -> dict[str, list[str]]:
    """Family name -> the library files we can find before the command starts (`run_as`:
    whom the command runs as, a capture.target.RunAs, None for memprof's own user)."""
    known = U.find_known_libraries(command_path, run_as=run_as)
    if "native" in options.families:
        known["native"] = [options.native_preload] if options.native_preload else U.libc_paths()
    return known


def prewarm_paths(known: dict[str, list[str]], command_path: str | None, attached: list[list]) -> list[str]:
    """The files whose symbols nearly every chain of a PyTorch job needs: torch's main
    libraries (beside each libc10 found, or mapped by a process attached to: `attached`
    holds each one's current_maps), the Python runtime (the command's, or the one such a
    process maps), and libc."""
    paths = [os.path.join(os.path.dirname(libc10), name)
             for libc10 in known.get("torch", []) for name in _TORCH_SYMBOL_FILES]
    paths += [m.file for maps in attached for m in maps if os.path.basename(m.path) in _TORCH_SYMBOL_FILES]
    paths += python_runtimes(command_path, attached)
    paths += U.libc_paths()
    return [p for p in dict.fromkeys(paths) if is_regular_file(p)]


class LibraryProbes:
    """The uprobes placed so far, per (library, family), and what meta.json says of them
    (`detail["uprobes"][path]`: family, layer, probes attached, required symbols missing,
    when placed, how allocators were probed, and programs the kernel refused)."""

    def __init__(self, bpf, options, detail: dict):
        self._bpf = bpf
        self._options = options
        self._detail = detail
        self._families = enabled_families(options)
        self.probed: set[tuple] = set()  # (library's (device, inode), family) with uprobes on
        self._asked: set[tuple[str, str]] = set()  # (path, family) that probe_library was given
        self._finalize_probes: set = set()  # paths asked, and (device, inode) of the files probed
        self._held = HeldFiles()  # what bcc is given to open (see files.HeldFiles)

    def attach_known(self, known: dict[str, list[str]]) -> None:
        """Probe the libraries found before the command starts."""
        for name, paths in known.items():
            if name in self._families:
                for path in paths:
                    self.probe_library(path, name, BEFORE_START)

    def attach_mapped(self, attached: list[list]) -> None:
        """Probe the libraries the processes record --pid attaches to map already (`attached`:
        each one's current_maps), before the recording begins: they were loaded before
        memprof came, and left to the first re-read of the mappings they went unprobed for
        its first ~0.1 s, with a note that blamed the loader."""
        for maps in attached:
            self.probe_new_mappings(maps, placed=BEFORE_START)

    def verify_programs_of_late_families(self) -> None:
        """Load (verify) now the programs of each enabled family none of whose libraries was
        found before the start, so that when one appears later (torch dlopens libcuda) it is
        probed with attach calls alone. Verifying the return program takes the kernel ~40-50 ms
        here (it reads Python frames); an allocation the target makes meanwhile is not seen.
        A refusal is left to the attach that needs the program, which reports it (mid-recording:
        in meta.json and the report's notes)."""
        if getattr(self._bpf, "loads_behind", False):
            return  # a cached object already loads them on a thread (early.py, CachedBPF.load_behind)
        probed = {family for _, family in self.probed}
        for name, family in self._families.items():
            if name in probed:
                continue
            for program in U.family_programs(family, self._options.alloc_probes):
                try:  # bcc keeps a loaded program for the attach
                    load_program(self._bpf, program, self._bpf.KPROBE, show_log=False)
                except SourceUnavailableError:
                    pass  # the attach that needs it loads it again, and shows why it is refused

    def probe_library(self, path: str, family_name: str, placed: str, mapped_ns: int | None = None) -> None:
        """Uprobes of one family on one library file (once). Missing optional symbols are
        skipped; a library lacking a required one is noted in meta.json, as is when the
        probes were placed (`placed`: BEFORE_START or ON_MAPPING). For ON_MAPPING it also
        records `placed_ns` (CLOCK_MONOTONIC, the recording's clock, once attached) and
        `mapped_ns` (the kernel's time of the executable mapping that made memprof look,
        None when a periodic re-read found it): the target's calls into the library between
        the two were not seen. `path` may be under /proc/PID/root (a process in a mount
        namespace of its own, see symbolize.reachable): the file probed is then the one
        that process maps, found as it finds it (files.locate). A file is probed once per
        family, whatever paths name it."""
        if (path, family_name) in self._asked:
            return
        self._asked.add((path, family_name))
        shown = path if split_process_root(path)[0] else os.path.realpath(path)  # meta.json's name for it
        held = self._held.hold(path)
        key = (shown if held is None else held.identity, family_name)
        if key in self.probed:
            return
        self.probed.add(key)
        family = self._families[family_name]
        libs = self._detail.setdefault("uprobes", {})
        if held is None:  # a FIFO or a device there (bcc's open would hang or open it), or nothing
            libs[shown] = {"family": family_name, "layer": family.layer.value, "probes": 0, "missing": [],
                           "placed": placed, "not_a_regular_file": True}
            return
        attached, missing_required, at_calls, refused = 0, [], {}, {}
        for probe in family.probes:
            try:
                how = self._attach_probe(held.bcc_path, probe)
                if how is not None:
                    at_calls[probe.symbol] = how
                attached += 1
            except SourceUnavailableError as e:  # the kernel refused the probe's program
                if placed == BEFORE_START:
                    raise  # at start-up: say so, before the command runs
                refused[probe.symbol] = str(e)  # mid-recording: keep recording, say which
            except Exception:  # bcc raises bare Exception for a symbol the file lacks
                if not probe.optional:
                    missing_required.append(probe.symbol)
        libs[shown] = {"family": family_name, "layer": family.layer.value, "probes": attached,
                       "missing": missing_required, "placed": placed}
        if placed == ON_MAPPING:
            libs[shown].update(mapped_ns=mapped_ns, placed_ns=time.monotonic_ns())
        if at_calls:
            libs[shown]["allocation_probes"] = at_calls
        if refused:
            libs[shown]["refused"] = refused

    def _attach_probe(self, path: str, probe: U.Probe) -> str | None:
        """Attach one probe where U.places() says, in the file `path` names (a HeldFiles path:
        places are read from the very file probed); returns how an allocator with a call-site
        alternative was probed, in words (None for the others)."""
        found, how = U.places(path, probe, self._options.alloc_probes)
        for place in found:
            load_program(self._bpf, place.program, self._bpf.KPROBE)  # typed error; bcc caches it for the attach
            attach_place(self._bpf, path, probe.symbol, place)
        return how

    def probe_new_mappings(self, maps, mapped_ns: int | None = None, placed: str = ON_MAPPING,
                           pythons: bool = True) -> None:
        """Probe the allocator libraries and (`pythons`) the Python runtimes among a process's
        mappings (`mapped_ns`: when the kernel reported the mapping that prompted this, if
        one did; `placed` as probe_library takes it). Each file is probed as the process
        finds it (Mapping.file: a container's own libc10, not root's file of that name)."""
        for m in maps:
            if not m.path or not m.path.startswith("/"):
                continue
            family = U.family_of_mapping(m.path)
            if family and family in self._families:
                self.probe_library(m.file, family, placed, mapped_ns)
            elif "native" in self._families and self._is_native_library(m.path):
                self.probe_library(m.file, "native", placed, mapped_ns)
        if pythons:
            self.probe_finalize_of({m.file for m in maps if m.path and _is_python(m.path)})

    def probe_finalize_of(self, runtimes) -> None:
        """Probe each Python runtime file of `runtimes` (a static build's executable, a shared
        build's libpython) at Py_FinalizeEx, once."""
        for path in runtimes:
            self._probe_finalize(path)

    def close_files(self) -> None:
        """Let go of the files held for bcc (files.HeldFiles), once the probes are detached:
        the kernel's uprobes hold their own reference to what they probe."""
        self._held.close()

    def _is_native_library(self, path: str) -> bool:
        """Where the native family's probes go: memprof's interposer when the command was given
        it (then libc itself is not probed: its calls reach the interposer first), else libc
        or the prefixed allocator."""
        if self._options.native_preload:
            return os.path.realpath(path) == os.path.realpath(self._options.native_preload)
        return U.is_native_library(path, self._options.allocator_prefix)

    def _probe_finalize(self, path: str) -> None:
        """Python targets: a uprobe on Py_FinalizeEx marks the start of interpreter teardown."""
        if path in self._finalize_probes:
            return
        self._finalize_probes.add(path)
        held = self._held.hold(path)
        if held is None or held.identity in self._finalize_probes:
            return  # not a regular file (bcc's open of a FIFO would hang the recorder), or probed
        self._finalize_probes.add(held.identity)
        try:
            self._bpf.attach_uprobe(name=held.bcc_path, sym="Py_FinalizeEx", fn_name="mp_py_finalize")
        except Exception:
            pass  # no such symbol in this file (e.g. python linked against libpython)


def _is_python(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith("libpython3") or (base.startswith("python3") and "." not in base.replace("python3.", "", 1))


def current_maps(pid: int) -> list:
    """A running process's mappings now, each file named as memprof reaches it (a container's
    under its /proc/PID/root: symbolize.reachable); [] when they cannot be read: it is then
    followed as any other, only without symbols read ahead."""
    try:
        text = snapshot_maps(pid)
    except NoPrivilegeError:
        return []
    return reachable(pid, parse_maps(text)) if text else []
