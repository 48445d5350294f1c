"""What `record` imports (issue 24: start-up and size): pandas costs ~0.25 s of CPU and ~45 MB
to import here, and the recorder has no need of it: nothing on the way to the command may
import it (not the recorder's modules, not the decoder's construction, not the recording
package or its writer), and neither may decoding and writing events (the decoder's columns
are Arrow arrays built from buffers, recording/arrow_build.py: pyarrow's own conversions
import pandas; their sort and dictionary encoding import pyarrow.compute).
tests/integration/test_compiled_cache.py checks whole recordings."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def _modules_after(code: str) -> set[str]:
    """The names in sys.modules after `code` runs in a fresh interpreter."""
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_the_recorder_imports_no_pandas_before_the_command_starts():
    loaded = _modules_after("""
        import cli.record, cli.status, cli.console
        import memprof.capture.session, memprof.recording.writer, memprof.sources.ebpf.source
        from memprof.recording import RecordingWriter
        from memprof.sources.ebpf.decode import MemoryDecoder
        MemoryDecoder(lambda *columns: None)
    """)
    assert "memprof.capture.session" in loaded and "memprof.recording.writer" in loaded
    assert "pandas" not in loaded and "pyarrow.parquet" not in loaded
    assert "memprof.recording.reader" not in loaded and "memprof.capture.compactor" not in loaded
    # Nor numpy or pyarrow (memprof/lazy_import.py): `record` imports them itself, where it
    # chooses (cli/record.py); a whole recording's start: tests/integration/test_recorder_imports.py.
    assert "numpy" not in loaded and "pyarrow" not in loaded


def _events_appended(path) -> str:
    """Code that decodes three records and appends them to a new recording at `path`, as
    the recorder's polls do (a RecordingWriter named `writer` is left open)."""
    return f"""
import numpy as np
from pathlib import Path
from memprof.model import RecordingMeta
from memprof.recording import RecordingWriter
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.decode import MemoryDecoder
recs = np.zeros(3, dtype=R.EVENT_DTYPE)
recs["kind"] = [R.SLAB_ALLOC, R.SLAB_FREE, R.EXIT_MARK]
recs["size"], recs["ts_ns"] = [64, 0, 0], [1, 2, 3]
batch = MemoryDecoder(lambda k, u, p, c, py: k.astype(np.int64)).decode(recs)
writer = RecordingWriter(Path({str(path)!r}), RecordingMeta(command=["x"]))
writer.append("events", {{**batch.columns, "seq": range(3)}})
"""


def test_decoding_and_writing_events_and_chains_import_no_pandas(tmp_path):
    loaded = _modules_after(_events_appended(tmp_path / "r.memprof") + textwrap.dedent("""
        writer.append("frames", {"frame_id": [1, 2], "kind": ["kernel", "python"], "function": ["f", None],
                                 "module": ["vmlinux", None], "file": [None, "a.py"], "line": [None, 3]})
        writer.append("stacks", {"stack_id": [1], "depth": [0], "frame_id": [1]})
        writer.append("samples", {"ts_ns": [5], "metric": ["rss"], "device": [None], "value": [1.5]})
        writer.finalize(10)
    """))
    assert "memprof.recording.writer" in loaded and "pyarrow.parquet" in loaded
    assert "pandas" not in loaded
    # Nor the flush's sort of the events, or its dictionary columns (recording/arrow_build.py):
    # pyarrow.compute is ~11 MB of the recorder's RSS.
    assert "pyarrow.compute" not in loaded


def test_without_cloud_filesystems_parquet_is_written_and_no_s3_library_is_loaded(tmp_path):
    """`record` keeps pyarrow's cloud filesystems out (lazy_import.without_cloud_filesystems):
    Parquet is written and read as before, S3's library is not mapped, and asking for
    S3FileSystem says it is missing."""
    code = f"""
import sys
from memprof.lazy_import import without_cloud_filesystems
without_cloud_filesystems()
import pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({{"x": [1, 2]}}), {str(tmp_path / "t.parquet")!r})
assert pq.read_table({str(tmp_path / "t.parquet")!r}).column("x").to_pylist() == [1, 2]
try:
    from pyarrow.fs import S3FileSystem
    print("s3 importable")
except ImportError:
    print("s3 missing")
print("libarrow_s3" in open("/proc/self/maps").read())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["s3 missing", "False"]


def test_without_cloud_filesystems_changes_nothing_once_pyarrow_fs_is_imported():
    code = """
