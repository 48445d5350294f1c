"""`memprof report` sub-reports (report_attribution): filled in by the analysis issue."""
from memprof.cli.report import report  # noqa: F401
