"""The store contract (DESIGN §2), run on every tier: memory, local, moto (the default client,
which gives every request to boto3 under mock_aws), SeaweedFS on the default client, and
SeaweedFS with boto3 forced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lakeshore.errors import Conflict, InvalidArgument, LakeshoreError, NotFound
from lakeshore.store import CREATE, OVERWRITE, MemoryStore, Store, if_match
from tests.forwarding import AsyncDriven
from tests.tiers import ALL_TIERS, BOTO3_TIER, tier_store


@pytest.fixture(params=["blocking", "async"])
def verbs(request: pytest.FixtureRequest) -> str:
    """Which spelling of the verbs the suite drives: the blocking ones, or ``aget``,
    ``aput`` and ``anow`` (docs/store-contract.md#async-verbs), which keep the same contract."""
    return str(request.param)


@pytest.fixture(params=[*ALL_TIERS, BOTO3_TIER])
def store(request: pytest.FixtureRequest, tmp_path: Path, verbs: str) -> Iterator[Store]:
    """Every tier, and every S3 client, through either spelling of the verbs."""
    for s in tier_store(request, tmp_path):
        yield AsyncDriven(s) if verbs == "async" else s


@pytest.fixture(params=[*ALL_TIERS, BOTO3_TIER])
def blocking_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every tier and client, blocking verbs only: for the tests of ``list`` and
    ``delete_many``, which have no async spelling (a thousand puts of their setup through
    ``aput`` would check nothing the other tests do not)."""
    yield from tier_store(request, tmp_path)


def put_many(store: Store, keys: list[str], data: bytes) -> None:
    """The setup of a listing test: ``keys`` written, eight at a time."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, data), keys))


def test_get_missing_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as err:
        store.get("nothing/here")
    assert err.value.key == "nothing/here"
    assert isinstance(err.value, KeyError)  # callers may catch KeyError too
    assert " — " in str(err.value) and str(err.value).startswith("get nothing/here:")


def test_put_get_roundtrip_and_etags(store: Store) -> None:
    e1 = store.put("a/b", b"one")
    assert isinstance(e1, str) and e1
    assert store.get("a/b") == (b"one", e1)
    e2 = store.put("a/b", b"two", OVERWRITE)
    assert e2 != e1
    assert store.get("a/b") == (b"two", e2)


def test_binary_and_empty_payloads(store: Store) -> None:
    blob = bytes(range(256)) * 64
    store.put("bin", blob)
    assert store.get("bin")[0] == blob
    store.put("empty", b"")
    assert store.get("empty")[0] == b""
    store.put("view", memoryview(b"mv"))
    assert store.get("view")[0] == b"mv"


def test_create_only(store: Store) -> None:
    etag = store.put("k", b"first", CREATE)
    with pytest.raises(Conflict) as err:
        store.put("k", b"second", CREATE)
    assert err.value.key == "k"
    assert store.get("k") == (b"first", etag)


def test_if_match(store: Store) -> None:
    e1 = store.put("k", b"v1")
    e2 = store.put("k", b"v2", if_match(e1))
    assert store.get("k") == (b"v2", e2)
    with pytest.raises(Conflict):
        store.put("k", b"v3", if_match(e1))  # stale
    assert store.get("k") == (b"v2", e2)
    with pytest.raises(Conflict):
        store.put("missing", b"x", if_match(e2))  # If-Match on an absent key
    with pytest.raises(NotFound):
        store.get("missing")


@pytest.mark.slow
def test_delete_many_removes_every_key_in_batches_of_a_thousand(blocking_store: Store) -> None:
    store = blocking_store
    keys = [f"many/{i:05d}" for i in range(1003)]  # two S3 requests: 1000 and 3
    put_many(store, keys, b"x")
    store.put("many-kept", b"y")
    store.delete_many([*keys, "many/never-existed"])  # absent keys are not an error
    assert [i.key for i in store.list("many")] == ["many-kept"]
    store.delete_many([])
    with pytest.raises(InvalidArgument):
        store.delete_many(["many-kept", "bad//key"])  # checked first: nothing is deleted
    assert store.get("many-kept")[0] == b"y"


def test_delete(store: Store) -> None:
    store.delete("never-existed")  # absent is not an error
    store.delete("never-existed", if_match='"abc"')
    e1 = store.put("k", b"v1")
    e2 = store.put("k", b"v2")
    with pytest.raises(Conflict):
        store.delete("k", if_match=e1)
    assert store.get("k")[0] == b"v2"
    store.delete("k", if_match=e2)
    with pytest.raises(NotFound):
        store.get("k")
    store.put("plain", b"x")
    store.delete("plain")
    with pytest.raises(NotFound):
        store.get("plain")
    store.put("plain", b"again", CREATE)  # a deleted key can be created again
    assert store.get("plain")[0] == b"again"


# Keys whose byte order differs from a naive directory walk: '-' < '/' < '0' < 'a' < 'é'.
TRICKY = ["a", "a-c", "a/b", "a/b/c", "a/b0", "a0", "ab", "b", "é", "é/x"]


def test_list_order_prefix_and_start_after(store: Store, request: pytest.FixtureRequest) -> None:
    if "seaweedfs" in request.node.name:
        # SeaweedFS walks its directory tree: it lists "a/b" before "a-c" although '-' < '/'.
        # lakeshore's key layout never puts such siblings side by side (keys.py); the doctor's
        # "list order" check reports it. strict=True: if SeaweedFS ever sorts by bytes, we
        # learn it here and relax the documented caveat.
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="SeaweedFS lists in directory order")
        )
    for k in reversed(TRICKY):
        store.put(k, k.encode())
    assert [o.key for o in store.list()] == sorted(TRICKY)
    assert sorted(TRICKY) == sorted(TRICKY, key=lambda k: k.encode())  # code point = bytes
    assert [o.key for o in store.list("a/")] == ["a/b", "a/b/c", "a/b0"]
    assert [o.key for o in store.list("a/b")] == ["a/b", "a/b/c", "a/b0"]
    assert [o.key for o in store.list("a")] == ["a", "a-c", "a/b", "a/b/c", "a/b0", "a0", "ab"]
    assert [o.key for o in store.list("zzz")] == []
    assert [o.key for o in store.list(start_after="a/b")] == [
        "a/b/c",
        "a/b0",
        "a0",
        "ab",
        "b",
        "é",
        "é/x",
    ]
    assert [o.key for o in store.list("a/", start_after="a/b/c")] == ["a/b0"]
    assert [o.key for o in store.list("a/", start_after="0")] == ["a/b", "a/b/c", "a/b0"]
    assert [o.key for o in store.list("a/", start_after="b")] == []


