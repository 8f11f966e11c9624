"""Batch submit (``f.map`` / ``f.starmap``, issues 16 and 19): ids in input order, every call
runs, keys dedupe per call, partial failure reported with the ids that were submitted, a bad
batch writes nothing, the scope of the caller reaches every call, admission holds under the
pool's threads, and the progress line.

Failures are injected by a store wrapper that refuses one record by its content (not by
timing), so which call fails is fixed whatever order the pool's threads run in.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.batch import LOCAL_CONCURRENCY, REMOTE_CONCURRENCY, default_concurrency
from lakeshore.errors import StoreUnavailable
from lakeshore.store import LocalStore, MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.forwarding import Forwarding
from tests.tiers import make_plane


def _drain(q: Any, n: int) -> None:
    assert dls.run_worker(q, isolation="thread", concurrency=4, max_jobs=n, idle_exit=5) == n


def _objects(store: Store) -> list[str]:
    return sorted(i.key for i in store.list())


class Poison(Forwarding):
    """Delegates to ``inner``, except that a PUT whose bytes contain ``marker`` raises
    ``StoreUnavailable`` (the record of the call whose argument holds the marker)."""

    def __init__(self, inner: Store, marker: bytes) -> None:
        super().__init__(inner)
        self.marker = marker
        self.refused = 0
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if self.marker in data:
            with self._lock:
                self.refused += 1
            raise StoreUnavailable(f"put {key}", "injected failure", "none: a test")
        return self.inner.put(key, data, mode)


# -- order, running, keys ---------------------------------------------------------------------


def test_map_returns_ids_in_input_order_and_every_call_runs(atomic_plane: Any) -> None:
    q = atomic_plane
    f = q.udf(jobs.add_one)
    ids = f.map(range(40), concurrency=8)
    assert len(ids) == 40 and len(set(ids)) == 40
    # each id's record holds its own call: the order is the input's, not the threads'
    assert [q.get(i).fn for i in ids] == [f.ref] * 40
    _drain(q, 40)
    assert [q.result(i) for i in ids] == [x + 1 for x in range(40)]


def test_map_zips_iterables_starmap_takes_tuples_and_kwargs_are_shared(atomic_plane: Any) -> None:
    q = atomic_plane
    f = q.udf(jobs.echo)
    a = f.map([1, 2], iter("xy"), kwargs={"k": 0}, concurrency=2)
    b = f.starmap([(1,), [2, 3], ()], kwargs={"k": 1}, _priority=9)
    assert [q.get(i).priority for i in b] == [9, 9, 9]
    _drain(q, 5)
    assert [q.result(i) for i in a] == [
        {"args": (1, "x"), "kwargs": {"k": 0}},
        {"args": (2, "y"), "kwargs": {"k": 0}},
    ]
    assert [q.result(i)["args"] for i in b] == [(1,), (2, 3), ()]


def test_keys_dedupe_per_call_within_and_across_batches(atomic_plane: Any) -> None:
    q = atomic_plane
    f = q.udf(jobs.add_one)
    ids = f.map([1, 2, 1, 3], _keys=["a", "b", "a", None], concurrency=4)
    assert ids[0] == ids[2]
    assert len({ids[0], ids[1], ids[3]}) == 3
    again = f.map([1, 2, 7], _keys=lambda x: {1: "a", 2: "b"}.get(x), concurrency=4)
    assert again[:2] == ids[:2]  # the keyed calls are the invocations of the first batch
    assert again[2] not in ids
    _drain(q, 4)
    assert [q.result(i) for i in ids] == [2, 3, 2, 4]


def test_strict_key_shared_by_different_calls_raises_before_writing(store: Store) -> None:
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    before = _objects(store)
    with pytest.raises(dls.KeyReused) as e:
        f.map([1, 2], _keys=["same", "same"], _strict_key=True)
    assert e.value.index == 1 and e.value.key == "same"
    assert _objects(store) == before
    # the same call twice under one key is one invocation, strict or not
    ids = f.map([5, 5], _keys=["same", "same"], _strict_key=True)
    assert ids[0] == ids[1]


# -- partial failure and validation ----------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_partial_failure_attempts_every_call_and_reports_ids_in_order(
    atomic_store: Store, concurrency: int
) -> None:
    poison = Poison(atomic_store, b"poison")
    q = make_plane(poison)
    f = q.udf(jobs.echo)
    with pytest.raises(dls.MapFailed) as caught:
        f.map(["poison", "a", "b", "poison-too", "c"], concurrency=concurrency)
    e = caught.value
    assert e.ids[0] is None and e.ids[3] is None
    assert all(isinstance(i, str) for i in (e.ids[1], e.ids[2], e.ids[4]))
    assert sorted(e.errors) == [0, 3]
    assert all(isinstance(x, StoreUnavailable) for x in e.errors.values())
    assert e.submitted == 3 and poison.refused == 2
    assert "2 of 5 calls were not submitted (call 0: StoreUnavailable" in str(e)
    submitted = [i for i in e.ids if i is not None]
    _drain(q, 3)
    assert [q.result(i)["args"] for i in submitted] == [("a",), ("b",), ("c",)]


def test_failed_key_leader_fails_its_duplicates_too(atomic_store: Store) -> None:
    q = make_plane(Poison(atomic_store, b"poison"))
    f = q.udf(jobs.echo)
    with pytest.raises(dls.MapFailed) as caught:
        f.map(["poison", "a", "poison"], _keys=["k", None, "k"], concurrency=2)
    assert caught.value.ids[0] is None and caught.value.ids[2] is None
    assert sorted(caught.value.errors) == [0, 2]


@pytest.mark.parametrize(
    ("call", "index"),
    [
        (lambda f: f.map([1, 2, object()]), 2),  # cannot be sent
        (lambda f: f.starmap([(1,), (1, 2, 3)]), 1),  # does not fit the signature
        (lambda f: f.map([1, 2], _keys=["ok", ""]), 1),  # a bad key
    ],
)
def test_a_bad_call_anywhere_writes_nothing(store: Store, call: Any, index: int) -> None:
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    before = _objects(store)
    with pytest.raises(dls.InvalidArgument) as e:
        call(f)
    assert e.value.index == index
    assert f"call {index}:" in str(e.value) and "nothing was submitted" in str(e.value)
    assert _objects(store) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda f: f.map([1, 2], [1]),  # lengths differ
        lambda f: f.map(),  # no iterable
        lambda f: f.map("abc"),  # a str is one value, not three
        lambda f: f.map([1], _key="k"),  # one key for every call
        lambda f: f.map([1], _keys=["a", "b"]),  # a key per call, not more
        lambda f: f.map([1], _keys="k"),
        lambda f: f.map([1], _priority=10),
        lambda f: f.map([1], _bogus=1),
        lambda f: f.map([1], x=1),  # a keyword of the function, not of map
        lambda f: f.map([1], kwargs={"_priority": 1}),
        lambda f: f.map([1], concurrency=0),
        lambda f: f.map([1], progress="yes"),
        lambda f: f.starmap([1, 2]),  # items are not tuples
    ],
)
def test_bad_batches_raise_invalid_argument_and_write_nothing(store: Store, call: Any) -> None:
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    before = _objects(store)
    with pytest.raises(dls.InvalidArgument):
        call(f)
    assert _objects(store) == before


# -- threads ------------------------------------------------------------------------------------


def test_admission_holds_under_the_pool(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    q.configure("default", max_depth=12, on_full="reject")
    f = q.udf(jobs.add_one)
    with pytest.raises(dls.MapFailed) as caught:
        f.map(range(30), concurrency=8)
    e = caught.value
    assert e.submitted == 12  # the bound is exact with 8 threads racing for slots
    assert all(isinstance(x, dls.QueueFull) for x in e.errors.values())
    assert len(e.errors) == 18


def test_every_call_keeps_the_callers_scope(atomic_plane: Any) -> None:
    q = atomic_plane
    f = q.udf(jobs.add_one)
    with q.scope("runs/7"):
        ids = f.map(range(6), concurrency=3)
    assert {q.get(i).prefix for i in ids} == {"runs/7"}


def test_default_concurrency_by_store(tmp_path: Any) -> None:
    assert default_concurrency(MemoryStore()) == 1
    assert default_concurrency(LocalStore(tmp_path / "s")) == LOCAL_CONCURRENCY
    inner = MemoryStore()
    assert default_concurrency(Poison(inner, b"x")) == REMOTE_CONCURRENCY  # anything remote


# -- progress ---------------------------------------------------------------------------------


def test_progress_line_on_stderr_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    f.map(range(3))
    assert capsys.readouterr().err == ""
    f.map(range(3), progress=True)
    err = capsys.readouterr().err
    assert err.startswith(f"\rmap {f.ref}: 0/3 submitted")
    last = err.rsplit("\r", 1)[1]
    assert last.startswith(f"map {f.ref}: 3/3 submitted") and last.endswith("/s\n")


def test_progress_counts_failures(capsys: pytest.CaptureFixture[str]) -> None:
    q = make_plane(Poison(MemoryStore(), b"poison"))
    f = q.udf(jobs.echo)
    with pytest.raises(dls.MapFailed):
        f.map(["a", "poison"], progress=True, concurrency=2)
    last = capsys.readouterr().err.rsplit("\r", 1)[1]
    assert last.startswith(f"map {f.ref}: 1/2 submitted, 1 failed")
