"""Which module: the agent's `modules` records (spans of nn.Module forwards) as boundary rows.

A record holds one outermost forward's module calls on one thread, as spans (path index,
enter_ns, exit_ns) in the order they began, and names the paths new to its process; the
names are kept here per process across polls (ModulePaths).

Representation on the timeline, chosen so that the recording needs no new table and the
timeline can match allocations with one pd.merge_asof per (pid, tid): each span gives two
`mark` rows on its thread (no layer), a *boundary*, whose `category` says which module runs
on that thread from then on:
- at enter_ns: schema.MODULE_PREFIX + the span's own path (one such row per call: what
  `report modules` counts calls by);
- at exit_ns: schema.MODULE_RETURN_PREFIX + the path of the span around it (its parent in
  time: the latest-begun span that contains it), or schema.MODULE_NONE for the outermost.
So an allocation between two sibling modules falls to their parent, as it should. Rows at
the same ns are ordered exits first (inner before outer), then enters (outer before inner),
so the last row at any ns says what runs after it. Two rows per module call: a training step
of a 100-module model adds 200 rows, a few kB in the recording.
"""
from __future__ import annotations

from memprof.model.schema import MODULE_NONE, MODULE_PREFIX, MODULE_RETURN_PREFIX

MAX_PATHS_PER_PROCESS = 1 << 16  # names kept per process; a record naming more is refused
MAX_PROCESSES = 4096


class UnknownPath(ValueError):
    """A span names a path index its process never named (or past the bounds above)."""


class ModulePaths:
    """Each process's path names ({pid: {index: path}}), as the records named them."""

    def __init__(self):
        self._names: dict[int, dict[int, str]] = {}

    def learn(self, pid: int, paths: dict[int, str]) -> dict[int, str]:
        """Add `paths` to `pid`'s names; returns them all. UnknownPath past the bounds."""
        names = self._names.get(pid)
        if names is None:
            if len(self._names) >= MAX_PROCESSES:
                raise UnknownPath("too many processes name modules")
            names = self._names[pid] = {}
        if len(names) + len(paths) > MAX_PATHS_PER_PROCESS and not paths.keys() <= names.keys():
            raise UnknownPath("too many module paths in one process")
        names.update(paths)
        return names


def boundaries(spans: list[tuple[int, int, int]], names: dict[int, str]) -> list[tuple[int, str]]:
    """(ts_ns, category) of the boundary rows of one record's `spans` (index, enter_ns,
    exit_ns; in the order they began, as lines.modules_fields checks), in row order (module
    docstring). Raises UnknownPath for an index `names` lacks."""
    rows = []  # (ts_ns, 0 exit | 1 enter, depth rank, category)
    around: list[tuple[int, str]] = []  # (exit_ns, path) of the spans containing the current one
    for index, enter, exit_ in spans:
        path = names.get(index)
        if path is None:
            raise UnknownPath(f"module path {index} was never named")
        while around and around[-1][0] < exit_:  # ended before this one ends: not around it
            around.pop()
        parent = MODULE_RETURN_PREFIX + around[-1][1] if around else MODULE_NONE
        depth = len(around)
        rows.append((enter, 1, depth, MODULE_PREFIX + path))
        rows.append((exit_, 0, -depth, parent))
        around.append((exit_, path))
    rows.sort(key=lambda row: row[:3])
    return [(ts, category) for ts, _, _, category in rows]
