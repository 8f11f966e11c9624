"""Crashes of real worker processes: SIGKILL at random points of the protocol, and a worker
frozen (SIGSTOP) for longer than its lease. Asserts: nothing lost, no invocation ever executed by
two bodies at once, a frozen worker wins nothing; reports recovery figures."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lakeshore as dls
from tests import jobs
from tests.waiting import alive, poll

ROOT = Path(__file__).resolve().parents[2]
ALLOW = ("--allow", "tests.jobs:*")  # the bodies of tests/jobs.py are plain functions


def worker(url: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LAKESHORE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "lakeshore", "worker", "--max-poll", "0.05", *ALLOW, *extra],
        env=env,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: signals reach its bodies too
    )


def executions(path: Path, killed_at: dict[int, float]) -> list[tuple[float, float]]:
    """(start, end) of each execution recorded in ``path``; a killed one ends at its kill."""
    spans: dict[int, list[float]] = {}
    order: list[int] = []
    for line in path.read_text().splitlines():
        kind, t, pgid = line.split()
        if kind == "start":
            spans[int(pgid)] = [float(t), killed_at.get(int(pgid), float("inf"))]
            order.append(int(pgid))
        else:
            spans[int(pgid)][1] = float(t)
    return [tuple(spans[p]) for p in order]  # type: ignore[misc]


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing(tmp_path: Path, report: list[str]) -> None:
    url = f"file://{tmp_path}/plane"
    lease = 2.0
    q = dls.Dispatch(url, lease_s=lease, retry_backoff_s=0.05, max_attempts=10)
    execs = tmp_path / "execs"
    execs.mkdir()
    rng = random.Random(20261130)
    names = [f"job{i:03d}" for i in range(60)]
    ids = [q.udf(jobs.logged_nap).submit(n, rng.uniform(0.1, 0.5), str(execs)) for n in names]
    killed_at: dict[int, float] = {}
    kills, t0 = 0, time.monotonic()
    while kills < 10:
        w = worker(url, "--concurrency", "3", "--isolation", "process", "--lease", str(lease))
        time.sleep(rng.uniform(0.8, 2.5))  # a random point of claim, body or acknowledgement
        killed_at[w.pid] = time.time()
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(30)
        kills += 1
    final = worker(url, "--concurrency", "3", "--isolation", "process", "--idle-exit", "5")
    try:
        final.wait(240)
    finally:
        if final.poll() is None:
            os.killpg(final.pid, signal.SIGKILL)
    elapsed = time.monotonic() - t0
    recs = [q.get(i) for i in ids]
    lost = [(r.id, r.state, r.attempt, r.error) for r in recs if r.state != "succeeded"]
    assert not lost, (lost, final.returncode)
    assert [q.result(i) for i in ids] == names
    overlaps = 0
    reruns = 0
    for n in names:
        spans = executions(execs / n, killed_at)
        reruns += len(spans) - 1
        for (_s1, e1), (s2, _e2) in itertools.pairwise(spans):
            overlaps += s2 < e1  # a later execution began before the earlier one ended
    assert overlaps == 0, "two executions of one invocation overlapped"
    interrupted = sum(1 for r in recs if r.attempt > 1)
    assert interrupted > 0  # the kills did land inside claims and bodies
    report.append(
        f"SIGKILL x{kills} at random points, 60 invocations: lost 0, concurrent executions 0, "
        f"{interrupted} invocations interrupted, {reruns} bodies re-executed; all done in "
        f"{elapsed:.0f} s (lease {lease:.0f} s)"
    )


def test_frozen_worker_wins_nothing(tmp_path: Path, report: list[str]) -> None:
    url = f"file://{tmp_path}/plane"
    lease = 2.0
    q = dls.Dispatch(url, lease_s=lease)
    gate = tmp_path / "gate"
    inv = q.udf(jobs.pid_after_file).submit(str(gate))
    frozen = worker(url, "--isolation", "process", "--lease", str(lease))
    pidfile = tmp_path / "gate.pid"
    try:
        poll(pidfile.exists, what="first body started")
        first_body = int(pidfile.read_text())
        os.killpg(frozen.pid, signal.SIGSTOP)  # the node freezes: worker and body
        stopped = time.monotonic()
        rec = q.get(inv)
        assert rec.lease is not None
        poll(lambda: q.store.now() > rec.lease.expires_at + 0.2, what="lease expired")  # type: ignore[union-attr]
        pidfile.unlink()
        stop = __import__("threading").Event()
        t = __import__("threading").Thread(
            target=dls.run_worker,
            args=(q,),
            kwargs={"stop": stop, "isolation": "thread", "max_poll_s": 0.05},
        )
        t.start()
        try:
            poll(pidfile.exists, what="second attempt started")
            took_over = time.monotonic() - stopped
            assert q.get(inv).attempt == 2
            os.killpg(frozen.pid, signal.SIGCONT)  # the zombie wakes up, still "holding" it
            poll(lambda: not alive(first_body), timeout=3 * lease, what="zombie body stopped")
            gate.write_text("go")
            assert q.result(inv, timeout=60) == os.getpid()  # attempt 2's body won
        finally:
            stop.set()
            t.join(60)
    finally:
        gate.write_text("go")
        os.killpg(frozen.pid, signal.SIGCONT)
        os.killpg(frozen.pid, signal.SIGTERM)
        frozen.wait(60)
    rec = q.get(inv)
    assert rec.state == "succeeded" and rec.attempt == 2
    # recovery is bounded by the lease, the reap interval (half a lease) and the idle poll
    assert took_over <= lease + lease / 2 + 1.0 + 2.0, took_over
    report.append(
        f"SIGSTOP beyond the lease ({lease:.0f} s): taken over after {took_over:.1f} s; "
        "on SIGCONT the zombie's body was stopped and its outcome fenced"
    )
