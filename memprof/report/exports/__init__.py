"""memprof report exports (issue 7)."""
