"""memprof report html (issue 7)."""
