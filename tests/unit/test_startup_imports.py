"""What `record` imports before the recorded command starts (issue 24: start-up): pandas
costs ~0.2-0.3 s to import here and is needed only once events are decoded, so nothing on
the way to the command may import it: not the recorder's modules, not the decoder's
construction, not the recording package or its writer."""
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


def test_the_decoder_warms_pandas_when_asked():
    loaded = _modules_after("""
        from memprof.sources.ebpf.decode import MemoryDecoder
        MemoryDecoder.warm()
    """)
    assert "pandas" in loaded


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
