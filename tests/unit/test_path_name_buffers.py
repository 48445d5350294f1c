"""Path-name buffers are counted, not recorded, only where names_cache is a slab cache of its
own (memprof/sources/ebpf/kmem.py, names_cache_is_its_own; bpf/kmem.bpf.c, scratch_cache):
merged by SLUB with the other caches of its size, allocations of block I/O and others would
carry its name."""
from __future__ import annotations

from memprof.sources.ebpf.kmem import names_cache_is_its_own


def test_names_cache_is_its_own_only_as_a_folder_of_its_own_in_sysfs(tmp_path):
    own, merged, unknown = tmp_path / "own", tmp_path / "merged", tmp_path / "unknown"
    (own / "names_cache").mkdir(parents=True)
    (merged / ":0004096").mkdir(parents=True)
    (merged / "names_cache").symlink_to(":0004096")  # SLUB's alias of a merged cache
    unknown.mkdir()  # no SLUB sysfs: it cannot tell
    assert [names_cache_is_its_own(str(p)) for p in (own, merged, unknown)] == [True, False, False]
