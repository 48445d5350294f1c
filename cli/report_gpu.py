"""`memprof report` sub-reports (report_gpu): filled in by the analysis issue."""
from memprof.cli.report import report  # noqa: F401
