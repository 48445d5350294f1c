"""meta.json's `interpreters` (memprof/sources/cpython/frames.py, PythonFrames.interpreter_notes): an
interpreter memprof supports but from whose processes no Python frame was read says so, as an
unsupported one does, so that the reports do not imply frames that are not there (issue 20,
point 16)."""
from __future__ import annotations

from memprof.analysis.loss import _python_notes
from memprof.sources.cpython.frames import PythonFrames

LIB = "/opt/python/lib/libpython3.10.so.1.0"


class _Map(dict):
    def items(self):
        return list(super().items())


def frames_with(tgids_with_frames: set[int]) -> PythonFrames:
    py = PythonFrames(bpf={"py_started": _Map()})
    py.notes[LIB] = {"frames": True, "version": "3.10.13"}
    py._runtime_of[41] = LIB
    py._with_frames |= tgids_with_frames
    return py


def test_a_supported_interpreter_that_gave_frames_is_noted_as_such():
    assert frames_with({41}).interpreter_notes() == {LIB: {"frames": True, "version": "3.10.13"}}


def test_a_supported_interpreter_that_gave_no_frames_says_so():
    note = frames_with(set()).interpreter_notes()[LIB]
    assert note["frames"] is False and note["supported"] is True
    assert "3.10.13 is supported, but no Python frames were read" in note["why"]


def test_the_reports_list_it_with_the_reason():
    notes = _python_notes("ebpf", {"interpreters": frames_with({99}).interpreter_notes()})
    assert any(f"no Python frames for {LIB}: CPython 3.10.13 is supported, but no Python frames" in n for n in notes), notes
