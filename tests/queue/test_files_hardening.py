"""Issue 15, item 11: file publishes are fenced like every other write, and the local cache and
staging folder must be the user's own.

* A worker whose lease was taken over (or whose invocation was cancelled) while its body ran
  must not upload that body's files when the body returns: the next attempt's outputs stay.
  The take-over is done by hand while the body waits on a gate file, as a claimer that found
  the lease expired would do it (a lease of 600 s: no heartbeat notices it first).
* A cache folder that is a symlink, belongs to another user, or is writable by others is
  refused (or, when it is ours, its mode is fixed) before anything is staged or cached there.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.errors import StoreUnavailable
from lakeshore.files.context import RunContext
from lakeshore.files.root import data_root
from lakeshore.model import lifecycle
from lakeshore.store import MemoryStore, Store
from tests import jobs
from tests.tiers import make_plane
from tests.waiting import poll

# -- bodies (module level: a child process imports them by reference) -----------------------


def _wait_for(gate: str, timeout: float = 120.0) -> None:
    Path(gate + ".started").touch()
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(gate)
        time.sleep(0.02)


def stale_writer(gate: str) -> str:
    """Writes its output, then pauses (a long GC pause, a stopped VM) until the gate opens."""
    Path(dls.run.write("out.txt")).write_text("stale")
    _wait_for(gate)
    return "out.txt"


def stale_tiles(gate: str) -> Iterator[str]:
    """Publishes one tile, then pauses before the second."""
    Path(dls.run.write("tile-0.txt")).write_text("first")
    yield "tile-0.txt"
    Path(dls.run.write("tile-1.txt")).write_text("stale")
    _wait_for(gate)
    yield "tile-1.txt"


def writes_one(text: str) -> str:
    Path(dls.run.write("one.txt")).write_text(text)
    return "one.txt"


# -- helpers ------------------------------------------------------------------------------


def _plane(store: Store, tmp_path: Path, isolation: str) -> Any:
    options: dict[str, Any] = {"lease_s": 600.0, "cache_dir": str(tmp_path / "cache")}
    if isinstance(store, MemoryStore) and isolation == "process":
        options["data"] = str(tmp_path / "data")  # a child cannot see a memory:// root
    return make_plane(store, **options)


def _take_over(q: Any, inv: str) -> None:
    """What a claimer does once it judges the lease expired: requeue it, then claim it as
    the next attempt with its own token (here with a clock pushed past the lease)."""
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    assert rec.state == "running" and rec.lease is not None
    later = rec.lease.expires_at + 1.0
    queued = lifecycle.expire(rec, later)
    etag = ops.cas(queued, etag)
    ops.cas(lifecycle.claim(queued, "worker-b", "token-b", queued.not_before + 1.0), etag)


def _publish_as_next_attempt(q: Any, key: str, text: str) -> None:
    with q.scope("job"):
        Path(dls.run.write(key)).write_text(text)


def _read(q: Any, key: str) -> str | None:
    with q.scope("job"):
        try:
            return Path(dls.run.read(key)).read_text()
        except dls.NotFound:
            return None


def _start_worker(q: Any, isolation: str) -> tuple[threading.Thread, list[int]]:
    ran: list[int] = []
    t = threading.Thread(
        target=lambda: ran.append(dls.run_worker(q, once=True, isolation=isolation)),
        daemon=True,
    )
    t.start()
    return t, ran


def _staged(tmp_path: Path) -> list[Path]:
    staging = tmp_path / "cache" / "staging"
    return [p for p in staging.rglob("*") if p.is_file()] if staging.is_dir() else []


ISOLATIONS = ["thread", "process"]


# -- fenced publishes ---------------------------------------------------------------------


def _stale_writer_running(
    store: Store, tmp_path: Path, isolation: str, caplog: pytest.LogCaptureFixture
) -> tuple[Any, str, str, threading.Thread, list[int]]:
    """A worker running ``stale_writer``, paused at its gate with its file written."""
    q = _plane(store, tmp_path, isolation)
    gate = str(tmp_path / "gate")
    with q.scope("job"):
        inv = q.udf(stale_writer).submit(gate)
    caplog.set_level(logging.INFO, "lakeshore.worker")
    t, ran = _start_worker(q, isolation)
    poll(lambda: os.path.exists(gate + ".started"), 60, "the body to start")
    return q, gate, inv, t, ran


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_body_returning_after_its_lease_was_taken_over_publishes_nothing(
    atomic_store: Store, tmp_path: Path, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    q, gate, inv, t, ran = _stale_writer_running(atomic_store, tmp_path, isolation, caplog)
    _take_over(q, inv)
    _publish_as_next_attempt(q, "out.txt", "fresh")  # attempt 2's output
    Path(gate).touch()  # attempt 1 wakes up and returns its key
    t.join(60)
    assert ran == [1]
    assert _read(q, "out.txt") == "fresh", "the stale attempt overwrote the next one's output"
    rec = q.get(inv)
    assert (rec.state, rec.attempt, rec.lease.worker) == ("running", 2, "worker-b")
    assert "attempt 1 -> fenced" in caplog.text
    assert _staged(tmp_path) == []  # the unpublished file did not stay behind


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_body_returning_after_its_invocation_was_cancelled_publishes_nothing(
    atomic_store: Store, tmp_path: Path, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    q, gate, inv, t, ran = _stale_writer_running(atomic_store, tmp_path, isolation, caplog)
    assert q.cancel(inv) is True
    Path(gate).touch()
    t.join(60)
    assert ran == [1]
    assert _read(q, "out.txt") is None, "a cancelled attempt published its output"
    with pytest.raises(dls.Killed):
        q.result(inv)
    assert "attempt 1 -> killed" in caplog.text


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_generator_yielding_after_its_lease_was_taken_over_publishes_nothing_more(
    atomic_store: Store, tmp_path: Path, isolation: str
) -> None:
    q = _plane(atomic_store, tmp_path, isolation)
    gate = str(tmp_path / "gate")
    with q.scope("job"):
        inv = q.udf(stale_tiles).submit(gate)
    t, ran = _start_worker(q, isolation)
    poll(lambda: os.path.exists(gate + ".started"), 60, "the body to start")
    assert _read(q, "tile-0.txt") == "first"  # published at its yield, while the lease held
    _take_over(q, inv)
    _publish_as_next_attempt(q, "tile-1.txt", "fresh")
    Path(gate).touch()
    t.join(60)
    assert ran == [1]
    assert _read(q, "tile-1.txt") == "fresh"
    assert q.get(inv).lease.worker == "worker-b"


def test_a_publish_costs_one_fencing_heartbeat_per_batch(tmp_path: Path) -> None:
    """The fence is a heartbeat: one conditional write of the record per batch of files,
    which also gives the upload a whole lease ahead of it."""
    store = MemoryStore()
    q = make_plane(store, lease_s=600.0, cache_dir=str(tmp_path / "cache"))
    with q.scope("job"):
        inv = q.udf(writes_one).submit("hello")
        plain = q.udf(jobs.add_one).submit(1)
    writes: list[str] = []
    put = store.put

    def counting_put(key: str, data: bytes, *args: Any, **kw: Any) -> Any:
        if key.endswith("/record"):
            writes.append(key)
        return put(key, data, *args, **kw)

    store.put = counting_put  # type: ignore[method-assign]
    assert dls.run_worker(q, max_jobs=2, idle_exit=0, isolation="thread") == 2
    assert _read(q, "one.txt") == "hello"
    per_inv = {i: sum(1 for k in writes if i in k) for i in (inv, plain)}
    # claim, fence, outcome for the body that wrote a file; claim, outcome for the other
    assert per_inv == {inv: 3, plain: 2}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_fence_the_store_cannot_answer_publishes_nothing_and_retries(
    tmp_path: Path, isolation: str
) -> None:
    store = MemoryStore()
    q = _plane(store, tmp_path, isolation)
    with q.scope("job"):
        inv = q.udf(writes_one).submit("hello")
    put = store.put
    record_puts = [0]

    def flaky_put(key: str, data: bytes, *args: Any, **kw: Any) -> Any:
        if key.endswith("/record"):
            record_puts[0] += 1
            if record_puts[0] == 2:  # the claim passes; the fence finds the store down
                raise StoreUnavailable("put", "the store is down", "wait")
        return put(key, data, *args, **kw)

    store.put = flaky_put  # type: ignore[method-assign]
    assert dls.run_worker(q, once=True, isolation=isolation) == 1
    assert _read(q, "one.txt") is None
    rec = q.get(inv)
    assert rec.state == "queued" and rec.error["type"].endswith("StoreUnavailable")
    assert "could not confirm that this attempt still holds its lease" in rec.error["message"]
    store.put = put  # type: ignore[method-assign]
    assert dls.run_worker(q, once=True, isolation=isolation, idle_exit=10) == 1
    assert q.result(inv) == "one.txt" and _read(q, "one.txt") == "hello"


# -- the cache folder ---------------------------------------------------------------------


def _producer_write(q: Any) -> None:
    with q.scope("p"):
        Path(dls.run.write("in.txt")).write_text("x")


def _cached_read(q: Any) -> str:
    _producer_write(q)
    with q.scope("p"):
        return str(dls.run.read("in.txt"))


def test_a_symlink_planted_at_the_cache_folder_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir(mode=0o700)
    cache = tmp_path / "cache"
    cache.symlink_to(elsewhere)
    q = make_plane(MemoryStore(), cache_dir=str(cache))
    with pytest.raises(dls.InvalidArgument, match="symlink") as err:
        _producer_write(q)
    assert "cache_dir" in err.value.todo and "LAKESHORE_CACHE" in err.value.todo
    assert list(elsewhere.iterdir()) == []  # nothing was staged through the link


def test_a_symlink_planted_at_the_default_cache_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKESHORE_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / f"lakeshore-{os.getuid()}").symlink_to(victim)  # another user got there first
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match="symlink"):
        _cached_read(q)
    assert list(victim.iterdir()) == []


def test_a_symlink_planted_inside_the_cache_folder_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    (cache / "cache").symlink_to(victim)
    q = make_plane(MemoryStore(), cache_dir=str(cache))
    _producer_write(q)  # staging/ is fine
    with q.scope("p"), pytest.raises(dls.InvalidArgument, match="symlink"):
        dls.run.read("in.txt")  # a memory:// root reads through cache/
    assert list(victim.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user takes root")
def test_a_cache_folder_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 4242, 4242)
    q = make_plane(MemoryStore(), cache_dir=str(cache))
    with pytest.raises(dls.InvalidArgument, match="owned by uid 4242") as err:
        _producer_write(q)
    assert "cache_dir" in err.value.todo
    assert list(cache.iterdir()) == []


def test_a_group_writable_cache_folder_of_ours_is_made_private(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    q = make_plane(MemoryStore(), cache_dir=str(cache))
    local = Path(_cached_read(q))
    assert stat.S_IMODE(cache.stat().st_mode) & 0o022 == 0
    for sub in ("cache", "staging"):
        assert stat.S_IMODE((cache / sub).stat().st_mode) == 0o700
    assert local.read_text() == "x"


def test_a_fresh_cache_folder_is_private_and_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKESHORE_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    q = make_plane(MemoryStore())
    local = Path(_cached_read(q))
    base = tmp_path / f"lakeshore-{os.getuid()}"
    assert local.is_relative_to(base) and local.read_text() == "x"
    assert stat.S_IMODE(base.lstat().st_mode) == 0o700
    assert Path(_cached_read(q)) == local  # the second read uses the cache
    inv = q.udf(writes_one).submit("y")
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv) == "one.txt"


@dls.udf
def _helper_writes_then_waits(gate: str) -> str:
    Path(dls.run.write("out.txt")).write_text("stale")
    _wait_for(gate)  # the worker pauses here past its lease
    return "out.txt"


def _body_calls_a_helper(gate: str) -> str:
    return _helper_writes_then_waits(gate)  # a plain call of a decorated function: runs here


def test_a_helper_called_inside_a_fenced_body_publishes_nothing(tmp_path: Path) -> None:
    q = make_plane(MemoryStore(), lease_s=600.0, cache_dir=str(tmp_path / "cache"))
    gate = str(tmp_path / "gate")
    with q.scope("job"):
        inv = q.udf(_body_calls_a_helper).submit(gate)
    t, ran = _start_worker(q, "thread")
    poll(lambda: os.path.exists(gate + ".started"), 60, "the body to start")
    _take_over(q, inv)
    _publish_as_next_attempt(q, "out.txt", "fresh")  # attempt 2's output
    Path(gate).touch()
    t.join(60)
    assert ran == [1]
    rec = q.get(inv)
    assert rec.lease is not None and rec.lease.worker == "worker-b"
    assert _read(q, "out.txt") == "fresh"  # the helper's file of the fenced attempt: dropped


# -- hard links in a shared file:// root ----------------------------------------------------


def test_a_hard_link_planted_in_a_shared_root_is_not_read(tmp_path: Path) -> None:
    """A symlink is refused; a hard link to a file outside the root is the same escape for a
    group member who can create one (fs.protected_hardlinks=0, macOS, or a file they may
    write): the worker, reading with its own rights, would copy its secret into the invocation."""
    shared = tmp_path / "data" / "job1"
    shared.mkdir(parents=True)
    shared.chmod(0o2775)  # a group folder: producers of the group stage inputs here
    secrets = tmp_path / "worker-secrets"
    secrets.mkdir()
    (secrets / "credentials").write_text("aws_secret_access_key = hunter2")
    (secrets / "credentials").chmod(0o600)
    os.link(secrets / "credentials", shared / "creds.txt")  # the producer's plant
    ctx = RunContext(data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache")), "body")
    try:
        with pytest.raises(dls.PermissionDenied, match=r"job1/creds\.txt.*hard link"):
            ctx.read("job1/creds.txt")
        (shared / "plain.txt").write_text("an input")  # one name: read as before
        assert Path(ctx.read("job1/plain.txt")).read_text() == "an input"
    finally:
        ctx.close()


def test_a_hard_link_in_a_private_root_is_read_in_place(tmp_path: Path) -> None:
    """Only this user can link into a private root: its links are its own business."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    os.link(tmp_path / "data" / "a.txt", tmp_path / "data" / "b.txt")
    ctx = RunContext(data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache")), "body")
    try:
        assert ctx.read("b.txt") == str(tmp_path / "data" / "b.txt")
    finally:
        ctx.close()
