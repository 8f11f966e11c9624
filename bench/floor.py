"""The S3 floor of issue 16: the fewest requests a correct queue needs per invocation,
with raw boto3 against the same SeaweedFS, measured in the same run as lakeshore.

Per invocation, five requests: create the record (create-only PUT), GET it, claim it (PUT
with If-Match), write the result (PUT with If-Match), GET the result. Listings are amortised:
the drain lists the ready records one page of 1000 keys at a time, so a LIST costs 1/1000 of
a request per invocation. The workload has lakeshore's three phases (``bench/queue.py``):
submit all, drain, read every result; end to end is invocations over the sum of the three.

* :func:`serial`: one process, one thread (against lakeshore with 1 worker process);
* :func:`concurrent`: 2 processes x 8 threads, each process on its own half of the
  invocations (against lakeshore with 2 worker processes x 8 slots), started together at a
  set instant after their interpreters and clients are up;
* :func:`round_trip`: one invocation at a time through the whole sequence, plus the LIST an
  idle worker needs to find it (against lakeshore's submit → result with an idle worker).

The client CPU this process spends is reported too (``cpu_ms_per_job``): the floor's share of
the CPU target, boto3's own cost per request on this machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.seaweed_env import BUCKET
from lakeshore.keys import new_id
from tests.tiers import FAKE_CREDS

ROOT = Path(__file__).resolve().parent.parent
PAGE = 1000  # keys per LIST page: S3's maximum
# about the size of a lakeshore record of a no-op invocation in each state
QUEUED, RUNNING, DONE = b"q" * 400, b"r" * 450, b"s" * 480
REQUESTS_PER_JOB = 5  # plus 1/PAGE of a LIST


def client(endpoint: str) -> Any:
    """A boto3 client configured as ``S3Store`` configures its own (no retries by botocore,
    checksums only where required), so each request costs the same work on both sides."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            retries={"total_max_attempts": 1},
            max_pool_connections=32,
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
        **FAKE_CREDS,
    )


def _submit(c: Any, key: str) -> None:
    c.put_object(Bucket=BUCKET, Key=key, Body=QUEUED, IfNoneMatch="*")


def _run(c: Any, key: str) -> None:
    """Claim and complete one listed invocation: GET, If-Match PUT to running, If-Match PUT
    done."""
    got = c.get_object(Bucket=BUCKET, Key=key)
    got["Body"].read()
    etag = c.put_object(Bucket=BUCKET, Key=key, Body=RUNNING, IfMatch=got["ETag"])["ETag"]
    c.put_object(Bucket=BUCKET, Key=key, Body=DONE, IfMatch=etag)


def _read(c: Any, key: str) -> None:
    assert c.get_object(Bucket=BUCKET, Key=key)["Body"].read() == DONE


def _pages(c: Any, prefix: str) -> Any:
    """The ready keys under ``prefix``, one LIST per page of up to 1000."""
    kwargs: dict[str, Any] = {"Bucket": BUCKET, "Prefix": prefix, "MaxKeys": PAGE}
    while True:
        page = c.list_objects_v2(**kwargs)
        yield [o["Key"] for o in page.get("Contents", ())]
        if not page.get("IsTruncated"):
            return
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


def phases(c: Any, prefix: str, n: int, threads: int) -> dict[str, float]:
    """Submit ``n`` invocations under ``prefix``, drain them page by page, read every
    result; seconds of each phase and this process's CPU seconds."""
    keys = [f"{prefix}/{i:08d}" for i in range(n)]
    cpu0 = time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda k: _submit(c, k), keys))
        t1 = time.perf_counter()
        drained = 0
        for page in _pages(c, f"{prefix}/"):
            list(pool.map(lambda k: _run(c, k), page))
            drained += len(page)
        t2 = time.perf_counter()
        list(pool.map(lambda k: _read(c, k), keys))
        t3 = time.perf_counter()
    assert drained == n, (drained, n)
    return {
        "submit_s": t1 - t0,
        "drain_s": t2 - t1,
        "read_s": t3 - t2,
        "cpu_s": time.process_time() - cpu0,
    }


