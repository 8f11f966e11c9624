"""The ``slurm`` provider on the session's real SLURM cluster (slurmctld, slurmd and munge on
127.0.0.1): a scaler drains 300 jobs with at most 4 array tasks alive while a second scaler
started beside it launches nothing, and a worker whose SLURM job is cancelled mid-job hands
the job back for another worker to finish."""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.protocol.census import workers_seen
from lakeshore.providers import SlurmProvider
from tests import jobs
from tests.slurm import SlurmCluster
from tests.waiting import poll

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]


def _provider(cluster: SlurmCluster, logs: Path) -> SlurmProvider:
    env = cluster.environ()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return SlurmProvider(log_dir=logs, env=env)


def _scale_in_background(
    scaler: dls.Scaler, stop: threading.Event, start: threading.Barrier | None = None
) -> tuple[threading.Thread, list[Any]]:
    reports: list[Any] = []

    def run() -> None:
        if start is not None:
            start.wait()
        scaler.run(stop, reports.append)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, reports


def _plane(tmp_path: Path, cluster: SlurmCluster, **provider: Any) -> dls.Dispatch:
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    block = {"kind": "slurm", "partition": cluster.partition, "cooldown_s": 0, **provider}
    q.configure("hpc", provider=block)
    return q


def test_300_jobs_drain_through_at_most_4_array_tasks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    q = _plane(tmp_path, slurm_cluster, max_workers=4, jobs_per_worker=10, idle_exit_s=3)
    f = q.udf(jobs.add_one, queue="hpc")
    ids = [f.submit(i) for i in range(300)]
    watcher = _provider(slurm_cluster, tmp_path)
    scalers = [
        dls.Scaler(
            q, ["hpc"], _provider(slurm_cluster, tmp_path), allow=["tests.jobs:*"], interval_s=0.5
        )
        for _ in range(2)
    ]
    stop, start = threading.Event(), threading.Barrier(2)
    runs = [_scale_in_background(s, stop, start) for s in scalers]
    most, seen = 0, set()
    try:

        def drained() -> bool:
            nonlocal most
            alive = watcher.list(scalers[0].tags)
            seen.update(w.id for w in alive)
            most = max(most, len(alive))
            assert len(alive) <= 4, alive  # never more than the queue's maximum
            done = sum(q.status(i) == "succeeded" for i in ids[::10]) == 30
            return done and all(q.status(i) == "succeeded" for i in ids) and not alive

        poll(drained, timeout=200, what="300 jobs done and squeue empty again")
    finally:
        stop.set()
        for thread, _ in runs:
            thread.join(30)
    assert [q.result(i) for i in ids] == [i + 1 for i in range(300)]
    assert Counter(q.get(i).attempt for i in ids) == {1: 300}  # nothing ran twice
    tag = scalers[0].tags[0]
    assert tag.startswith("lakeshore:default:hpc:")
    assert slurm_cluster.run(["squeue", "--noheader", f"--name={tag}"]).stdout == ""
    launched = [sum(len(r.launched) for r in reports) for _, reports in runs]
    assert sorted(launched)[0] == 0, launched  # the second scaler launched nothing
    assert sorted(launched)[1] >= 1 and 1 <= most <= 4
    quiet = runs[launched.index(0)][1]
    assert quiet and all(not r.acting for r in quiet)
    assert not any(r.error for _, reports in runs for r in reports)
    # each worker is named after its array task, as squeue lists it
    names = {w.get("worker") for w in workers_seen(q.store, q.ns, q.store.now())}
    assert names and all(re.fullmatch(r"slurm-\d+_\d+", str(n)) for n in names), names
    assert len(names) <= sum(launched) and names & {f"slurm-{i}" for i in seen}


def test_a_cancelled_slurm_job_hands_its_job_back(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    q = _plane(tmp_path, slurm_cluster, max_workers=2, jobs_per_worker=1, idle_exit_s=3)
    q.configure("hpc", **{"provider.grace_s": 1})
    gate = tmp_path / "gate"
    inv = q.udf(jobs.wait_for_file, queue="hpc").submit(str(gate))
    provider = _provider(slurm_cluster, tmp_path)
    scaler = dls.Scaler(q, ["hpc"], provider, allow=["tests.jobs:*"], interval_s=0.3)
    stop = threading.Event()
    thread, reports = _scale_in_background(scaler, stop)
    try:
        first = poll(
            lambda: q.get(inv).state == "running" and q.get(inv).lease.worker,
            timeout=60,
            what="the job running on a SLURM worker",
        )
        assert first.startswith("slurm-")
        slurm_cluster.run(["scancel", first.removeprefix("slurm-")])  # plain: SIGTERM first

        def taken_over() -> str | None:
            rec = q.get(inv)
            lease = rec.lease
            if rec.state == "running" and lease is not None and lease.worker != first:
                return lease.worker
            return None

        second = poll(taken_over, timeout=90, what="another worker running the job")
        gate.touch()
        assert q.result(inv, timeout=60) == "done"
        rec = q.get(inv)
        assert rec.released == 1 and rec.attempt == 2  # handed back: the first did not count
        assert second.startswith("slurm-") and second != first
        poll(lambda: not provider.list(scaler.tags), timeout=60, what="the fleet gone")
    finally:
        gate.touch()
        stop.set()
        thread.join(30)
    assert sum(len(r.launched) for r in reports) == 2
    assert not any(r.error for r in reports)
