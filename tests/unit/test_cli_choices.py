"""The CLI spells the library's closed sets and defaults as literals, so `memprof --help`
imports no numpy, pandas or pyarrow. Each literal is pinned here to its one definition in
the library; a new click.Choice fails until it is pinned too."""
from __future__ import annotations

import subprocess
import sys

import click
import pytest

from memprof import preload
from memprof.analysis.attribution import BY_CHOICES
from memprof.analysis.chains import DEFAULT_NATIVE_FRAMES, NATIVE_FRAMES
from memprof.analysis.leaks import DEFAULT_MIN_AGE_NS
from memprof.analysis.overview import LEAK_BY
from memprof.cli import common, record
from memprof.cli.main import cli
from memprof.model.schema import LAYERS
from memprof.report.exports import FORMATS
from memprof.sources.ebpf.source import ALL_FAMILIES, DEFAULT_FAMILIES, EbpfOptions
from memprof.sources.ebpf.kmem import KmemOptions
from memprof.sources.ebpf.options import ALLOC_PROBES
from memprof.units import parse_duration

# (option, the library's closed set) for every click.Choice the CLI has.
LIBRARY_SETS = {
    "--layer": tuple(LAYERS),
    "--native-frames": NATIVE_FRAMES,
    "--by": BY_CHOICES,
    "--alloc-probes": ALLOC_PROBES,
    "--native-probes": preload.NATIVE_PROBES,
    ("report leaks", "--by"): LEAK_BY,
    ("export", "--format"): tuple(FORMATS),
    ("report html", "--format"): ("html", "json"),
    # The reading commands' --format: what cli.common.emit gives (a terminal rendering or JSON).
    "--format": common.REPORT_FORMATS,
}


def _commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path + " ")


def _choice_options():
    for path, command in _commands(cli):
        for param in command.params:
            if isinstance(param.type, click.Choice):
                yield path, max(param.opts, key=len), param


@pytest.mark.parametrize("path,option,param", list(_choice_options()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_choice_list_is_the_librarys(path, option, param):
    library = LIBRARY_SETS.get((path, option), LIBRARY_SETS.get(option))
    assert library is not None, f"memprof {path} {option}: pin its choices to the library's set in LIBRARY_SETS"
    assert tuple(param.type.choices) == tuple(library), f"memprof {path} {option}"


def test_the_walk_finds_the_choice_lists():
    found = {option for _, option, _ in _choice_options()}
    assert {"--layer", "--native-frames", "--by", "--alloc-probes", "--format"} <= found


def _option(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if name in p.opts)


def test_record_sources_are_the_ebpf_families():
    assert record.KNOWN_SOURCES == ALL_FAMILIES
    assert record.DEFAULT_SOURCES == DEFAULT_FAMILIES
    option = _option(record.record, "--sources")
    assert option.default is None  # the defaults, named by nobody: cuda left out without a driver
    assert option.show_default == ",".join(DEFAULT_FAMILIES)


def test_record_defaults_are_the_librarys():
    options, kmem = EbpfOptions(), KmemOptions()
    defaults = {name: _option(record.record, name).default
                for name in ("--alloc-probes", "--stack-every", "--page-stack-every", "--user-stack-every",
                             "--native-probes")}
    assert defaults == {"--alloc-probes": options.alloc_probes, "--native-probes": options.native_probes,
                        "--stack-every": kmem.slab_stack_every,
                        "--page-stack-every": kmem.page_stack_every, "--user-stack-every": options.user_stack_every}


def test_native_sampling_and_ring_buffer_defaults_are_the_librarys():
    from memprof.units import parse_size
    assert parse_size(_option(record.record, "--native-sample-bytes").default) == EbpfOptions().native_sample_bytes
    assert parse_size(_option(record.record, "--ring-buffer").default) == EbpfOptions().ringbuf_bytes
    assert parse_size(_option(record.record, "--kernel-sample-bytes").default) == EbpfOptions().kmem.sample_bytes == 0


def test_reading_commands_default_to_the_table():
    formats = [_option(command, "--format") for _, command in _commands(cli)
               if any("--format" in p.opts for p in command.params)]
    assert {f.default for f in formats if tuple(f.type.choices) == common.REPORT_FORMATS} == {"table"}


def test_min_age_and_native_frames_defaults_are_the_librarys():
    assert round(parse_duration(common.MIN_AGE_DEFAULT) * 1e9) == DEFAULT_MIN_AGE_NS
    for path, command in _commands(cli):
        for param in command.params:
            if "--min-age" in param.opts:
                assert param.default == common.MIN_AGE_DEFAULT, path
            if "--native-frames" in param.opts:
                assert param.default == DEFAULT_NATIVE_FRAMES, path


def test_help_imports_no_heavy_library():
    """Why the literals: `memprof --help` and `memprof report leaks --help` stay light."""
    code = ("import sys; from memprof.cli.main import cli\n"
            "try:\n    cli(['report', 'leaks', '--help'], prog_name='memprof')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
