"""Bulk retry (``q.retry_many``, ``lakeshore retry --queue``): the filter, two runs at once
rerun each invocation exactly once, and a run repeated does nothing."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.errors import InvalidArgument
from lakeshore.store import MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.commands import run
from tests.gating import WAIT_S, Gate
from tests.tiers import make_plane

N = 12


def _failed(q: dls.Dispatch, n: int = N, queue: str = "default") -> list[str]:
    """``n`` invocations that failed for good, one attempt each."""
    ids = q.udf(jobs.fail_always, queue=queue, max_attempts=1).map([f"m{i}" for i in range(n)])
    dls.run_worker(q, queues=[queue], isolation="thread", concurrency=4, idle_exit=0.3)
    assert {q.status(i) for i in ids} == {"failed"}
    return ids


def test_the_filter_selects_by_state_function_and_time(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    failed = _failed(q, 4)
    ok = q.udf(jobs.add_one).map(range(3))
    dls.run_worker(q, isolation="thread", concurrency=3, idle_exit=0.3)
    assert q.retry_many(dry_run=True) == sorted(failed)
    assert q.retry_many(state="succeeded", dry_run=True) == sorted(ok)
    assert q.retry_many(fn=jobs.fail_always, dry_run=True) == sorted(failed)
    assert q.retry_many(fn="tests.jobs:add_one", dry_run=True) == []
    later = datetime.now(UTC) + timedelta(hours=1)
    assert q.retry_many(since=later, dry_run=True) == []  # submitted before: not listed
    assert q.retry_many(until=0.0, dry_run=True) == []  # finished after: not selected
    assert {q.status(i) for i in failed} == {"failed"}  # a dry run writes nothing
    assert q.retry_many(fn=jobs.fail_always) == sorted(failed)
    assert {q.status(i) for i in failed} == {"queued"}
    assert {q.get(i).reruns for i in failed} == {1}


def test_a_run_repeated_with_its_until_does_nothing(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    ids = _failed(q)
    until = q.store.now()
    assert q.retry_many(until=until) == sorted(ids)
    assert q.retry_many(until=until) == []  # they are queued: nothing selected
    assert q.retry_many() == []  # nor without an until
    dls.run_worker(q, isolation="thread", concurrency=4, idle_exit=0.3)
    assert {q.status(i) for i in ids} == {"failed"}  # they failed again
    assert q.retry_many(until=until) == []  # after until: the same run selects none of them
    assert {q.get(i).reruns for i in ids} == {1}
    assert q.retry_many() == sorted(ids)  # a new run (until: now) takes them again
    assert {q.get(i).reruns for i in ids} == {2}


class _BothRead(Gate):
    """Holds every compare-and-swap of a record until ``readers`` runs have read all
    ``n`` records: the runs then race on the very same etags."""

    def __init__(self, inner: Store, n: int, readers: int = 2) -> None:
        super().__init__(inner)
        self.reads = 0
        self.need = n * readers
        self.read_all = threading.Event()
        self._lock = threading.Lock()

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        got = super().get(key, max_bytes)
        if key.endswith("/record"):
            with self._lock:
                self.reads += 1
                if self.reads >= self.need:
                    self.read_all.set()
        return got

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if key.endswith("/record") and mode.name == "if_match":
            assert self.read_all.wait(WAIT_S), "the runs never both read the records"
        return super().put(key, data, mode)


def test_two_runs_at_once_rerun_each_invocation_exactly_once(atomic_store: Store) -> None:
    ids = _failed(make_plane(atomic_store))
    racing = _BothRead(atomic_store, len(ids))
    q = make_plane(racing)
    until = q.store.now()
    results: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            results[name] = q.retry_many(until=until)
        except BaseException as e:
            errors.append(e)

    runs = [threading.Thread(target=one, args=(name,)) for name in ("a", "b")]
    for t in runs:
        t.start()
    for t in runs:
        t.join(WAIT_S)
    assert not errors and racing.read_all.is_set()
    a, b = set(results["a"]), set(results["b"])
    assert a | b == set(ids) and not a & b  # each rerun by exactly one of the runs
    assert {q.get(i).reruns for i in ids} == {1}
    assert {q.status(i) for i in ids} == {"queued"}
    # one ticket each, of the rerun's life: a worker runs each once more
    ops = q.plane.ops("default")
    assert len(list(q.store.list(ops.keys.tickets_prefix))) == len(ids)


def test_bad_selections_are_refused() -> None:
    q = make_plane(MemoryStore())
    for bad in (
        {"state": "queued"},
        {"state": "nope"},
        {"since": datetime(2025, 1, 1)},  # naive
        {"until": "yesterday"},
        {"since": float("nan")},
        {"fn": 3},
    ):
        with pytest.raises(InvalidArgument):
            q.retry_many(**bad)


def test_the_command_retries_a_queue_and_says_how_to_repeat_it(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    q = dls.Dispatch(url, retry_backoff_s=0.0)
    ids = _failed(q, 3)
    code, out, _ = run(capsys, "retry", "--queue", "default", "--dry-run", "--json")
    assert code == 0
    dry = json.loads(out)
    assert dry["retried"] == sorted(ids) and dry["dry_run"]
    code, out, _ = run(capsys, "retry", "--queue", "default", "--since", "1h")
    assert code == 0 and "3 queued again, 0 skipped, 0 errors" in out
    until = out.rsplit("--until ", 1)[1].split(" ")[0]
    dls.run_worker(q, isolation="thread", concurrency=3, idle_exit=0.3)
    assert {q.status(i) for i in ids} == {"failed"}
    code, out, _ = run(capsys, "retry", "--queue", "default", "--until", until, "--json")
    assert code == 0 and json.loads(out)["retried"] == []
    assert {q.get(i).reruns for i in ids} == {1}
    code, _, err = run(capsys, "retry", ids[0], "--queue", "default")
    assert code == 2 and "either an invocation id" in err
    code, _, err = run(capsys, "retry", "--queue", "default", "--since", "last tuesday")
    assert code == 2 and "neither an age nor an ISO time" in err
    code, _, err = run(capsys, "retry", "--queue", "default", "--state", "running")
    assert code == 2 and "not a finished state" in err
    code, out, _ = run(capsys, "retry", ids[0])  # the single form still works
    assert code == 0 and "attempt 3 is next" in out
