"""The process tree's programs (bpf/memprof.bpf.c, raw tracepoints) on the real kernel: a
forked child is followed, each process's exit is stamped, and the moment each began to exit
is marked with why: exit_group, a signal whose default action kills it, or not the signal
when the process handles it. (The kernel turns a fatal signal that dumps no core, SIGTERM's
default, into SIGKILL for the whole group before delivery, and notes the signal in the
group's group_exit_code: such a death reads "signal 15", where it read "signal 9" before
2026-12-07. SIGQUIT, which would dump a core, is delivered as
itself.) Raw tracepoints pass the kernel's own arguments, so the
child's pid and a signal's handler are read at BTF offsets: a wrong offset reads another
pid (the children are missing) or another word for the handler (a handled SIGTERM marked,
or a default one not)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Four subshells of one bash (forks, no exec: `kill` is a builtin), in turn: killed by
# SIGKILL, by SIGTERM's default action, by SIGQUIT's (no core: ulimit -c 0), and one that
# traps SIGQUIT and exits 7 from the trap. Then bash execs /bin/true, which exits 0.
SCRIPT = ("( kill -KILL $BASHPID ); "
          "( kill -TERM $BASHPID ); "
          "( ulimit -c 0; kill -QUIT $BASHPID ); "
          "( trap 'exit 7' QUIT; kill -QUIT $BASHPID; sleep 5 ); "
          "exec /bin/true")


@pytest.fixture(scope="module")
def meta(run_memprof, tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("tree")
    path = where / "tree.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", "bash", "-c", SCRIPT, cwd=where, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads((Path(path) / "meta.json").read_text())


def _children(meta: dict) -> tuple[int, list[dict]]:
    """(the root's pid, its forked children in the order they started)."""
    root = next(p for p in meta["processes"] if p["ppid"] is None)
    children = sorted((p for p in meta["processes"] if p["ppid"] == root["pid"]), key=lambda p: p["start_ns"])
    return root["pid"], children


def test_each_forked_child_is_followed_to_its_exit(meta):
    root, children = _children(meta)
    assert len(children) == 4, meta["processes"]
    assert all(c["exit_ns"] is not None and c["exit_ns"] > c["start_ns"] for c in children), children
    starts = [c["start_ns"] for c in children]
    assert starts == sorted(set(starts))


def test_why_each_process_began_to_exit(meta):
    root, children = _children(meta)
    reasons = {e["pid"]: e["reason"] for e in meta["exits"]}
    killed, terminated, quit_, trapped = (c["pid"] for c in children)
    assert reasons.get(killed) == "signal 9", meta["exits"]
    assert reasons.get(terminated) == "signal 15", meta["exits"]  # delivered as SIGKILL, noted as itself
    assert reasons.get(quit_) == "signal 3", meta["exits"]  # no handler: its default kills
    assert reasons.get(trapped) == "exit_group", meta["exits"]  # its handler ran: not the signal
    assert reasons.get(root) == "exit_group", meta["exits"]  # /bin/true, after the exec


def test_each_mark_comes_before_its_process_exit(meta):
    exits = {p["pid"]: p["exit_ns"] for p in meta["processes"]}
    for mark in meta["exits"]:
        assert exits.get(mark["pid"]) is not None and mark["ts_ns"] <= exits[mark["pid"]], (mark, exits)
