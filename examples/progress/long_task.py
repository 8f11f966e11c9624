"""The body of the progress example: a long invocation that reports how far it got.

Workers import it by name (``long_task:crunch``), so this folder must be on their
``PYTHONPATH``, and allow it (``--allow 'long_task:*'``: it is a plain function). Only the
producer and the workers need it; ``watch.py`` does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

NS = "progress-example"  # the namespace of the example's invocations; watch.py defaults to it


def crunch(steps: int, pause: float) -> Iterator[dict[str, int]]:
    """Work through ``steps`` steps, yielding ``{"step": i, "of": steps}`` after each.

    Every yield becomes a frame of the invocation's stream, readable by its id from any
    process while the body runs; the last frame says ``step == of``.
    """
    for i in range(1, steps + 1):
        time.sleep(pause)  # stands in for a slice of real work
        yield {"step": i, "of": steps}
