"""lakeshore: a task queue whose only server is object storage.

import lakeshore as dls

q = dls.Dispatch(":memory:")          # or "file:///dir", "s3://bucket/prefix"

@q.udf(queue="default")
def f(x):
    return x + 1

inv = f.submit(x=1)                   # a ULID string: the whole handle
dls.run_worker(q, once=True)          # drain one invocation
assert q.result(inv) == 2
"""

from __future__ import annotations

from lakeshore import run
from lakeshore.dispatch import DEFAULT_URL, Dispatch, default_plane, scope, udf
from lakeshore.errors import (
    Conflict,
    CorruptSegment,
    DecodeError,
    Failed,
    Fenced,
    HookFailed,
    IllegalTransition,
    InvalidArgument,
    JobError,
    KeyReused,
    Killed,
    LakeshoreError,
    MapFailed,
    NewerRecord,
    NotFinished,
    NotFound,
    Permanent,
    PermissionDenied,
    ProviderError,
    QueueFull,
    RecordError,
    StoreError,
    StoreUnavailable,
    TimedOut,
    TooLarge,
    TopicClosed,
    UnknownFunction,
    UnreturnedWrite,
)
from lakeshore.files.root import DataRoot
from lakeshore.model.provider import ProviderConfig
from lakeshore.model.queue_config import QueueConfig
from lakeshore.model.record import Record
from lakeshore.model.schedule import Schedule
from lakeshore.scaler import Scaler
from lakeshore.store import open_store
from lakeshore.streams.journal import Frame
from lakeshore.streams.topic import Topic
from lakeshore.udf import Udf
from lakeshore.work_queue import AsyncWorkQueue, Job, WorkQueue
from lakeshore.worker import run_worker

__version__ = "0.4.0"

__all__ = [
    "DEFAULT_URL",
    "AsyncWorkQueue",
    "Conflict",
    "CorruptSegment",
    "DataRoot",
    "DecodeError",
    "Dispatch",
    "Failed",
    "Fenced",
    "Frame",
    "HookFailed",
    "IllegalTransition",
    "InvalidArgument",
    "Job",
    "JobError",
    "KeyReused",
    "Killed",
    "LakeshoreError",
    "MapFailed",
    "NewerRecord",
    "NotFinished",
    "NotFound",
    "Permanent",
    "PermissionDenied",
    "ProviderConfig",
    "ProviderError",
    "QueueConfig",
    "QueueFull",
    "Record",
    "RecordError",
    "Scaler",
    "Schedule",
    "StoreError",
    "StoreUnavailable",
    "TimedOut",
    "TooLarge",
    "Topic",
    "TopicClosed",
    "Udf",
    "UnknownFunction",
    "UnreturnedWrite",
    "WorkQueue",
    "__version__",
    "default_plane",
    "open_store",
    "run",
    "run_worker",
    "scope",
    "udf",
]
