"""CPython frames: which interpreters memprof may walk, their struct offsets, and line tables."""
