"""Pure parts of the queue: values codec, keys, the record codec and state transitions.
No store is involved."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from lakeshore import codec, keys
from lakeshore.errors import DecodeError, IllegalTransition, InvalidArgument, RecordError
from lakeshore.model import lifecycle
from lakeshore.model.record import SCHEMA_VERSION, Blob, Record, check_text


def rec(**kw: object) -> Record:
    base = dict(id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b"\x90"))
    base.update(kw)
    return Record(**base)  # type: ignore[arg-type]


# -- codec ---------------------------------------------------------------------------------


def test_values_keep_tuples_bytes_and_nesting() -> None:
    value = {"t": (1, (2, "x")), "l": [b"\x00\xff", (None,)], "f": 1.5, 3: True}
    assert codec.decode(codec.encode(value)) == value
    assert isinstance(codec.decode(codec.encode((1, 2))), tuple)


def test_unsendable_values_say_what_to_do() -> None:
    with pytest.raises(InvalidArgument) as err:
        codec.encode({"f": open}, "arguments of m:f")
    assert "arguments of m:f" in str(err.value) and "pass their keys" in str(err.value)
    with pytest.raises(InvalidArgument, match="64 bits"):
        codec.encode(2**70)
    with pytest.raises(DecodeError):
        codec.decode(b"\xc1")


def test_numpy_arrays_round_trip_when_installed() -> None:
    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype="float32").reshape(3, 4)
    back = codec.decode(codec.encode({"a": a}))["a"]
    assert back.dtype == a.dtype and back.shape == (3, 4) and (back == a).all()


# -- keys ----------------------------------------------------------------------------------


def test_keys_layout_and_order() -> None:
    k = keys.QueueKeys("default", "q")
    inv = keys.new_id()
    assert k.record(inv) == f"lakeshore/default/q/{inv}/record"
    assert k.result(inv, 2) == f"lakeshore/default/q/{inv}/result-0002"
    assert k.journal(inv, 1, 7).endswith("/journal/0001/000000000007")
    assert k.ticket(9, inv) < k.ticket(0, inv)  # higher priority lists first
    assert keys.QueueKeys.priority_of(k.ticket(7, inv)) == 7
    assert keys.QueueKeys.id_of(k.ticket(3, inv)) == inv
    later = [keys.new_id() for _ in range(50)]
    assert sorted(later) == later  # ULIDs sort by creation time
    assert len(k.idem("x").rsplit("/", 1)[1]) == 64


@pytest.mark.parametrize("bad", ["", "A", "-x", "x/y", "..", "x" * 64, "é"])
def test_bad_names(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        keys.QueueKeys("default", bad)


@pytest.mark.parametrize("bad", ["", "nope", "../../etc", "01J" + "!" * 23])
def test_bad_ids(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        keys.check_id(bad)


def test_priorities_are_bounded() -> None:
    with pytest.raises(InvalidArgument):
        keys.band(10)


# -- record codec --------------------------------------------------------------------------


def test_record_round_trips_every_field() -> None:
    r = rec(
        key="k",
        input_hash="h",
        prefix="scenes/1",
        priority=7,
        timeout_s=2.5,
        deadline_at=123.0,
        result=Blob(ref="x/result-0001", size=3, sha256="ab" * 32),
        error={"type": "E", "message": "m", "traceback": "tb"},
        journal={"attempt": 1, "frames": 3, "ended": False},
        fn_pickle=b"\x80",
    )
    back = Record.from_bytes(r.to_bytes())
    assert back == r


def test_every_write_changes_the_bytes() -> None:
    r = rec()
    r2 = r.next_write()
    assert (r2.rev, r2.wid != r.wid) == (r.rev + 1, True)
    assert r2.to_bytes() != r.to_bytes()


def test_corrupt_and_newer_records_are_refused() -> None:
    with pytest.raises(RecordError, match="not a valid record"):
        Record.from_bytes(b"\xc1garbage")
    with pytest.raises(RecordError, match="missing or mangles"):
        Record.from_bytes(codec.encode({"v": 1, "id": "x"}))
    newer = rec().to_bytes().replace(b"\xa1v\x01", b"\xa1v\x63")
    with pytest.raises(
        RecordError, match=f"newer than this lakeshore understands \\(v{SCHEMA_VERSION}\\)"
    ):
        Record.from_bytes(newer)


def test_a_short_text_of_wide_characters_is_measured_in_bytes() -> None:
    # 40 characters of 2 bytes: under the 64-byte cap of `wid` by length, over it in UTF-8
    obj = msgpack.unpackb(rec().to_bytes())
    obj["wid"] = "é" * 40
    with pytest.raises(RecordError, match="wid is 80 bytes, over the limit of 64") as e:
        Record.from_bytes(msgpack.packb(obj))
    assert e.value.field == "wid"
    obj["wid"] = "é" * 32  # 64 bytes: at the cap, accepted
    assert Record.from_bytes(msgpack.packb(obj)).wid == "é" * 32
    with pytest.raises(InvalidArgument, match=r"lease\.worker is 300 bytes"):
        check_text("€" * 100, "lease.worker", "run_worker")  # a 256-byte cap


def test_a_record_without_optional_fields_reads_with_their_defaults() -> None:
    r = rec()
    obj = msgpack.unpackb(r.to_bytes())
    for name in ("wid", "rev", "state", "reruns", "lease", "error", "journal"):
        del obj[name]
    back = Record.from_bytes(msgpack.packb(obj))
    assert (back.state, back.rev, back.reruns, back.lease) == ("queued", 0, 0, None)
    assert len(back.wid) == 16 and back == dataclasses.replace(r, wid=back.wid)


# -- transitions -----------------------------------------------------------------------------


def test_claim_heartbeat_succeed() -> None:
    r = rec(lease_s=10.0)
    running = lifecycle.claim(r, "w1", "tok", now=100.0)
    assert (running.state, running.attempt, running.lease.expires_at) == ("running", 1, 110.0)  # type: ignore[union-attr]
    beat = lifecycle.heartbeat(running, "tok", now=105.0)
    assert beat.lease.expires_at == 115.0  # type: ignore[union-attr]
    with pytest.raises(IllegalTransition):
        lifecycle.heartbeat(running, "other-token", now=105.0)
    done = lifecycle.succeed(beat, "tok", Blob(inline=b"\x01"), now=106.0)
    assert (done.state, done.lease, done.finished_at) == ("succeeded", None, 106.0)
    with pytest.raises(IllegalTransition):
        lifecycle.succeed(done, "tok", Blob(inline=b"\x01"), now=107.0)  # no second terminal


def test_failures_retry_with_backoff_then_fail() -> None:
    r = rec(max_attempts=2, retry_backoff_s=1.0)
    err = {"type": "E", "message": "m", "traceback": ""}
    a1 = lifecycle.claim(r, "w", "t1", now=0.0)
    back = lifecycle.fail(a1, "t1", err, now=5.0)
    assert (back.state, back.not_before, back.error) == ("queued", 6.0, err)
    with pytest.raises(IllegalTransition):
        lifecycle.claim(back, "w", "t2", now=5.5)  # still backing off
    a2 = lifecycle.claim(back, "w", "t2", now=6.0)
    final = lifecycle.fail(a2, "t2", err, now=7.0)
    assert (final.state, final.attempt) == ("failed", 2)
    assert lifecycle.backoff_s(rec(attempt=4, retry_backoff_s=1.0)) == 8.0
    assert lifecycle.backoff_s(rec(attempt=40)) == 300.0  # the default cap
    assert lifecycle.backoff_s(rec(attempt=40, retry_backoff_cap_s=3600.0)) == 3600.0


def test_non_retryable_failure_ends_at_once() -> None:
    a1 = lifecycle.claim(rec(max_attempts=5), "w", "t", now=0.0)
    assert lifecycle.fail(a1, "t", {"type": "E"}, now=1.0, retry=False).state == "failed"


def test_expiry_only_after_the_lease() -> None:
    a1 = lifecycle.claim(rec(lease_s=10.0), "w", "t", now=0.0)
    with pytest.raises(IllegalTransition):
        lifecycle.expire(a1, now=9.0)
    again = lifecycle.expire(a1, now=11.0)
    assert again.state == "queued" and again.error["type"] == "LeaseExpired"  # type: ignore[index]


def test_cancel_and_timeouts() -> None:
    assert lifecycle.cancel(rec(), now=1.0).state == "killed"
    running = lifecycle.claim(rec(timeout_s=1.0), "w", "t", now=0.0)
    assert lifecycle.cancel(running, now=1.0).state == "killed"
    assert lifecycle.time_out(running, now=2.0, token="t").state == "timeout"
    with pytest.raises(IllegalTransition):
        lifecycle.time_out(running, now=2.0, token="stale")
    late = rec(deadline_at=10.0)
    with pytest.raises(IllegalTransition):
        lifecycle.claim(late, "w", "t", now=11.0)
    assert lifecycle.time_out(late, now=11.0).state == "timeout"
    with pytest.raises(IllegalTransition):
        lifecycle.cancel(lifecycle.cancel(rec(), now=1.0), now=2.0)


# sha256 (first 16 hex digits) of each record's bytes as 0.4.0 wrote them, before states were
# an enum: a change to how a record is stored must be a deliberate one
STORED_0_4_0 = {
    "queued": "e66199896326a1fa",
    "running": "e5d4a2821eb75552",
    "succeeded": "894ed7525c41c0b6",
    "failed": "406548c0f516b1a4",
    "killed": "4e24ba5e8d976b48",
    "timeout": "19482adbe9f402fa",
    "retried": "c8d4945ed9dc1af5",
}


def test_records_in_every_state_are_stored_as_0_4_0_stored_them() -> None:
    import hashlib

    from lakeshore.model.record import State

    base = Record(
        id="01JD2K7Q000000000000000000",
        ns="default",
        queue="jobs",
        fn="tests.jobs:add_one",
        args=Blob(inline=b"\x92\x91\x01\x80"),
        submitted_at=1000.0,
        wid="w0",
    )
    running = lifecycle.claim(base, "worker-1", "tok", 1001.0)
    error = {"type": "ValueError", "message": "m", "traceback": ""}
    records = {
        "queued": base,
        "running": running,
        "succeeded": lifecycle.succeed(running, "tok", Blob(inline=b"\x02"), 1002.0),
        "failed": lifecycle.fail(running, "tok", error, 1002.0, retry=False),
        "killed": lifecycle.cancel(running, 1002.0, "bye"),
        "timeout": lifecycle.time_out(running, 1002.0, "tok"),
        "retried": lifecycle.fail(running, "tok", {**error, "type": "E", "message": ""}, 1002.0),
    }
    for name, rec in records.items():
        data = dataclasses.replace(rec, wid="w1").to_bytes()
        assert hashlib.sha256(data).hexdigest()[:16] == STORED_0_4_0[name], name
        back = Record.from_bytes(data)
        assert type(back.state) is State and back.state == rec.state


def test_a_state_reaches_users_as_text_and_is_sent_as_text() -> None:
    """States are an enum inside; what users get and send is the plain text it was."""
    import lakeshore as dls
    from lakeshore import codec
    from lakeshore.model.record import State
    from tests import jobs

    q = dls.Dispatch(":memory:")
    inv = q.udf(jobs.add_one).submit(1)
    assert type(q.status(inv)) is str and q.status(inv) == "queued"
    back = codec.decode(codec.encode({"state": q.get(inv).state, "all": list(State)}))
    assert back == {"state": "queued", "all": [s.value for s in State]}
    assert type(back["state"]) is str
    work = dls.WorkQueue("jobs", q)
    assert all(type(k) is str for k in work.counts())
