"""Agent files as the recorder finds them: JSON lines in <recording>/agent/<pid>.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from memprof.sources.agent_reader.source import AgentSource


def agent_source_with(tmp_path: Path, pid: int, *records: dict) -> AgentSource:
    """An AgentSource of tmp_path/rec.memprof whose agent file for `pid` has `records`
    appended (one JSON line each; the folder is made on first use)."""
    folder = tmp_path / "rec.memprof" / "agent"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{pid}.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return AgentSource(tmp_path / "rec.memprof")
