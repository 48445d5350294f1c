"""kallsyms' compact table (memprof/sources/symbols/kallsyms.py): the whole-file parse by
numpy reads every line as the line parser does, kallsyms' real text included and lines of
every odd shape (which it hands to the line parser); the table keeps names as one blob, not
a str each; its kept form, its lasting part and added programs round-trip."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

from memprof.sources.symbols.kallsyms import KernelSymbols

ODD_LINES = [
    "",                                           # blank
    "ffffffff81000000",                           # no type, no name
    "ffffffff81000000 T",                         # no name
    "ffffffff81000000 T ",                        # an empty name
    "ffffffff8100000g T bad_hex",                 # not hex
    "0xffffffff810000 T prefixed_hex",            # int(.., 16) takes a 0x prefix
    "81000000 T short_address",                   # 8 digits (a 32-bit kernel)
    "ffffffff81000000  T two_spaces",             # two spaces: no type column
    "ffffffff81000000 TT two_letter_type",
    "FFFFFFFF81000010 T upper_hex",
    "ffffffff81000020 t name with spaces",
    "ffffffff81000030 T in_module\t[mod_a]",
    "ffffffff81000040 T empty_module\t[]",
    "ffffffff81000050 T no_brackets\tmod_b",
    "ffffffff81000060 T half_bracket\t[mod_c",
    "ffffffff81000070 T bracket_inside\t[mo]d_d]",
    "ffffffff81000080 T double\t[[mod_e]]",
    "ffffffff81000090 T two_tabs\t[mod_f]\textra",
    "ffffffff810000a0 T long_module\t[" + "m" * 80 + "]",
    "ffffffff810000b0 T __pfx_padding",
    "ffffffff810000c0 T __pfx",                   # shorter than the prefix: a name
    "ffffffff810000d0 D data_symbol",
    "ffffffff810000e0 w weak_symbol",
    "ffffffff810000f0 W weak_global",
    "0000000000000000 T hidden_by_kptr_restrict",
    "ffffffff81000100 T ütf8_näme",
    "ffffffff81000110 T tab_no_module\t",
]


def _random_kallsyms(seed: int, lines: int) -> str:
    """kallsyms-like text: mostly the kernel's shape (aliases, modules in runs, other types),
    with the odd lines sprinkled in."""
    rng = random.Random(seed)
    out, address, module = [], 0xFFFFFFFF81000000, ""
    for i in range(lines):
        if rng.random() < 0.03:
            out.append(rng.choice(ODD_LINES))
            continue
        if rng.random() < 0.02:
            module = rng.choice(["", "", "nvidia", "ext4", "nfsd", "kvmx", "bpf", "__builtin__ftrace", "x" * 55])  # ext4, nfsd, kvmx: one width, told apart by their bytes
        if rng.random() > 0.05:  # else an alias at the same address
            address += rng.randrange(1, 0x400)
        kind = rng.choice("tTtTwWdDrRbB")
        name = rng.choice(["f", "do_thing", "__pfx_do_thing", "a.cold", "x" * 120]) + str(i)
        out.append(f"{address:016x} {kind} {name}" + (f"\t[{module}]" if module else ""))
    return "\n".join(out) + ("\n" if seed % 2 else "")  # with and without a last newline


def _same(a: KernelSymbols, b: KernelSymbols) -> None:
    assert np.array_equal(a.starts, b.starts)
    assert a.all_names() == b.all_names()
    assert a.all_modules() == b.all_modules()


@pytest.mark.parametrize("seed", range(6))
def test_the_whole_file_parse_reads_every_line_as_the_line_parser(seed):
    text = _random_kallsyms(seed, 4000)
    _same(KernelSymbols.from_text(text), KernelSymbols.from_lines(text.splitlines()))


def test_each_odd_line_alone_and_among_shaped_ones():
    for line in ODD_LINES:
        for text in (line, line + "\n", "ffffffff80000000 T first\n" + line + "\nffffffff8f000000 T last\n"):
            _same(KernelSymbols.from_text(text), KernelSymbols.from_lines(text.splitlines()))


def test_an_alias_takes_the_name_listed_first_whichever_parser_read_it():
    # the first is read by the line parser (8 digits would not be; it is 0x-prefixed), the second by numpy
    text = "0xffffffff81000000 T first_listed\nffffffff81000000 T second_listed\n"
    assert KernelSymbols.from_text(text).all_names() == ["first_listed"]


@pytest.mark.skipif(os.geteuid() != 0, reason="kallsyms' addresses read as 0 without root")
def test_the_real_kallsyms_reads_as_the_line_parser_reads_it():
    with open("/proc/kallsyms", "rb") as f:
        data = f.read()
    table = KernelSymbols.from_bytes(data)
    assert len(table) > 10_000
    _same(table, KernelSymbols.from_lines(data.decode().splitlines()))
    # compact: the names' bytes alone are kept, not kallsyms' whole text
    assert table._blob.nbytes < len(data) / 2


def test_kept_lasting_and_added_programs_round_trip():
    table = KernelSymbols.from_text(_random_kallsyms(7, 3000))
    lasting = table.lasting()
    assert not {"bpf", "__builtin__ftrace"} & set(lasting.all_modules())
    assert len(lasting) == sum(m not in ("bpf", "__builtin__ftrace") for m in table.all_modules())
    _same(KernelSymbols.from_kept(lasting.kept()), lasting)
    programs = [(0xFFFFFFFFC0DE0000, "bpf_prog_1_mp"), (int(lasting.starts[5]), "an_alias_listed_later")]
    added = lasting.with_symbols(programs, "bpf")
    frame = added.resolve([0xFFFFFFFFC0DE0040])[0]
    assert (frame.function, frame.module, frame.offset) == ("bpf_prog_1_mp", "bpf", 0x40)
    assert added.resolve([lasting.starts[5]])[0].function == lasting.name(5)  # the first listed keeps it
    assert len(added) == len(lasting) + 1


@pytest.mark.parametrize("broken", ["names", "module_ids", "modules"])
def test_kept_arrays_that_do_not_fit_together_are_refused(broken):
    kept = KernelSymbols.from_text(_random_kallsyms(3, 500)).kept()
    if broken == "names":
        kept["names"] = kept["names"][: len(kept["names"]) // 2]  # fewer names than starts
    elif broken == "module_ids":
        kept["module_ids"] = kept["module_ids"] + np.uint32(1000)
    else:
        kept["modules"] = np.frombuffer(b"\xff\xfe", dtype=np.uint8)  # not UTF-8
    assert KernelSymbols.from_kept(kept) is None


def test_an_empty_table_resolves_everything_unknown_and_keeps_empty():
    table = KernelSymbols.from_text("")
    assert len(table) == 0
    assert table.resolve([0xFFFFFFFF81000000])[0].function == "[unknown]"
    assert len(KernelSymbols.from_kept(table.kept())) == 0