def _rates(n: int, p: dict[str, float]) -> dict[str, float]:
    return {
        "jobs": n,
        "requests_per_job": REQUESTS_PER_JOB + -(-n // PAGE) / n,
        "submit_per_s": n / p["submit_s"],
        "drain_per_s": n / p["drain_s"],
        "read_per_s": n / p["read_s"],
        "end_to_end_per_s": n / (p["submit_s"] + p["drain_s"] + p["read_s"]),
        "cpu_ms_per_job": 1000 * p["cpu_s"] / n,
    }


def serial(endpoint: str, n: int) -> dict[str, float]:
    c = client(endpoint)
    c.list_objects_v2(Bucket=BUCKET, MaxKeys=1)  # connection up, credentials resolved
    return _rates(n, phases(c, f"floor-{new_id()}", n, 1))


def _child(endpoint: str, prefix: str, n: int, threads: int, start_at: float) -> None:
    """One process of the concurrent floor: ready, then wait for the common start."""
    c = client(endpoint)
    c.list_objects_v2(Bucket=BUCKET, MaxKeys=1)
    time.sleep(max(0.0, start_at - time.time()))  # the processes start their work together
    began = time.time()
    p = phases(c, prefix, n, threads)
    print(json.dumps({**p, "began": began, "end": time.time()}))


def concurrent(endpoint: str, n: int, processes: int = 2, threads: int = 8) -> dict[str, float]:
    """Invocations per second of ``processes`` x ``threads`` running the floor, each process
    on its own prefix (no two claim the same invocation: a floor has no contention), timed from
    the common start to the last process's end."""
    prefix = f"floor-{new_id()}"
    per = n // processes
    start_at = time.time() + 4.0  # room for the interpreters and boto3 to load on 2 cores
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = (
        "import sys; from bench.floor import _child; "
        "_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))"
    )
    argv = [str(per), str(threads), str(start_at)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, endpoint, f"{prefix}/p{k}", *argv],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    outs = [json.loads(p.communicate(timeout=900)[0]) for p in procs]
    wall = max(o["end"] for o in outs) - min(o["began"] for o in outs)
    return {
        "jobs": per * processes,
        "processes": processes,
        "threads": threads,
        "end_to_end_per_s": per * processes / wall,
        "cpu_ms_per_job": 1000 * sum(o["cpu_s"] for o in outs) / (per * processes),
    }


def round_trip(endpoint: str, n: int = 60) -> dict[str, float]:
    """One invocation at a time: create, LIST (an idle worker finding it), GET, claim,
    complete, GET the result. p50/p99 with the LIST and without it (the five requests
    alone)."""
    c = client(endpoint)
    prefix = f"floor-rt-{new_id()}"
    whole, five = [], []
    last = ""
    for i in range(-5, n):  # five warm-up invocations, not timed
        key = f"{prefix}/{i + 5:08d}"
        t0 = time.perf_counter()
        _submit(c, key)
        t1 = time.perf_counter()
        kwargs = {"Bucket": BUCKET, "Prefix": f"{prefix}/", "MaxKeys": PAGE}
        listed = c.list_objects_v2(**kwargs, **({"StartAfter": last} if last else {}))
        t2 = time.perf_counter()
        assert [o["Key"] for o in listed.get("Contents", ())] == [key]
        _run(c, key)
        _read(c, key)
        t3 = time.perf_counter()
        last = key
        if i >= 0:
            whole.append(t3 - t0)
            five.append(t3 - t0 - (t2 - t1))
    whole.sort()
    five.sort()
    return {
        "p50_ms": 1000 * statistics.median(whole),
        "p99_ms": 1000 * whole[int(0.99 * (n - 1))],
        "p50_ms_without_list": 1000 * statistics.median(five),
    }
