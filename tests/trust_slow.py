"""A module whose import takes as long as a test wants: it waits on ``tests.jobs.IMPORT_GATE``
before it defines its functions, so a worker can meet it in ``sys.modules`` half made."""

from __future__ import annotations

import lakeshore as dls
from tests import jobs

jobs.IMPORT_GATE.wait(60)


def body() -> str:
    return "plain"


@dls.udf
def stamp() -> str:
    return "decorated"
