"""``import dreamlake.lakeshore as dls``: the upstream SDK's spelling (dreamlake-lakeshore
0.5.0) over lakeshore, with a bucket, a directory or memory as the plane and no control
plane.

Upstream's names keep upstream's signatures and answers: ``SyncQueue``/``Queue`` (payloads,
claim, ack, nack), ``udf`` (a plain call of a queue-bound function submits and waits),
``thunk``, ``run``, ``scope``, ``run_worker(q)``, ``Topic``, ``lifecycle``. Every other
name of ``lakeshore`` is here too, unchanged. What only upstream's control plane can do is
accepted and inert (``RunConfig``) or refused with a one-line reason (``HttpDispatch``,
``Storage``, ``host_key``, ...). docs/migrating-from-dreamlake.md lists every name.
"""

from __future__ import annotations

from typing import Any

import lakeshore as _lakeshore
from dreamlake.lakeshore import lifecycle
from dreamlake.lakeshore.config import (
    DockerOptions,
    DreamRc,
    HttpDispatch,
    KubeOptions,
    Provider,
    RunConfig,
    Storage,
    TemporaryCredentials,
    host_key,
    load_config,
    placement_subset,
    resolve,
)
from dreamlake.lakeshore.context import RunContext, run, scope
from dreamlake.lakeshore.dispatch import Dispatch, DispatchError
from dreamlake.lakeshore.functions import UDF, Thunk, thunk, udf
from dreamlake.lakeshore.queues import Job, Queue, SyncQueue, Topic
from dreamlake.lakeshore.worker import run_worker

__version__ = _lakeshore.__version__


def __getattr__(name: str) -> Any:
    # every other public name of lakeshore, unchanged (errors, WorkQueue, Record, ...)
    if name in _lakeshore.__all__:
        return getattr(_lakeshore, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_lakeshore.__all__})


__all__ = [
    "UDF",
    "Dispatch",
    "DispatchError",
    "DockerOptions",
    "DreamRc",
    "HttpDispatch",
    "Job",
    "KubeOptions",
    "Provider",
    "Queue",
    "RunConfig",
    "RunContext",
    "Storage",
    "SyncQueue",
    "TemporaryCredentials",
    "Thunk",
    "Topic",
    "host_key",
    "lifecycle",
    "load_config",
    "placement_subset",
    "resolve",
    "run",
    "run_worker",
    "scope",
    "thunk",
    "udf",
]

# upstream's public names (its __all__), each defined in this package; and its error
UPSTREAM = [name for name in __all__ if name != "DispatchError"]
