"""`memprof report html`: filled in by issue 7."""
from memprof.cli.report import report  # noqa: F401