def test_list_entries_carry_etag_size_and_time(store: Store) -> None:
    t0 = store.now()
    etag = store.put("x/one", b"12345")
    (info,) = list(store.list("x/"))
    assert (info.key, info.etag, info.size) == ("x/one", etag, 5)
    # last_modified is in the store's clock (S3 Date/LastModified have 1 s resolution)
    assert t0 - 2 <= info.last_modified <= store.now() + 2


@pytest.mark.slow
def test_list_paginates_past_one_page(blocking_store: Store) -> None:
    store = blocking_store
    n = 1050  # S3 pages hold 1000 keys
    put_many(store, [f"p/{i:05d}" for i in range(n)], b"")
    it = store.list("p/")
    first = next(it)  # lazily: the first entry comes before the rest is consumed
    assert first.key == "p/00000"
    rest = [o.key for o in it]
    assert rest == [f"p/{i:05d}" for i in range(1, n)]
    tail = [o.key for o in store.list("p/", start_after="p/00997")]
    assert tail == [f"p/{i:05d}" for i in range(998, n)]


@pytest.mark.parametrize(
    "keys",
    [
        ["x", "x.obj/y"],  # a local store's object file is named x.obj: no clash allowed
        ["p%2Eobj", "p.obj", "p%25", "p%", "q.obj/r.obj", "%2Eobj/%25"],
    ],
)
def test_unusual_segments_round_trip(store: Store, keys: list[str]) -> None:
    for k in keys:
        store.put(k, k.encode())
    for k in keys:
        assert store.get(k)[0] == k.encode()
    assert sorted(o.key for o in store.list()) == sorted(keys)


