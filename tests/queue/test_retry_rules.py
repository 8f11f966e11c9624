"""Retry rules per exception (docs/retries.md): ``retry_for``, ``no_retry_for``, subclasses,
names, ``dls.Permanent``, and a call's rule over its function's — on memory and a local
directory, with the body in the worker's thread and in a body process."""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import InvalidArgument
from lakeshore.model import lifecycle
from lakeshore.model.record import Blob, Record
from lakeshore.store import LocalStore, MemoryStore, Store
from tests import retry_jobs
from tests.tiers import make_plane
from tests.waiting import poll

ATTEMPTS = 3
VALUE = "ValueError"
BASE = "tests.retry_jobs.BaseProblem"

# (the function's rule, the call's rule, what the body raises) -> attempts it runs
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str, int]] = {
    "no rule: retried": ({}, {}, "value", ATTEMPTS),
    "retry_for misses: at once": ({"retry_for": [KeyError]}, {}, "value", 1),
    "retry_for matches: retried": ({"retry_for": [KeyError]}, {}, "key", ATTEMPTS),
    "no_retry_for matches: at once": ({"no_retry_for": ValueError}, {}, "value", 1),
    "no_retry_for misses: retried": ({"no_retry_for": ValueError}, {}, "key", ATTEMPTS),
    "a subclass matches its base": ({"retry_for": retry_jobs.BaseProblem}, {}, "sub", ATTEMPTS),
    "a base by name": ({"no_retry_for": BASE}, {}, "sub", 1),
    "a builtin by its builtins name": ({"no_retry_for": "builtins.KeyError"}, {}, "key", 1),
    "no_retry_for wins over retry_for": (
        {"retry_for": Exception, "no_retry_for": LookupError},
        {},
        "key",
        1,
    ),
    "the call's rule over the function's": (
        {"retry_for": KeyError},
        {"retry_for": VALUE},
        "value",
        ATTEMPTS,
    ),
    "an empty call rule lifts the function's": (
        {"retry_for": KeyError},
        {"retry_for": ()},
        "value",
        ATTEMPTS,
    ),
    "Permanent fails at once, whatever retry_for": ({"retry_for": Exception}, {}, "permanent", 1),
    "a Permanent subclass of the user's": ({}, {}, "bad_input", 1),
}


def drain(q: dls.Dispatch, ids: list[str], isolation: str) -> None:
    """Run a worker until every one of ``ids`` has finished."""
    stop = threading.Event()
    kwargs = {"isolation": isolation, "concurrency": 2, "stop": stop, "max_poll_s": 0.05}
    worker = threading.Thread(target=dls.run_worker, args=(q,), kwargs=kwargs, daemon=True)
    worker.start()
    try:
        poll(lambda: all(q.get(inv).terminal for inv in ids), 60, "every invocation finished")
    finally:
        stop.set()
        worker.join(30)


@pytest.fixture(params=["memory", "local"])
def rules_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else LocalStore(tmp_path / "store")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_each_exception_is_retried_as_its_rule_says(rules_store: Store, isolation: str) -> None:
    q = make_plane(rules_store, retry_backoff_s=0.0)
    ids = {}
    for name, (udf_rule, call_rule, kind, _) in CASES.items():
        f = q.udf(retry_jobs.raise_kind, queue=f"q{len(ids)}", max_attempts=ATTEMPTS, **udf_rule)
        ids[name] = f.submit(kind, **{f"_{k}": v for k, v in call_rule.items()})
    drain(q, list(ids.values()), isolation)
    got = {name: (q.get(inv).state, q.get(inv).attempt) for name, inv in ids.items()}
    assert got == {name: ("failed", case[3]) for name, case in CASES.items()}
    permanent = q.get(ids["Permanent fails at once, whatever retry_for"]).error
    assert permanent is not None
    assert permanent["type"] == "lakeshore.errors.Permanent"
    assert permanent["message"].startswith("bad input (from ValueError: invalid literal")
    assert 'int("x")' in permanent["traceback"]  # the cause's traceback is kept
    mine = q.get(ids["a Permanent subclass of the user's"]).error
    assert mine is not None and mine["type"] == "tests.retry_jobs.BadInput"


def test_a_retried_failure_succeeds_on_a_later_attempt_under_its_rule(
    rules_store: Store, tmp_path: Path
) -> None:
    q = make_plane(rules_store, retry_backoff_s=0.0)
    f = q.udf(retry_jobs.fail_n_times, retry_for=ValueError, max_attempts=3)
    inv = f.submit(str(tmp_path / "count"), 2)
    drain(q, [inv], "process")
    assert q.result(inv, timeout=0) == "ok" and q.get(inv).attempt == 3


def test_the_rule_is_written_into_the_record_as_names(rules_store: Store) -> None:
    q = make_plane(rules_store)
    f = q.udf(
        retry_jobs.raise_kind,
        retry_for=[retry_jobs.BaseProblem, "mypkg.errors.Flaky", KeyError],
        no_retry_for=retry_jobs.SubProblem,
        retry_backoff_cap_s=900,
        retry_jitter=0.25,
    )
    rec = q.get(f.submit("key"))
    assert rec.retry_for == (BASE, "mypkg.errors.Flaky", "KeyError")
    assert rec.no_retry_for == ("tests.retry_jobs.SubProblem",)
    assert (rec.retry_backoff_cap_s, rec.retry_jitter, rec.v) == (900.0, 0.25, 2)
    (mapped,) = f.map(["key"], _retry_for=KeyError, _retry_jitter=0)
    assert (q.get(mapped).retry_for, q.get(mapped).retry_jitter) == (("KeyError",), 0.0)
    plain = q.get(q.udf(retry_jobs.raise_kind, queue="plain").submit("key"))
    assert (plain.retry_for, plain.retry_backoff_cap_s, plain.retry_jitter, plain.v) == (
        (),
        300.0,
        0.0,
        1,
    )


