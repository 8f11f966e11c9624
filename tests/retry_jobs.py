"""A body declared with its own retry rule, importable by reference
(``tests.retry_jobs:patient``) by the command line and by workers."""

from __future__ import annotations

import lakeshore as dls


@dls.udf(max_attempts=4, retry_for="TimeoutError", retry_backoff_cap_s=7)
def patient(x: int) -> int:
    return x