import pyarrow.fs
from memprof.lazy_import import without_cloud_filesystems
without_cloud_filesystems()
import sys
print(sys.modules.get("pyarrow._s3fs", "absent") is not None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True"


def test_the_recording_package_still_gives_every_name():
    loaded = _modules_after("""
        import memprof.recording as r
        assert set(r.__all__) == {"NOT_FINALIZED_NOTE", "Recording", "RecordingWriter", "TABLES",
                                  "find_latest_recording", "open_recording", "read_meta"}
        for name in r.__all__:
            getattr(r, name)
        from memprof.recording import open_recording, RecordingWriter  # noqa: F401
    """)
    assert "memprof.recording.reader" in loaded


def test_appending_a_polls_events_imports_no_pyarrow_compute(tmp_path):
    """The decoder's columns are of the schema's own types, so the writer's append casts
    nothing: Array.cast imports pyarrow.compute (~0.1 s, on the first poll after the command
    starts), which only the flush's sort needs, on its own thread."""
    loaded = _modules_after(_events_appended(tmp_path / "r.memprof"))
    assert "memprof.recording.writer" in loaded and "pyarrow.compute" not in loaded


def test_bccs_compile_begins_before_numpy_or_pyarrow_is_imported():
    """`record` builds its options and begins bcc's compile (sources/ebpf/early.py) before it
    imports the recorder: the program's text and flags, and the thread's start, import
    neither numpy (~70 ms here) nor pyarrow (~25-90 ms), so that a cold compile starts that
    much sooner. The flags' BTF answers are given here as the cache gives them (where
    nothing is kept, libbpf parses the BTF: test_btf checks that it imports no numpy either).
    (The thread itself lists the late
    families' programs once it runs, which imports both: begin is not called here.)"""
    loaded = _modules_after("""
        from memprof.sources.ebpf import btf_answers, early
        from memprof.sources.ebpf.options import EbpfOptions
        from memprof.sources.ebpf.kmem import KmemOptions
        from memprof.sources.cpython.options import PythonOptions
        from memprof.sources.ebpf.loading import program_source

        class Answers:  # a RememberedBtf whose every answer was kept
            def member_offset(self, struct, member):
                return 8
            def raw_tracepoint_params(self, tp):
                return ["void *", "unsigned long", "struct kmem_cache *", "bool"]

        btf_answers.kernel_btf = lambda: Answers()
        options = EbpfOptions(kmem=KmemOptions(), python=PythonOptions())
        program_source(options, options.enabled)
    """)
    assert "memprof.sources.ebpf.early" in loaded and "memprof.sources.ebpf.loading" in loaded
    assert "numpy" not in loaded and "pyarrow" not in loaded, sorted(m for m in loaded if m.split(".")[0] in ("numpy", "pyarrow"))[:5]


def test_the_model_names_its_enums_and_columns_without_pyarrow():
    """memprof.model's Arrow schemas are built at their first use (schema.__getattr__), so the
    recorder's modules that name only layers, actions or columns import no pyarrow; the
    plain column lists are the schemas' own names."""
    loaded = _modules_after("""
        from memprof.model import Action, Layer, RecordingMeta, EVENT_COLUMNS
        from memprof.model.schema import FRAME_KEYS, LAYERS
    """)
    assert "memprof.model.schema" in loaded and "pyarrow" not in loaded and "numpy" not in loaded
    from memprof.model import EVENT_COLUMNS, EVENTS_SCHEMA, FRAMES_SCHEMA, SAMPLES_SCHEMA, STACKS_SCHEMA
    from memprof.model import schema
    assert EVENTS_SCHEMA.names == EVENT_COLUMNS
    assert schema.FRAME_KEYS == tuple(name for name in FRAMES_SCHEMA.names if name != "frame_id")
    assert STACKS_SCHEMA.names == ["stack_id", "depth", "frame_id"] and "value" in SAMPLES_SCHEMA.names
    assert schema.EVENTS_SCHEMA is EVENTS_SCHEMA  # built once
