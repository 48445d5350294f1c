"""speedscope's file format (https://www.speedscope.app/file-format-schema.json): two
weighted "sampled" profiles — live bytes at the end and at each layer's peak — over one
shared frame table.

Render only: every number comes from two by-chain `analysis.attribution.Attribution`s. As in
folded stacks, each sample's outermost frame is its layer, so layers show side by side and are
never merged unnoticed (layers nest: their widths must not be added).
"""
from __future__ import annotations

from typing import Any

from memprof.analysis.attribution import Attribution
from memprof.report.labels import NO_STACK_FRAME, frame_label

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


def speedscope_file(profiles: list[tuple[str, Attribution]], chains: dict[int, list[dict]], *,
                    name: str, exporter: str) -> dict[str, Any]:
    """The file as a JSON-ready dict. `profiles` are (title, by-chain attribution) pairs;
    `chains` the frames of their stack ids, innermost first (leaks.chain_frames). Samples
    list frame indices outermost first; weights are live bytes (unit "bytes"); chains with
    no live bytes are left out."""
    frames = _FrameTable()
    rendered = [_profile(title, result, chains, frames) for title, result in profiles]
    return {"$schema": SCHEMA_URL, "shared": {"frames": frames.frames}, "profiles": rendered,
            "name": name, "activeProfileIndex": 0, "exporter": exporter}


class _FrameTable:
    """Frames deduplicated by what speedscope shows (name, file, line)."""

    def __init__(self):
        self.frames: list[dict[str, Any]] = []
        self._index: dict[tuple, int] = {}

    def index(self, frame: dict[str, Any]) -> int:
        key = (frame["name"], frame.get("file"), frame.get("line"))
        if key not in self._index:
            self._index[key] = len(self.frames)
            self.frames.append(frame)
        return self._index[key]


def _profile(title: str, result: Attribution, chains: dict[int, list[dict]], frames: _FrameTable) -> dict:
    samples, weights = [], []
    for layer in result.layers:
        for row in layer.rows:
            if row.live_bytes <= 0:
                continue
            stack = [] if row.stack_id is None else chains.get(row.stack_id, [])
            samples.append([frames.index({"name": layer.layer})] + _stack(stack, frames))
            weights.append(int(row.live_bytes))
    return {"type": "sampled", "name": title, "unit": "bytes", "startValue": 0, "endValue": sum(weights),
            "samples": samples, "weights": weights}


def _stack(chain: list[dict], frames: _FrameTable) -> list[int]:
    """Frame indices outermost first ([no stack] for a chain without frames)."""
    if not chain:
        return [frames.index({"name": NO_STACK_FRAME})]
    return [frames.index(_frame(frame)) for frame in reversed(chain)]


def _frame(frame: dict) -> dict[str, Any]:
    """A speedscope frame: the label reports use ('[py] step (train.py:42)'), and where known
    the file (a Python file, else the library) and line, so speedscope can link the source."""
    out: dict[str, Any] = {"name": frame_label(frame)}
    file = frame.get("file") or frame.get("module")
    if file:
        out["file"] = str(file)
    if frame.get("line") is not None:
        out["line"] = int(frame["line"])
    return out
