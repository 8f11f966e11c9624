"""Requests per invocation on S3, counted as HTTP requests leave botocore (issue 16's
first target).

Three planes on one SeaweedFS, each with a store (and boto3 client) of its own, so that no
cache is shared: a producer submits N no-op invocations, a worker drains them, and a fresh
reader, a ``Dispatch`` that never submitted, reads every result (what another process pays).
Every request of the three is counted, retries and the worker's start-up and signs of life
included, and divided by N.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import lakeshore as dls
from bench.bodies import noop
from lakeshore.keys import new_id


class HttpCount:
    """Counts the HTTP requests of the S3 stores it watches, by S3 operation."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def watch(self, plane: Any) -> Any:
        plane.store.client.meta.events.register("before-send.s3", self._sent)
        return plane

    def _sent(self, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]  # before-send.s3.PutObject
        with self._lock:
            self.counts[op] += 1

    def reset(self) -> Counter[str]:
        with self._lock:
            seen, self.counts = self.counts, Counter()
        return seen


def requests_per_job(url: str, keyed: bool, n: int) -> dict[str, Any]:
    count = HttpCount()
    ns = f"rq{new_id().lower()[-8:]}"
    producer = count.watch(dls.Dispatch(url, ns=ns))
    f = producer.udf(noop)
    ids = [f.submit(x=i, _key=f"k{i}") if keyed else f.submit(x=i) for i in range(n)]
    submitted = count.reset()
    worker = count.watch(dls.Dispatch(url, ns=ns))
    worker.udf(noop)
    dls.run_worker(worker, isolation="thread", max_jobs=n)
    ran = count.reset()
    reader = count.watch(dls.Dispatch(url, ns=ns))  # never submitted: knows nothing
    assert [reader.result(i) for i in ids] == [i + 1 for i in range(n)]
    read = count.reset()
    total = submitted + ran + read
    return {
        "jobs": n,
        "total": sum(total.values()) / n,
        "submit": sum(submitted.values()) / n,
        "run": sum(ran.values()) / n,
        "read_by_another": sum(read.values()) / n,
        "by_operation": {op: c / n for op, c in sorted(total.items())},
    }
