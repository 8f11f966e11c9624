"""Garbage collection: exactly the expired invocations, every object of theirs, nothing else;
and `status`/`ls --state queued` cost that does not grow with finished history."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.cli import main
from lakeshore.protocol.census import queue_status
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect, parse_age
from lakeshore.store import MemoryStore, Store
from tests import jobs
from tests.tiers import make_plane


def all_keys(store: Store) -> set[str]:
    return {i.key for i in store.list("")}


def finish(q: Any, ids: list[str]) -> None:
    dls.run_worker(
        q,
        queues=q.plane.queues(),
        isolation="thread",
        max_jobs=len(ids),
        idle_exit=0.5,
        max_poll_s=0.02,
    )
    for i in ids:
        assert q.status(i) in ("succeeded", "failed")


def batch(q: Any, tag: str) -> list[str]:
    """Invocations with every kind of object: spilled args and result, a journal, logs,
    an idempotency key, a non-default queue (id index entry)."""
    ids = [
        q.udf(jobs.size_of).submit(b"x" * 200_000),  # spilled arguments
        q.udf(jobs.big).submit(300_000),  # spilled result
        q.udf(jobs.squares).submit(3),  # journal
        q.udf(jobs.chatty).submit(1),  # logs
        q.udf(jobs.add_one).submit(1, _key=f"key-{tag}"),  # idempotency key
        q.udf(queue="other")(jobs.add_one).submit(2),  # id index entry
        q.udf(jobs.fail_always).submit("no", _max_attempts=1),  # a failed one
    ]
    finish(q, ids)
    return ids


def test_gc_removes_exactly_the_expired_and_all_of_theirs(tmp_path: Path) -> None:
    q = make_plane(MemoryStore(), spill_bytes=1024)
    old = batch(q, "old")
    old_done = max(q.get(i).finished_at or 0 for i in old)
    # time passes; wait on the store's clock rather than sleeping a fixed amount
    deadline = time.monotonic() + 10
    while q.store.now() < old_done + 0.3 and time.monotonic() < deadline:
        time.sleep(0.02)
    new = batch(q, "new")
    live = q.udf(jobs.add_one).submit(3)  # queued, never collected
    now = q.store.now()
    older_than = now - (old_done + 0.15)  # the cutoff falls between the two batches
    before = all_keys(q.store)

    dry: dict[str, Any] = {}
    for name in ("default", "other"):
        dry[name] = collect(q.plane.ops(name), q.plane.settings, older_than, now, dry_run=True)
    assert sorted(dry["default"].expired + dry["other"].expired) == sorted(old)
    assert all_keys(q.store) == before  # a dry run removes nothing

    expected = {k for k in before if any(i in k for i in old)}
    expected.add(q.plane.ops("default").keys.idem("key-old"))
    assert set(dry["default"].objects) | set(dry["other"].objects) == expected

    for name in ("default", "other"):
        collect(q.plane.ops(name), q.plane.settings, older_than, now)
    after = all_keys(q.store)
    assert before - after == expected  # every object of the expired ones
    assert after == before - expected  # and nothing else
    for i in old:
        with pytest.raises(dls.NotFound):
            q.get(i)
    assert [q.status(i) for i in new][:4] == ["succeeded"] * 4 and q.status(live) == "queued"
    # a key freed by gc can be used again
    assert q.udf(jobs.add_one).submit(1, _key="key-old") not in old


def test_queue_retention_is_honoured(tmp_path: Path) -> None:
    q = make_plane(MemoryStore())
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    finish(q, ids)
    q.configure("default", result_retention_s=3600)
    now = q.store.now() + 60
    rep = collect(
        q.plane.ops("default"), q.plane.settings, 1.0, now
    )  # asks for 1 s, the queue keeps 1 h
    assert rep.expired == [] and rep.kept_by_retention == 3
    rep = collect(
        q.plane.ops("default"), q.plane.settings, None, now + 3600
    )  # the queue's own retention
    assert sorted(rep.expired) == sorted(ids)
    with pytest.raises(dls.InvalidArgument, match="no retention"):
        collect(q.plane.ops("other"), q.plane.settings, None, now)


def test_gc_cli_dry_run_lists_the_expired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path}/plane"
    monkeypatch.setenv("LAKESHORE_URL", url)
    q = dls.Dispatch(url)
    done = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    finish(q, done)
    live = q.udf(jobs.add_one).submit(9)
    assert main(["gc", "--older-than", "0s", "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data["queues"]["default"]["expired"]) == sorted(done)
    signs = list(q.store.list("lakeshore/default/_workers/"))
    assert len(signs) == 1  # the worker that ran the invocations
    assert main(["gc", "--older-than", "0s", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "removed 3 invocation(s)" in out and "removed 1 sign(s) of life" in out
    assert list(q.store.list("lakeshore/default/_workers/")) == []
    assert q.status(live) == "queued"
    with pytest.raises(dls.NotFound):
        q.get(done[0])


def test_parse_age() -> None:
    assert parse_age("7d") == 7 * 86400 and parse_age("90") == 90 and parse_age("1.5h") == 5400
    for bad in ("", "x", "-1d", "7y"):
        with pytest.raises(dls.InvalidArgument):
            parse_age(bad)


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.lists = 0
        self.gets = 0

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        self.lists += 1
        return super().list(prefix, start_after)

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.gets += 1
        return super().get(key, max_bytes)


def test_status_cost_stays_flat_as_history_grows() -> None:
    store = CountingStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)

    def cost() -> tuple[int, int]:
        store.lists = store.gets = 0
        queue_status(q.plane.ops("default"), q.store.now(), recent=10)
        return store.lists, store.gets

    finish(q, [f.submit(i) for i in range(20)])
    small = cost()
    finish(q, [f.submit(i) for i in range(300)])
    large = cost()
    assert large == small  # 15x the finished history, the same requests
    assert large[1] <= 10  # one GET per recent record, nothing for the rest


def test_status_counts_exactly_when_small_and_from_signs_of_life_when_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakeshore import codec
    from lakeshore.keys import worker_key
    from lakeshore.protocol import census

    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(6)]
    ops = q.plane.ops("default")
    w1 = Claimer(ops, "w1")
    held = [w1.claim(q.store.now()), w1.claim(q.store.now())]
    assert all(h is not None for h in held)
    q.cancel(ids[-1])  # never claimed: the cancel creates its record; claimers drop its ticket
    q.cancel(ids[-2])
    st = queue_status(ops, q.store.now(), recent=0)
    assert (st.queued, st.running, st.estimated) == (2, 2, False)  # the stale ones left out

    # past EXACT_UP_TO live tickets, running comes from the workers' signs of life
    monkeypatch.setattr(census, "EXACT_UP_TO", 3)
    life = {"worker": "w1", "seen_at": q.store.now(), "running_by_queue": {"default": 2}}
    q.store.put(worker_key(q.ns, "w1"), codec.encode(life))
    st = queue_status(ops, q.store.now(), recent=0)
    assert len(list(ops.tickets())) == 6  # 4 live, 2 stale
    assert st.estimated and st.running == 2 and st.queued == 6 - 2  # 6 tickets, 2 running