def test_object_and_prefix_share_a_name(store: Store) -> None:
    store.put("node", b"file")
    store.put("node/child", b"inside")
    assert store.get("node")[0] == b"file"
    assert store.get("node/child")[0] == b"inside"
    store.delete("node")
    assert [o.key for o in store.list("node")] == ["node/child"]


@pytest.mark.parametrize(
    "bad", ["", "/abs", "trail/", "a//b", "a/../b", "./a", "a/.", "nul\x00", "x" * 1025]
)
def test_invalid_keys_are_refused(store: Store, bad: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        store.put(bad, b"x")
    assert " — " in str(err.value)
    with pytest.raises(InvalidArgument):
        store.get(bad)
    with pytest.raises(InvalidArgument):
        store.delete(bad)


def test_non_bytes_data_is_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        store.put("k", "text")  # type: ignore[arg-type]


def test_clock_is_close_to_real_time(store: Store) -> None:
    now = store.now()
    assert isinstance(now, float)
    assert abs(now - time.time()) < 5  # every tier here runs on this machine


def test_errors_share_one_root(store: Store) -> None:
    with pytest.raises(LakeshoreError):
        store.get("absent")
    with pytest.raises(LakeshoreError):
        store.put("k", b"", CREATE)
        store.put("k", b"", CREATE)


def test_every_builtin_store_has_a_location_a_filesystem_reaches(store: Store) -> None:
    where = store.location()
    assert where is not None  # a store may have none; memory, local and S3 each have one
    url, options = where
    assert url.split("://")[0] in {"memory", "file", "s3"} and isinstance(options, dict)


def test_on_write_is_called_after_each_write_until_cancelled(store: Store) -> None:
    calls: list[int] = []
    cancel = store.on_write(lambda: calls.append(1))
    if cancel is None:  # a store other processes write to cannot see every write
        assert not isinstance(store, MemoryStore), "the memory store sees every write"
        return
    store.put("w", b"1")
    store.delete("w")
    assert len(calls) == 2, "a put and a delete each call the watcher once"
    cancel()
    cancel()  # cancelling twice is harmless
    store.put("w", b"3")
    assert len(calls) == 2, "a cancelled watcher is not called"


def test_a_watcher_that_fails_or_reads_the_store_spoils_nothing(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[str] = []

    def fails() -> None:
        raise RuntimeError("boom")

    def reads_and_leaves() -> None:
        heard.append(store.get("w")[0].decode())  # the write is done: its object is there
        cancel_reader()  # a watcher may cancel itself

    cancels = [store.on_write(fails), store.on_write(reads_and_leaves)]
    if cancels[0] is None:
        return  # a store that cannot see writes takes no watchers
    cancel_reader = cancels[1]
    assert cancel_reader is not None
    store.put("w", b"1")  # neither the failing watcher nor the reading one fails the write
    store.put("w", b"2")
    assert store.get("w")[0] == b"2" and heard == ["1"]
    assert "a watcher of" in caplog.text and "boom" in caplog.text

    def forget() -> None:
        heard.clear()

    again, twice = store.on_write(forget), store.on_write(forget)  # one function, twice
    assert again is not None and twice is not None
    again()
    again()  # cancels its own registration only, however often
    heard.append("x")
    store.put("w", b"3")
    assert heard == [], "the second registration of the same function still hears writes"
    for cancel in (cancels[0], twice):
        cancel()


def test_a_store_that_still_defines_the_old_hooks_is_refused() -> None:
    with pytest.raises(TypeError, match=r"files_location\(\).*location\(\)"):

        class Old(MemoryStore):
            def files_location(self) -> tuple[str, dict[str, object]]:
                return "memory://mine", {}

    with pytest.raises(TypeError, match=r"pause\(\).*on_write"):

        class Older(MemoryStore):
            def pause(self, seconds: float) -> None: ...