@pytest.mark.parametrize(
    "options",
    [
        {"retry_for": int},  # not an exception
        {"retry_for": 3},
        {"no_retry_for": ["a b"]},
        {"retry_for": ["x" * 300]},
        {"retry_for": [f"m.E{i}" for i in range(33)]},
        {"retry_backoff_cap_s": 3601},
        {"retry_backoff_cap_s": -1},
        {"retry_backoff_s": float("nan")},
        {"retry_jitter": 1.5},
        {"retry_jitter": True},
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_written(options: dict[str, Any]) -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(InvalidArgument):
        q.udf(retry_jobs.raise_kind, **options)
    f = q.udf(retry_jobs.raise_kind)
    with pytest.raises(InvalidArgument):
        f.submit("key", **{f"_{k}": v for k, v in options.items()})
    with pytest.raises(InvalidArgument):
        f.map(["key"], **{f"_{k}": v for k, v in options.items()})
    assert not list(q.store.list(""))


def test_the_backoff_is_capped_and_jittered_within_its_bounds(
    rules_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = iter([0.0, 0.999999])  # the worker's draws, injected: none, then the most
    monkeypatch.setattr(random, "random", lambda: next(draws))
    q = make_plane(rules_store)
    f = q.udf(
        retry_jobs.raise_kind,
        max_attempts=5,
        retry_backoff_s=10.0,  # 10 s, then 20 s: both over the cap
        retry_backoff_cap_s=4.0,
        retry_jitter=0.5,
    )
    inv = f.submit("value")
    waits = []
    for _ in range(2):
        assert dls.run_worker(q, once=True, isolation="thread") == 1
        rec = q.get(inv)
        ended = rec.history[-1].ended_at
        assert rec.state == "queued" and ended is not None
        waits.append(rec.not_before - ended)
        ops, cur, etag = q.plane.locate(inv)
        ops.cas(cur.next_write(not_before=0.0), etag)  # due now: the next attempt runs
    assert waits[0] == pytest.approx(4.0)  # the cap, no jitter drawn
    assert waits[1] == pytest.approx(2.0, abs=1e-5)  # the cap less half of it


def test_backoff_bounds_for_any_draw() -> None:
    rec = Record(
        id="01J0000000000000000000000A",
        ns="default",
        queue="q",
        fn="m:f",
        args=Blob(inline=b""),
        attempt=3,
        retry_backoff_s=1.0,
        retry_backoff_cap_s=3.0,
        retry_jitter=0.4,
    )
    for draw in (0.0, 0.25, 0.5, 0.999, 1.0, -5.0, 7.0):
        wait = lifecycle.backoff_s(rec, draw)
        assert 3.0 * 0.6 - 1e-9 <= wait <= 3.0  # 1 * 2**2 = 4, capped at 3, less up to 40 %
    assert lifecycle.backoff_s(rec, 0.5) == pytest.approx(3.0 * 0.8)
    assert lifecycle.backoff_s(rec) == 3.0  # no draw, no jitter
    assert lifecycle.backoff_s(dataclasses.replace(rec, retry_jitter=0.0), 0.9) == 3.0
    # a cap of 0 retries at once; a long cap waits as long as the doubling says
    assert lifecycle.backoff_s(dataclasses.replace(rec, retry_backoff_cap_s=0.0)) == 0.0
    long = dataclasses.replace(rec, attempt=12, retry_backoff_cap_s=3600.0)
    assert lifecycle.backoff_s(long) == 2048.0
    # the reaper's requeue of an expired lease takes its draw too
    held = lifecycle.claim(dataclasses.replace(rec, max_attempts=9), "w", "t", now=100.0)
    expired = lifecycle.expire(held, now=200.0, draw=0.5)
    assert expired.state == "queued"
    assert expired.not_before - 200.0 == pytest.approx(3.0 * 0.8)


def test_a_nack_of_a_permanent_exception_fails_the_job_at_once() -> None:
    q = make_plane(MemoryStore())
    wq = dls.WorkQueue("jobs", q)
    inv = wq.submit({"n": 1}, max_attempts=5)
    job = wq.claim()
    assert job is not None and job.nack(retry_jobs.BadInput("no")) == "failed"
    rec = q.get(inv)
    assert rec.attempt == 1 and rec.error is not None
    assert rec.error["type"] == "tests.retry_jobs.BadInput"
    other = wq.submit({"n": 2}, max_attempts=5)
    job = wq.claim()
    assert job is not None and job.nack(ValueError("again")) == "queued"  # not permanent
    assert q.get(other).state == "queued"


def test_a_permanent_raised_in_the_upstream_working_block_fails_the_job_at_once() -> None:
    from dreamlake.lakeshore import Dispatch, SyncQueue

    dp = Dispatch(":memory:")
    sq = SyncQueue("jobs", dispatch=dp)
    inv = sq.submit({"n": 1})
    with pytest.raises(retry_jobs.BadInput), sq.working() as job:
        assert job is not None
        raise retry_jobs.BadInput("no")
    rec = dp.get(inv)
    assert (rec.state, rec.attempt) == ("failed", 1)
    other = sq.submit({"n": 2})
    with pytest.raises(ValueError), sq.working() as job:
        raise ValueError("not permanent")
    assert dp.get(other).state == "queued"  # any other exception: retried, as upstream's
