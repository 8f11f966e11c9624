"""Bodies and worker hooks for the SLURM example.

Workers import this module by name (``jobs``), so the directory that holds it must be on
``PYTHONPATH`` on every node; ``worker-array.sbatch`` adds the directory it was submitted
from, and allows its plain functions as bodies (``--allow 'jobs:*'``). The producer
(``submit_batch.py``) imports it too.

``simulate`` is the body: a random walk of ``steps`` steps from one seed, summarised by its
mean squared displacement. The step table it uses stands in for something expensive to
build (a model, a lookup table): ``load_model`` builds it once per process that runs
bodies, as the worker's ``--on-start`` hook, instead of once per attempt.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
from typing import Any

log = logging.getLogger("slurm_example")

QUEUE = "sim"
_MODEL: list[tuple[float, float]] | None = None


def load_model() -> None:
    """``--on-start`` hook: build the step table once per process that runs bodies."""
    global _MODEL
    started = time.monotonic()
    _MODEL = [(math.cos(a), math.sin(a)) for a in (2 * math.pi * i / 3600 for i in range(3600))]
    log.info("step table ready in %.3fs (pid %d)", time.monotonic() - started, os.getpid())


def note_job(record: Any) -> None:
    """``--before-job`` hook: one line at the top of every attempt's log."""
    log.info(
        "%s attempt %d on %s (pid %d)", record.id, record.attempt, socket.gethostname(), os.getpid()
    )


def unload_model() -> None:
    """``--on-stop`` hook: runs when a body process shuts down in order."""
    global _MODEL
    _MODEL = None


def _model() -> list[tuple[float, float]]:
    if _MODEL is None:  # a worker started without --on-start still works, only slower
        load_model()
    assert _MODEL is not None
    return _MODEL


def simulate(seed: int, steps: int = 200_000) -> dict[str, Any]:
    """A 2-D random walk of unit steps; returns its mean squared displacement."""
    table = _model()
    rng = random.Random(seed)
    x = y = 0.0
    total = 0.0
    for i in range(1, steps + 1):
        dx, dy = table[rng.randrange(len(table))]
        x += dx
        y += dy
        total += x * x + y * y
        if i % (steps // 4 or 1) == 0:
            print(f"seed {seed}: {i}/{steps} steps")
    msd = total / steps
    log.info("seed %d done: msd %.1f", seed, msd)
    return {"seed": seed, "steps": steps, "msd": round(msd, 3), "host": socket.gethostname()}
