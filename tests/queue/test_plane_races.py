"""Concurrency and crashes, on the tiers whose conditional writes are atomic (memory, local,
SeaweedFS): many workers, a SIGKILLed worker, cancel and timeout of running bodies, and a
stale worker whose late writes must be fenced out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import Conflict
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob
from lakeshore.protocol.claims import Claimer
from tests import jobs
from tests.tiers import date_clock_lease, make_plane
from tests.waiting import alive, poll


def test_many_workers_each_job_once(atomic_plane: Any, report: list[str]) -> None:
    q = atomic_plane
    m = 100
    f = q.udf(jobs.tracked)
    tag = f"w{id(q)}-"
    ids = [f.submit(f"{tag}{i}") for i in range(m)]
    t0 = time.monotonic()
    # each worker with a plane of its own, like separate processes: their claims race (one
    # plane would share one claim scheduler, whose slots never pick the same ticket)
    done: list[int] = []
    workers = [
        threading.Thread(
            target=lambda p: done.append(
                dls.run_worker(p, concurrency=2, idle_exit=1.0, allow=["tests.jobs:*"])
            ),
            args=(make_plane(q.store),),
        )
        for _ in range(3)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
    elapsed = time.monotonic() - t0
    results = [q.result(i, timeout=30) for i in ids]
    assert results == [f"{tag}{i}" for i in range(m)]
    assert all(q.get(i).attempt == 1 for i in ids)
    runs = [jobs.RUNS[f"{tag}{i}"] for i in range(m)]
    assert runs == [1] * m, "some invocation ran twice or never"
    assert len(done) == 3 and sum(done) == m  # the workers' own counts agree: none ran one twice
    assert max(jobs.MAX_LIVE[f"{tag}{i}"] for i in range(m)) == 1
    report.append(
        f"plane race {q.store.url[:40]:<40} 3 workers x 2 slots, {m} invocations: each once "
        f"({elapsed:.1f} s)"
    )


def test_worker_processes_share_a_directory(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url, retry_backoff_s=0.05)
    # each invocation marks its process, then waits until two processes have marked (else the
    # first process to start could drain the queue before the others are up)
    f = q.udf(jobs.once_marker_shared)
    marks = tmp_path / "marks"
    marks.mkdir()
    ids = [f.submit(str(marks / f"{i}")) for i in range(60)]
    code = (
        "import lakeshore as dls, sys;"
        "dls.run_worker(dls.Dispatch(sys.argv[1]), idle_exit=1.5, allow=['tests.jobs:*'])"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, url]) for _ in range(3)]
    for p in procs:
        assert p.wait(240) == 0
    assert [q.status(i) for i in ids] == ["succeeded"] * 60
    assert all(q.get(i).attempt == 1 for i in ids)
    pids = {(marks / f"{i}").read_text() for i in range(60)}
    assert len(pids) >= 2  # the work was really shared


def _process_url(store: Any) -> tuple[str, dict[str, str] | None]:
    """The URL (and environment) another process needs to open the same store."""
    if not store.url.startswith("s3://"):
        return store.url, None
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "lakeshore-test", "AWS_SECRET_ACCESS_KEY": "x"}
    return f"{store.url}?endpoint_url={store.client.meta.endpoint_url}", env


@pytest.mark.parametrize("tier", ["local", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def test_sigkill_mid_job_another_worker_finishes(
    tmp_path: Path, tier: str, request: pytest.FixtureRequest
) -> None:
    if tier == "local":
        store: Any = dls.open_store(f"file://{tmp_path}/plane")
    else:
        from tests.tiers import seaweed_store

        store = seaweed_store(request.getfixturevalue("seaweed"))
    url, env = _process_url(store)
    lease = date_clock_lease(store, 1.0)
    q = make_plane(store, lease_s=lease)
    marker = tmp_path / "started"
    inv = q.udf(jobs.slow_first_time).submit(str(marker), 60)
    code = (
        "import lakeshore as dls, sys;"
        f"q = dls.Dispatch(sys.argv[1], lease_s={lease});"
        "dls.run_worker(q, once=True, allow=['tests.jobs:*'])"
    )
    victim = subprocess.Popen([sys.executable, "-c", code, url], env=env)
    poll(marker.exists, 60, "the first attempt to start")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    assert q.status(inv) == "running"  # nobody knows yet
    dls.run_worker(q, max_jobs=1, idle_exit=30)  # reaps the expired lease, then runs attempt 2
    rec = q.get(inv)
    assert (rec.state, rec.attempt) == ("succeeded", 2)
    assert rec.error is None or rec.error["type"] == "LeaseExpired"
    assert q.result(inv) == os.getpid()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_cancel_running_stops_the_body(atomic_store: Any, tmp_path: Path, isolation: str) -> None:
    lease = date_clock_lease(atomic_store, 0.9)
    q = make_plane(atomic_store, lease_s=lease)
    fn = jobs.sleep_async if isolation == "thread" else jobs.touch_then_sleep
    f = q.udf(fn)
    started = tmp_path / "pid"
    inv = f.submit(30) if isolation == "thread" else f.submit(str(started), 30)
    done = threading.Event()
    t = threading.Thread(
        target=lambda: (dls.run_worker(q, once=True, isolation=isolation), done.set())
    )
    t.start()
    poll(
        lambda: q.status(inv) == "running" and (isolation == "thread" or started.exists()),
        30,
        "start",
    )
    t_cancel = time.monotonic()
    assert q.cancel(inv) is True
    assert done.wait(10), "the worker did not stop the body"
    stopped_after = time.monotonic() - t_cancel
    assert stopped_after < lease / 3 + 2.0  # one heartbeat plus slack for a loaded machine
    if isolation == "process":
        pid = int(started.read_text())
        poll(lambda: not alive(pid), 5, "the body's process to end")
    with pytest.raises(dls.Killed):
        q.result(inv)
    assert list(q.plane.ops("default").tickets()) == []  # the killed invocation left no ticket


def test_timeout_stops_a_sync_body(atomic_store: Any, tmp_path: Path) -> None:
    q = make_plane(atomic_store)
    started = tmp_path / "pid"
    inv = q.udf(jobs.touch_then_sleep, timeout_s=0.5).submit(str(started), 60)
    assert dls.run_worker(q, once=True) == 1  # auto isolation: a child process
    with pytest.raises(dls.TimedOut, match=r"timeout_s=0\.5"):
        q.result(inv)
    pid = int(started.read_text())
    poll(lambda: not alive(pid), 5, "the body's process to end")
    assert q.get(inv).attempt == 1  # a timeout is not retried


def test_stale_worker_is_fenced(atomic_plane: Any) -> None:
    q = atomic_plane
    inv = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    ops.cas(rec.next_write(lease_s=0.2), etag)
    a = Claimer(ops, "worker-a").claim(q.store.now())
    assert a is not None and a.record.attempt == 1
    poll(lambda: q.store.now() > a.record.lease.expires_at + 0.05, 10, "the lease to expire")
    assert Claimer(ops, "").reap(q.store.now()) == 1
    b = Claimer(ops, "worker-b")
    poll(lambda: b.claim(q.store.now()) is not None or q.status(inv) == "running", 10, "claim")
    b_rec = ops.read(inv)[0]
    assert b_rec.attempt == 2 and b_rec.lease.worker == "worker-b"  # type: ignore[union-attr]
    # worker A wakes up: its heartbeat and its late result are both refused
    with pytest.raises(Conflict):
        ops.heartbeat(a, q.store.now())
    late = lifecycle.succeed(a.record, a.token, Blob(inline=b"\x63"), q.store.now())
    with pytest.raises(Conflict):
        ops.finish(a, late)
    assert q.status(inv) == "running"
    assert ops.read(inv)[0].lease.worker == "worker-b"  # type: ignore[union-attr]
