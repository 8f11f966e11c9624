"""Hostile objects in the store against workers and readers (issue 15, items 6, 8 and 9):
records written by hand with mistyped fields or deeply nested arguments, a garbage object
file on a local-directory store, hostile signs of life. The worker must fail the bad
invocation, keep serving the good ones, and ``lakeshore status`` / ``ls`` must keep working.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest

import lakeshore as dls
from lakeshore import codec, keys
from lakeshore.keys import worker_key
from lakeshore.model.record import Blob, Record
from lakeshore.protocol import steps as protocol
from lakeshore.store.base import Store, if_match
from lakeshore.store.local import LocalStore
from tests import jobs
from tests.commands import env_for, lakeshore_cmd, run
from tests.handmade import ADD_ONE, deep_tuple, ext, handmade, put_by_hand
from tests.tiers import make_plane, record_key

MISTYPED = {
    "not_before": "soon",
    "args": {"inline": 10**18},  # bytes(10**18) before: a MemoryError in the slot
    "priority": "high",
    "lease": [1, 2],
    "error": {"type": 1},
    "attempt": True,
    "max_attempts": 0,
    "submitted_at": None,
    "journal": {"attempt": "1"},
    "result": {"ref": 5, "size": 1, "sha256": "x"},
    "id": "not-an-id",
}


def test_mistyped_record_fields_are_failed_and_good_work_runs(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    bad = {}
    for field, value in MISTYPED.items():  # written first: they head the queue
        inv = keys.new_id()
        put_by_hand(q, inv, msgpack.packb(handmade(q, inv, **{field: value}), use_bin_type=True))
        bad[inv] = field
    good = [q.udf(jobs.add_one).submit(i) for i in range(4)]
    ran = dls.run_worker(q, isolation="thread", concurrency=2, idle_exit=0.5, max_poll_s=0.05)
    assert ran == len(good)
    assert [q.result(i, timeout=5) for i in good] == [1, 2, 3, 4]
    for inv, field in bad.items():
        rec = q.get(inv)
        assert (rec.state, rec.fn) == ("failed", "?"), field
        assert rec.error is not None and rec.error["type"] == "CorruptRecord"
        assert field in rec.error["message"], (field, rec.error["message"])
    assert list(q.store.list(q.plane.ops("default").keys.tickets_prefix)) == []


def test_a_record_naming_another_invocation_is_failed_not_followed(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    here, elsewhere = keys.new_id(), keys.new_id()
    put_by_hand(q, here, msgpack.packb(handmade(q, elsewhere), use_bin_type=True))
    dls.run_worker(q, isolation="thread", idle_exit=0.3, max_poll_s=0.05)
    rec = q.get(here)
    assert rec.state == "failed" and rec.error is not None
    assert "another invocation" in rec.error["message"]
    assert list(q.store.list(q.plane.ops("default").keys.invocation_prefix(elsewhere))) == []


def test_an_unexpected_error_on_one_ticket_does_not_stop_the_worker(
    atomic_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_plane(atomic_store)
    f = q.udf(jobs.add_one)
    poisoned = f.submit(0)
    good = [f.submit(i) for i in range(1, 4)]
    claim = protocol.lifecycle.claim

    def flaky_claim(rec: Record, *a: Any, **kw: Any) -> Record:
        if rec.id == poisoned:
            raise RuntimeError("a bug met while examining this one record")
        return claim(rec, *a, **kw)

    monkeypatch.setattr(protocol.lifecycle, "claim", flaky_claim)
    ran = dls.run_worker(q, isolation="thread", idle_exit=0.3, max_poll_s=0.05)
    assert ran == 3
    assert [q.result(i, timeout=5) for i in good] == [2, 3, 4]
    assert q.status(poisoned) == "queued"  # passed over, left for a later look


def deep_args(levels: int) -> bytes:
    """The arguments ``((<tuple nested levels deep>,), {})`` encoded by hand."""
    return ext(1, b"\x92" + ext(1, b"\x91" + deep_tuple(levels)) + b"\x80")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_deeply_nested_arguments_fail_cleanly_and_the_worker_keeps_serving(
    tmp_path: Path, isolation: str
) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    deep = [keys.new_id() for _ in range(3)]
    for inv in deep:  # 480 levels killed three worker processes in a row
        args = Blob(inline=deep_args(480))
        rec = Record(id=inv, ns=q.ns, queue="default", fn=ADD_ONE, args=args)
        q.plane.ops("default").submit(
            rec
        )  # a ticket holding the record, as any producer may write it
    good = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    out = subprocess.run(
        lakeshore_cmd(
            "worker",
            *("--allow", "tests.jobs:*", "--isolation", isolation),
            *("--idle-exit", "1", "--max-poll", "0.1"),
        ),
        env=env_for(url),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert [q.result(i, timeout=5) for i in good] == [1, 2, 3]
    for inv in deep:
        rec = q.get(inv)
        assert (rec.state, rec.attempt) == ("failed", 1)  # failed at once, not retried
        assert rec.error is not None and rec.error["type"] == "DecodeError"
        assert "100 levels deep" in rec.error["message"]


def garbage_file(store: LocalStore, key: str, content: bytes) -> Path:
    """Overwrite the file of ``key`` with ``content``, no LocalStore header."""
    path = store.root / "objects" / key
    path = path.with_name(path.name + ".obj")
    assert path.exists()
    path.write_bytes(content)
    return path


def garbage_record(store: LocalStore, q: Any, inv: str, content: bytes) -> Path:
    """A queued invocation whose ``<id>/record`` file holds ``content``: its record is
    written as the first move writes it (its ticket a marker), then garbled."""
    ops = q.plane.ops("default")
    rec, _ = ops.read(inv)
    ops.put_marker(rec)
    store.put(ops.keys.record(inv), rec.to_bytes())
    return garbage_file(store, ops.keys.record(inv), content)


GARBAGE = [b"this is not a record at all, nor an object", b"LSO", b""]
# A ticket's garbage must be larger than a marker to be read as a ticket: a smaller one is
# taken for a marker whose record is missing (dropped once ORPHAN_GRACE_S old).
GARBAGE_TICKETS = [b"this is not a ticket at all, nor a record, nor an object" * 2, b"LSO" * 30]


def test_a_garbage_record_file_is_failed_and_good_work_runs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    doomed = [f.submit(0) for _ in GARBAGE]  # first: they head the queue
    for inv, content in zip(doomed, GARBAGE, strict=True):
        garbage_record(store, q, inv, content)
    bad_tickets = [f.submit(0) for _ in GARBAGE_TICKETS]  # never moved: no record yet
    for inv, content in zip(bad_tickets, GARBAGE_TICKETS, strict=True):
        assert record_key(q.plane.ops("default"), inv) == q.plane.ops("default").keys.ticket(5, inv)
        garbage_file(store, record_key(q.plane.ops("default"), inv), content)
    good = [f.submit(i) for i in range(1, 4)]
    ran = dls.run_worker(q, isolation="thread", idle_exit=0.5, max_poll_s=0.05)
    assert ran == 3
    assert [q.result(i, timeout=5) for i in good] == [2, 3, 4]
    for inv in doomed + bad_tickets:
        rec = q.get(inv)
        assert rec.state == "failed" and rec.error is not None
        assert rec.error["type"] == "CorruptRecord"


def test_local_store_reads_a_headerless_file_as_its_content(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("a/b", b"x")
    path = tmp_path / "store" / "objects" / "a" / "b.obj"
    for content in (b"garbage without a header", b"LSO1", b""):
        path.write_bytes(content)
        data, etag = store.get("a/b")
        assert data == content and store.get("a/b")[1] == etag  # stable while unchanged
        [info] = store.list("a/")
        assert (info.key, info.etag, info.size) == ("a/b", etag, len(content))
    path.write_bytes(b"other garbage")
    assert store.get("a/b")[1] != etag
    from lakeshore.errors import Conflict

    with pytest.raises(Conflict):
        store.put("a/b", b"fenced", if_match(etag))
    new = store.put("a/b", b"repaired", if_match(store.get("a/b")[1]))
    assert store.get("a/b") == (b"repaired", new)
    path.write_bytes(b"again")
    store.delete("a/b", if_match=store.get("a/b")[1])
    assert list(store.list("a/")) == []


def test_status_and_ls_exit_0_beside_a_garbage_record_file(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    store = q.store
    assert isinstance(store, LocalStore)
    f = q.udf(jobs.add_one)
    good = [f.submit(i) for i in range(3)]
    doomed = f.submit(0)
    garbage_record(store, q, doomed, b"garbage through and through")
    code, out, err = run(capsys, "status")
    assert code == 0, err
    assert "3" in out.splitlines()[3]  # three queued: the garbage one is not live
    code, out, err = run(capsys, "status", "--json")
    assert code == 0, err
    [st] = json.loads(out)["queues"]
    assert (st["queued"], st["recent"]["failed"], st["recent"]["queued"]) == (3, 1, 3)
    code, out, err = run(capsys, "ls")
    assert code == 0, err
    assert all(inv in out for inv in good)
    assert f"{doomed}  failed" in out
    code, out, err = run(capsys, "ls", "--json", "--state", "queued")
    assert code == 0, err
    assert sorted(r["id"] for r in json.loads(out)["invocations"]) == sorted(good)


def test_status_survives_hostile_signs_of_life(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    now = q.store.now()
    hostile: list[Any] = [
        {"worker": "w1", "seen_at": now, "queues": 5, "running_by_queue": [1]},
        {"worker": "w2", "seen_at": now, "queues": [None, "default"], "running": {"x": 1}},
        {"worker": ["x"], "seen_at": "now"},
        [1, 2, 3],
    ]
    for i, life in enumerate(hostile):
        q.store.put(worker_key(q.ns, f"w{i}"), codec.encode(life))
    q.store.put(worker_key(q.ns, "junk"), b"\xc1 not msgpack")
    # (a deeply nested sign of life is in test_hostile_bytes: in process it would segfault
    # this very test run on a regression)
    code, out, err = run(capsys, "status")
    assert code == 0, err
    assert "workers seen in the last 5 minutes: 2" in out
    code, out, err = run(capsys, "status", "--json")
    assert code == 0, err
    names = sorted(w["worker"] for w in json.loads(out)["workers"])
    assert names == ["w1", "w2"]


def _within(seconds: float, fn: Any) -> Any:
    """Run ``fn`` in a thread and return its result; fail (not hang) past ``seconds``."""
    import threading

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    return out[0]


def test_a_huge_attempt_number_is_refused_and_never_computed_with(tmp_path: Path) -> None:
    # 2**(2**40) as a retry backoff would hold the interpreter, every slot and heartbeat
    q = make_plane(LocalStore(tmp_path / "store"))
    bad = keys.new_id()
    lease = {"worker": "gone", "token": "t", "expires_at": 1.0}  # long expired
    rec = handmade(q, bad, state="running", attempt=2**40, released=2**40, lease=lease)
    put_by_hand(q, bad, msgpack.packb(rec, use_bin_type=True))
    good = q.udf(jobs.add_one).submit(41)
    ran = _within(60, lambda: dls.run_worker(q, isolation="thread", idle_exit=0.5))
    assert ran == 1 and q.result(good, timeout=5) == 42
    failed = q.get(bad)
    assert failed.state == "failed" and failed.error is not None
    assert failed.error["type"] == "CorruptRecord" and "attempt" in failed.error["message"]


def test_the_retry_backoff_of_any_attempt_number_is_cheap() -> None:
    from lakeshore.model import lifecycle
    from lakeshore.model.record import MAX_COUNT

    rec = Record(id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b""))
    big = dataclasses.replace(rec, attempt=MAX_COUNT, retry_backoff_cap_s=lifecycle.MAX_BACKOFF_S)
    assert _within(5, lambda: lifecycle.backoff_s(big)) == lifecycle.MAX_BACKOFF_S


def test_a_pipe_or_a_link_in_a_local_store_is_neither_waited_on_nor_followed(
    tmp_path: Path,
) -> None:
    import os

    store = LocalStore(tmp_path / "store")
    store.put("a/x", b"x")
    folder = tmp_path / "store" / "objects" / "a"
    os.mkfifo(folder / "fifo.obj")  # reading it would block for ever
    (folder / "zero.obj").symlink_to("/dev/zero")  # reading it would never end
    listed = _within(20, lambda: [(i.key, i.size) for i in store.list("a/")])
    assert listed == [("a/fifo", 0), ("a/x", 1), ("a/zero", 0)]
    for key in ("a/fifo", "a/zero"):
        data, etag = _within(20, lambda k=key: store.get(k))
        assert data == b""
        store.put(key, b"replaced", if_match(etag))  # a conditional write takes its place
        assert store.get(key)[0] == b"replaced"
    assert Path("/dev/zero").exists()  # the link itself was replaced, never its target


def _odd_record(tmp_path: Path) -> tuple[Path, Any]:
    """The record file of a hand-made invocation (for the test to replace), and ``serve()``:
    run a worker beside one good invocation, check that it ran, return the odd record."""
    store = LocalStore(tmp_path / "store")
    q = make_plane(store)
    bad = keys.new_id()
    put_by_hand(q, bad, b"placeholder")

    def serve() -> Record:
        good = q.udf(jobs.add_one).submit(1)
        ran = _within(60, lambda: dls.run_worker(q, isolation="thread", idle_exit=0.5))
        assert ran == 1 and q.result(good, timeout=5) == 2
        rec: Record = q.get(bad)
        assert rec.state == "failed" and rec.error is not None
        return rec

    return garbage_file(store, q.plane.ops("default").keys.record(bad), b""), serve


def test_a_record_that_is_a_link_to_an_endless_file_is_failed(tmp_path: Path) -> None:
    path, serve = _odd_record(tmp_path)
    path.unlink()
    path.symlink_to("/dev/zero")
    rec = serve()
    assert rec.error["type"] == "CorruptRecord"


def test_a_record_larger_than_any_record_is_failed_without_being_read(tmp_path: Path) -> None:
    path, serve = _odd_record(tmp_path)
    with open(path, "wb") as f:  # sparse: 5 GiB that take no disk, nor memory unless read
        f.truncate(5 << 30)
    rec = serve()
    assert "more than any record" in rec.error["message"]


def test_get_refuses_an_object_over_max_bytes_on_every_store(store: Store) -> None:
    store.put("big/one", b"0123456789")
    assert store.get("big/one", max_bytes=10) == (b"0123456789", store.get("big/one")[1])
    with pytest.raises(dls.TooLarge) as err:
        store.get("big/one", max_bytes=9)
    assert err.value.details["size"] == 10 and err.value.details["limit"] == 9
    assert isinstance(err.value, dls.StoreError)
