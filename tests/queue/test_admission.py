"""Admission held for every producer together: max_depth (reject and block), rate_limit,
deadline_cutoff_s, and the queue record itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.model.queue_config import parse_rate
from lakeshore.model.record import Record
from lakeshore.store import Store
from tests import jobs
from tests.tiers import make_plane, record_key

QUEUE = "adm"


def _url_env(store: Store) -> tuple[str, dict[str, str] | None]:
    if not store.url.startswith("s3://"):
        return store.url, None
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "lakeshore-test", "AWS_SECRET_ACCESS_KEY": "x"}
    return f"{store.url}?endpoint_url={store.client.meta.endpoint_url}", env  # type: ignore[attr-defined]


PRODUCER = (
    "import json, sys, lakeshore as dls; from tests.jobs import submit_loop;"
    "q = dls.Dispatch(sys.argv[1]);"
    "a = sys.argv;"
    "print(json.dumps(submit_loop(q, 'adm', int(a[2]), float(a[3]), float(a[4]))))"
)


def _produce(store: Store, producers: int, n: int = 0, seconds: float = 0.0) -> list[list[int]]:
    """Run producers (processes; threads on a memory store); each returns [accepted, rejected].
    Timed producers all start at the same moment, once every process is up."""
    start = time.time() + 2.0
    if store.url == ":memory:":
        out: list[list[int]] = []

        def run() -> None:
            q = dls.Dispatch(store.url, store=store)
            out.append(jobs.submit_loop(q, QUEUE, n, seconds, start))

        threads = [threading.Thread(target=run) for _ in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        return out
    url, env = _url_env(store)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, url, str(n), str(seconds), str(start)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(producers)
    ]
    results = []
    for p in procs:
        out_text, _ = p.communicate(timeout=900)
        assert p.returncode == 0
        results.append(json.loads(out_text))
    return results


def _live(q: Any) -> int:
    """Invocations of the queue that are queued or running, counted from their records
    (``<id>/record``, or the ticket of one nothing has moved yet)."""
    ops = q.plane.ops(QUEUE)
    ids = set()
    for info in q.store.list(ops.keys.base + "/"):
        if info.key.endswith("/record") or info.key.startswith(ops.keys.tickets_prefix):
            ids.add(info.key.split("/")[-2 if info.key.endswith("/record") else -1])
    count = 0
    for inv in ids:
        try:
            rec = Record.from_bytes(q.store.get(record_key(ops, inv))[0])
        except dls.NotFound:
            continue
        count += rec.state in ("queued", "running")
    return count


@pytest.mark.slow
def test_max_depth_reject_exact(atomic_plane: Any, report: list[str]) -> None:
    q = atomic_plane
    q.configure(QUEUE, max_depth=100, on_full="reject")
    results = _produce(q.store, producers=8, n=40)
    accepted = sum(r[0] for r in results)
    rejected = sum(r[1] for r in results)
    report.append(
        f"admission reject {q.store.url[:40]:<40} 8x40 submits: "
        f"{accepted} accepted, {rejected} rejected"
    )
    assert (accepted, rejected) == (100, 220)
    assert _live(q) == 100


@pytest.mark.slow
def test_max_depth_block_with_a_worker_draining(atomic_plane: Any, report: list[str]) -> None:
    q = atomic_plane
    q.configure(QUEUE, max_depth=100, on_full="block")
    stop = threading.Event()
    seen: list[int] = []

    def sample() -> None:
        while not stop.is_set():
            seen.append(_live(q))

    worker = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"queues": [QUEUE], "stop": stop, "max_poll_s": 0.05, "allow": ["tests.jobs:*"]},
    )
    sampler = threading.Thread(target=sample)
    worker.start()
    sampler.start()
    try:
        results = _produce(q.store, producers=8, n=40)
    finally:
        stop.set()
        worker.join(60)
        sampler.join(60)
    accepted = sum(r[0] for r in results)
    report.append(
        f"admission block  {q.store.url[:40]:<40} 8x40 submits: {accepted} accepted; "
        f"live max {max(seen)} over {len(seen)} samples"
    )
    assert accepted == 320 and sum(r[1] for r in results) == 0
    assert seen and max(seen) <= 100


def test_rate_limit_holds_across_producers(atomic_plane: Any, report: list[str]) -> None:
    """Four producer processes race 40 submits for 20 tokens a minute. Counted, not timed
    (the run may straddle two windows): no window holds more than 20 tokens, read back from
    the store; and a submit is refused only by a full window, so at least 20 go through."""
    q = atomic_plane
    q.configure(QUEUE, rate_limit="20/min", on_full="reject")
    results = _produce(q.store, producers=4, n=10)
    accepted, rejected = sum(r[0] for r in results), sum(r[1] for r in results)
    prefix = q.plane.ops(QUEUE).keys.rate_prefix
    windows = Counter(i.key[len(prefix) :].split("/")[0] for i in q.store.list(prefix))
    report.append(
        f"admission rate   {q.store.url[:40]:<40} 20/min, 4 producers x 10 submits: "
        f"{accepted} accepted in {len(windows)} window(s)"
    )
    assert accepted + rejected == 40
    assert sum(windows.values()) == accepted and max(windows.values()) <= 20
    assert accepted >= 20


def test_deadline_cutoff_means_the_body_never_runs(q: Any, tmp_path: Path) -> None:
    q.configure(QUEUE, deadline_cutoff_s=0.2)
    marker = tmp_path / "ran"
    inv = q.udf(queue=QUEUE)(jobs.once_marker).submit(str(marker))
    rec = q.get(inv)
    assert rec.deadline_at == pytest.approx(rec.submitted_at + 0.2)
    deadline = time.monotonic() + 10
    while q.store.now() <= rec.deadline_at and time.monotonic() < deadline:
        time.sleep(0.02)  # waiting out the cutoff itself is the point of this test
    dls.run_worker(q, queues=[QUEUE], idle_exit=0.2)
    with pytest.raises(dls.TimedOut, match="never started"):
        q.result(inv)
    assert not marker.exists()  # the body never ran
    override = q.udf(queue=QUEUE)(jobs.add_one).submit(1, _deadline_s=3600)
    dls.run_worker(q, queues=[QUEUE], once=True)
    assert q.result(override) == 2  # a per-submit deadline overrides the queue's


def test_keyed_resubmit_is_never_rejected(q: Any) -> None:
    q.configure(QUEUE, max_depth=1, on_full="reject")
    f = q.udf(queue=QUEUE)(jobs.add_one)
    first = f.submit(1, _key="only")
    with pytest.raises(dls.QueueFull) as err:
        f.submit(2)
    assert (err.value.reason, err.value.limit) == ("max_depth", 1)
    assert f.submit(1, _key="only") == first  # the queue is full, the resubmit still answers
    dls.run_worker(q, queues=[QUEUE], once=True)
    assert q.result(first) == 2
    assert f.submit(3)  # the finished invocation gave its slot back


def test_leaked_slot_is_repaired_by_a_worker_of_the_queue(
    plane: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakeshore.protocol.admission as adm
    import lakeshore.worker as worker

    q = plane
    q.configure(QUEUE, max_depth=1)
    ops = q.plane.ops(QUEUE)
    q.store.put(ops.keys.slot(0), b"01ARZ3NDEKTSV4RRFFQ69G5FAV x")  # a submitter died here
    monkeypatch.setattr(adm, "SLOT_REPAIR_AGE_S", -1.0)  # the slot looks old enough
    f = q.udf(queue=QUEUE)(jobs.add_one)
    with pytest.raises(dls.QueueFull):  # producers never read slots: they cannot judge it
        f.submit(1)
    monkeypatch.setattr(worker, "_SWEEP_EVERY_S", 0.0)  # the worker's sweep, at once
    assert dls.run_worker(q, queues=[QUEUE], idle_exit=0.05, isolation="thread") == 0
    assert list(q.store.list(ops.keys.slots_prefix)) == []
    assert f.submit(1)


def test_admission_objects_name_no_invocation_but_the_slot_its_holder(plane: Any) -> None:
    """Rate tokens hold a nonce; a slot names its holder for the workers' repair (the
    producer policy keeps producers from reading it: test_least_privilege.py)."""
    plane.configure(QUEUE, max_depth=3, rate_limit="10/h")
    f = plane.udf(queue=QUEUE)(jobs.add_one)
    ids = [f.submit(i) for i in range(2)]
    ops = plane.plane.ops(QUEUE)
    tokens = [plane.store.get(i.key)[0] for i in plane.store.list(ops.keys.rate_prefix)]
    assert len(tokens) == 2 and len(set(tokens)) == 2
    assert not any(inv.encode() in t for inv in ids for t in tokens)
    slots = [plane.store.get(i.key)[0] for i in plane.store.list(ops.keys.slots_prefix)]
    assert sorted(s.split(b" ")[0].decode() for s in slots) == sorted(ids)


def test_queue_record_validation_and_cas(atomic_plane: Any) -> None:
    q = atomic_plane  # concurrent CAS: only where conditional writes are atomic
    for bad in [{"max_depth": -1}, {"on_full": "drop"}, {"rate_limit": "10/x"}, {"nope": 1}]:
        with pytest.raises(dls.InvalidArgument):
            q.configure(QUEUE, **bad)
    assert q.queue_config(QUEUE).max_depth is None  # nothing was written
    assert parse_rate("600/min") == (600, 60) and parse_rate("5000/h") == (5000, 3600)
    fields = [
        ("max_depth", 7),
        ("rate_limit", "9/s"),
        ("deadline_cutoff_s", 30.0),
        ("timeout_s", 5.0),
    ]
    threads = [
        threading.Thread(target=q.configure, args=(QUEUE,), kwargs={k: v}) for k, v in fields
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    conf = q.queue_config(QUEUE)
    assert [getattr(conf, k) for k, _ in fields] == [v for _, v in fields]  # no field lost
    assert conf.provider is None and conf.rev == 4


def test_queue_defaults_apply_to_invocations(plane: Any) -> None:
    q = make_plane(plane.store)
    q.configure(QUEUE, max_attempts=1, timeout_s=9.0, lease_s=7.0)
    inv = q.udf(queue=QUEUE)(jobs.add_one).submit(1)
    rec = q.get(inv)
    assert (rec.max_attempts, rec.timeout_s, rec.lease_s) == (1, 9.0, 7.0)


def test_cli_queue_show_and_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lakeshore.cli import main

    url = f"file://{tmp_path}/s"
    create = ["queue", "set", "jobs", "max_depth=5", "on_full=block", "--create", "--url", url]
    assert main(create) == 0
    assert main(["queue", "set", "jobs", "rate_limit=600/min", "--url", url]) == 0
    capsys.readouterr()
    assert main(["queue", "show", "jobs", "--url", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    got = (data["max_depth"], data["on_full"], data["rate_limit"], data["rev"])
    assert got == (5, "block", "600/min", 2)
    assert main(["queue", "set", "jobs", "max_depth=none", "--url", url]) == 0
    assert dls.Dispatch(url).queue_config("jobs").max_depth is None
    assert main(["queue", "set", "jobs", "on_full=drop", "--url", url]) == 2
    assert "on_full must be one of" in capsys.readouterr().err


def test_old_rate_tokens_are_swept(plane: Any) -> None:
    from lakeshore.protocol.admission import acquire_rate, sweep_rate

    ops = plane.plane.ops(QUEUE)
    now = plane.store.now()
    assert isinstance(acquire_rate(ops, 5, 1, now), tuple)
    assert sweep_rate(ops, now, keep_s=3600) == 0  # recent: kept
    assert sweep_rate(ops, now + 7200, keep_s=3600) == 1
    assert list(plane.store.list(ops.keys.rate_prefix)) == []
