"""The record's attempt history: what each transition writes into it, the cap on its length,
its codec, and what a reader drops. Pure: no store is involved."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest

from lakeshore import keys
from lakeshore.errors import IllegalTransition
from lakeshore.model import lifecycle
from lakeshore.model.record import LIMITS, MAX_HISTORY, OUTCOMES, Blob, Lease, Record, Turn

ERR = {"type": "E", "message": "m", "traceback": ""}
RESULT = Blob(inline=b"\x01")


def rec(**kw: object) -> Record:
    base = dict(id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b"\x90"))
    base.update(kw)
    return Record(**base)  # type: ignore[arg-type]


def running(**kw: object) -> Record:
    """A record claimed once by worker "w" with token "t" at time 100."""
    return lifecycle.claim(rec(**kw), "w", "t", now=100.0)


def with_history(history: Any) -> bytes:
    """A valid record's bytes with the raw ``history`` value put in its place."""
    obj = msgpack.unpackb(rec().to_bytes(), raw=False)
    obj["history"] = history
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def entry(attempt: int = 1, **kw: Any) -> list[Any]:
    item = {"worker": "w", "started": 1.0, "ended": 2.0, "outcome": "succeeded", **kw}
    return [attempt, item["worker"], item["started"], item["ended"], item["outcome"]]


# -- transitions -------------------------------------------------------------------------------


def test_a_new_record_has_no_history() -> None:
    assert rec().history == ()


def test_claim_opens_an_entry_for_the_next_attempt() -> None:
    r = running()
    assert r.history == (Turn(1, "w", 100.0),)
    assert (r.history[0].ended_at, r.history[0].outcome) == (None, None)
    assert r.history[-1].attempt == r.attempt
    assert lifecycle.heartbeat(r, "t", now=105.0).history == r.history


def test_claim_retry_claim_succeed_gives_two_closed_entries() -> None:
    r = rec(max_attempts=3, retry_backoff_s=1.0)
    a1 = lifecycle.claim(r, "w1", "t1", now=100.0)
    back = lifecycle.fail(a1, "t1", ERR, now=105.0)
    assert back.state == "queued"
    assert back.history == (Turn(1, "w1", 100.0, 105.0, "retried"),)
    a2 = lifecycle.claim(back, "w2", "t2", now=200.0)
    assert a2.history == (Turn(1, "w1", 100.0, 105.0, "retried"), Turn(2, "w2", 200.0))
    done = lifecycle.succeed(a2, "t2", RESULT, now=210.0)
    assert done.state == "succeeded"
    assert done.history == (
        Turn(1, "w1", 100.0, 105.0, "retried"),
        Turn(2, "w2", 200.0, 210.0, "succeeded"),
    )


def test_the_last_failure_is_failed() -> None:
    final = lifecycle.fail(running(max_attempts=1), "t", ERR, now=110.0)
    assert final.state == "failed"
    assert final.history == (Turn(1, "w", 100.0, 110.0, "failed"),)
    # not retryable, with attempts left: failed as well, not retried
    final = lifecycle.fail(running(max_attempts=5), "t", ERR, now=110.0, retry=False)
    assert final.state == "failed"
    assert final.history == (Turn(1, "w", 100.0, 110.0, "failed"),)


def test_expire_is_expired_whether_retried_or_final() -> None:
    again = lifecycle.expire(running(lease_s=10.0, max_attempts=3), now=111.0)
    assert again.state == "queued"
    assert again.history == (Turn(1, "w", 100.0, 111.0, "expired"),)
    final = lifecycle.expire(running(lease_s=10.0, max_attempts=1), now=111.0)
    assert final.state == "failed"
    assert final.history == (Turn(1, "w", 100.0, 111.0, "expired"),)


def test_an_expiry_refused_before_the_lease_ends_writes_nothing() -> None:
    r = running(lease_s=10.0)
    with pytest.raises(IllegalTransition):
        lifecycle.expire(r, now=105.0)
    assert r.history == (Turn(1, "w", 100.0),)


def test_release_is_released_and_the_next_claim_is_the_next_attempt() -> None:
    back = lifecycle.release(running(), "t", now=103.0)
    assert (back.state, back.released) == ("queued", 1)
    assert back.history == (Turn(1, "w", 100.0, 103.0, "released"),)
    again = lifecycle.claim(back, "w2", "t2", now=104.0)
    assert again.history == (Turn(1, "w", 100.0, 103.0, "released"), Turn(2, "w2", 104.0))


def test_cancel_of_a_running_attempt_is_killed() -> None:
    killed = lifecycle.cancel(running(), now=107.0)
    assert killed.state == "killed"
    assert killed.history == (Turn(1, "w", 100.0, 107.0, "killed"),)


def test_cancel_of_a_queued_record_leaves_history_unchanged() -> None:
    assert lifecycle.cancel(rec(), now=1.0).history == ()
    back = lifecycle.fail(running(max_attempts=3), "t", ERR, now=105.0)  # queued, one entry
    killed = lifecycle.cancel(back, now=106.0)
    assert killed.state == "killed"
    assert killed.history == back.history == (Turn(1, "w", 100.0, 105.0, "retried"),)


def test_time_out_of_a_running_attempt_by_its_holder_is_timeout() -> None:
    r = running(timeout_s=1.0)
    with pytest.raises(IllegalTransition):
        lifecycle.time_out(r, now=102.0, token="stale")
    late = lifecycle.time_out(r, now=102.0, token="t")
    assert late.state == "timeout"
    assert late.history == (Turn(1, "w", 100.0, 102.0, "timeout"),)


def test_time_out_of_a_queued_record_past_its_deadline_leaves_history_unchanged() -> None:
    assert lifecycle.time_out(rec(deadline_at=10.0), now=11.0).history == ()
    back = lifecycle.fail(running(max_attempts=3, deadline_at=150.0), "t", ERR, now=105.0)
    late = lifecycle.time_out(back, now=151.0)
    assert late.state == "timeout"
    assert late.history == back.history == (Turn(1, "w", 100.0, 105.0, "retried"),)


def test_rerun_keeps_history_and_its_claim_appends() -> None:
    done = lifecycle.succeed(running(), "t", RESULT, now=110.0)
    again = lifecycle.rerun(done, now=120.0)
    assert again.history == done.history
    claimed = lifecycle.claim(again, "w2", "t2", now=130.0)
    assert claimed.history == (Turn(1, "w", 100.0, 110.0, "succeeded"), Turn(2, "w2", 130.0))


def test_history_keeps_only_the_newest_attempts() -> None:
    r = rec(max_attempts=100, retry_backoff_s=1.0)
    now = 0.0
    for i in range(1, 21):
        r = lifecycle.claim(r, f"w{i}", f"t{i}", now=now)
        assert len(r.history) == min(i, MAX_HISTORY)
        if i < 20:
            r = lifecycle.fail(r, f"t{i}", ERR, now=now + 1.0)
            assert r.state == "queued"
        now += 1000.0  # past any backoff (at most MAX_BACKOFF_S)
    assert MAX_HISTORY == 16
    assert r.attempt == 20
    assert [t.attempt for t in r.history] == list(range(5, 21))
    assert [t.worker for t in r.history] == [f"w{i}" for i in range(5, 21)]
    assert [t.started_at for t in r.history] == [(i - 1) * 1000.0 for i in range(5, 21)]
    closed = r.history[:-1]
    assert all(t.outcome == "retried" for t in closed)
    assert [t.ended_at for t in closed] == [(i - 1) * 1000.0 + 1.0 for i in range(5, 20)]
    assert r.history[-1] == Turn(20, "w20", 19000.0)
    # a full history is still readable
    assert Record.from_bytes(r.to_bytes()).history == r.history


# -- records without an entry for their attempt ------------------------------------------------


def test_a_pre_history_record_that_is_claimed_gets_exactly_one_entry() -> None:
    old = rec(attempt=2, history=())  # two attempts ran before the field existed
    r = lifecycle.claim(old, "w", "t", now=50.0)
    assert r.history == (Turn(3, "w", 50.0),)


def _running_without_entry(history: tuple[Turn, ...] = (), attempt: int = 1) -> Record:
    return rec(
        state="running",
        attempt=attempt,
        max_attempts=5,
        lease=Lease("w", "t", 100.0),
        started_at=0.0,
        timeout_s=1.0,
        history=history,
    )


@pytest.mark.parametrize(
    "move",
    [
        lambda r: lifecycle.succeed(r, "t", RESULT, now=50.0),
        lambda r: lifecycle.fail(r, "t", ERR, now=50.0),
        lambda r: lifecycle.fail(r, "t", ERR, now=50.0, retry=False),
        lambda r: lifecycle.expire(r, now=150.0),
        lambda r: lifecycle.release(r, "t", now=50.0),
        lambda r: lifecycle.cancel(r, now=50.0),
        lambda r: lifecycle.time_out(r, now=50.0, token="t"),
    ],
    ids=["succeed", "retry", "fail", "expire", "release", "cancel", "time_out"],
)
def test_ending_an_attempt_without_its_entry_leaves_history_unchanged(move: Any) -> None:
    empty = move(_running_without_entry())
    assert empty.state != "running" and empty.history == ()
    # the last entry is an earlier attempt's: it is not closed a second time
    earlier = (Turn(1, "w0", 1.0, 2.0, "retried"),)
    assert move(_running_without_entry(earlier, attempt=3)).history == earlier
    # the last entry is this attempt's, but already closed: it stays as it is
    closed = (Turn(1, "w", 1.0, 2.0, "released"),)
    assert move(_running_without_entry(closed)).history == closed


# -- codec ---------------------------------------------------------------------------------


def test_history_round_trips() -> None:
    a1 = lifecycle.claim(rec(max_attempts=3), "w1", "t1", now=100.0)
    back = lifecycle.fail(a1, "t1", ERR, now=105.0)
    a2 = lifecycle.claim(back, "w2", "t2", now=200.0)
    for r in (a1, a2, lifecycle.succeed(a2, "t2", RESULT, now=210.0)):
        got = Record.from_bytes(r.to_bytes())
        assert got.history == r.history and got == r
        assert all(type(t) is Turn for t in got.history)


def test_history_is_stored_as_five_item_arrays() -> None:
    r = lifecycle.succeed(running(), "t", RESULT, now=110.0)
    obj = msgpack.unpackb(r.to_bytes(), raw=False)
    assert obj["history"] == [[1, "w", 100.0, 110.0, "succeeded"]]


def test_a_record_without_history_reads_as_empty() -> None:
    obj = msgpack.unpackb(rec().to_bytes(), raw=False)
    del obj["history"]
    assert Record.from_bytes(msgpack.packb(obj, use_bin_type=True)).history == ()
    assert Record.from_bytes(with_history([])).history == ()


def test_the_reader_accepts_entries_at_their_limits() -> None:
    full = [entry(i) for i in range(1, MAX_HISTORY + 1)]
    assert len(Record.from_bytes(with_history(full)).history) == MAX_HISTORY
    wide = "é" * (LIMITS["lease.worker"] // 2)  # exactly at the cap, in bytes
    assert Record.from_bytes(with_history([entry(worker=wide)])).history[0].worker == wide
    for outcome in (*OUTCOMES, None):
        got = Record.from_bytes(with_history([entry(outcome=outcome)])).history
        assert got[0].outcome == outcome
    got = Record.from_bytes(with_history([entry(started=5, ended=None, outcome=None)])).history
    assert got == (Turn(1, "w", 5.0),)
    assert type(got[0].started_at) is float


@pytest.mark.parametrize(
    "history",
    [
        pytest.param([entry()[:4]], id="entry-of-4-items"),
        pytest.param([[*entry(), None]], id="entry-of-6-items"),
        pytest.param(["x"], id="entry-not-a-list"),
        pytest.param([{"attempt": 1}], id="entry-a-map"),
        pytest.param([entry(0)], id="attempt-0"),
        pytest.param([entry(-1)], id="attempt-negative"),
        pytest.param([entry(True)], id="attempt-bool"),
        pytest.param([entry(1.0)], id="attempt-float"),
        pytest.param([entry(worker=7)], id="worker-int"),
        pytest.param([entry(worker=b"w")], id="worker-bytes"),
        pytest.param([entry(worker=None)], id="worker-none"),
        pytest.param([entry(worker="w" * (LIMITS["lease.worker"] + 1))], id="worker-over-cap"),
        pytest.param([entry(worker="é" * 129)], id="worker-over-cap-in-bytes"),
        pytest.param([entry(outcome="exploded")], id="outcome-unknown"),
        pytest.param([entry(outcome="")], id="outcome-empty"),
        pytest.param([entry(outcome=1)], id="outcome-int"),
        pytest.param([entry(started="1.0")], id="started-str"),
        pytest.param([entry(started=None)], id="started-none"),
        pytest.param([entry(started=True)], id="started-bool"),
        pytest.param([entry(started=math.nan)], id="started-nan"),
        pytest.param([entry(started=math.inf)], id="started-inf"),
        pytest.param([entry(ended=math.nan)], id="ended-nan"),
        pytest.param([entry(ended="2")], id="ended-str"),
        pytest.param("x", id="history-a-str"),
        pytest.param({"a": 1}, id="history-a-map"),
        pytest.param(None, id="history-none"),
    ],
)
def test_the_reader_drops_a_mangled_entry_and_keeps_the_rest(history: Any) -> None:
    # the history is for people: a bad entry (anyone's, or a newer version's word) is
    # dropped, never a reason to fail the invocation as corrupt
    assert Record.from_bytes(with_history(history)).history == ()
    if isinstance(history, list):
        mixed = [entry(1), *history, entry(3, outcome="retried")]
        got = Record.from_bytes(with_history(mixed)).history
        assert [t.attempt for t in got] == [1, 3] and got[1].outcome == "retried"


def test_the_reader_keeps_the_newest_entries_of_a_long_history() -> None:
    long = [entry(i) for i in range(1, MAX_HISTORY + 6)]
    got = Record.from_bytes(with_history(long)).history
    assert [t.attempt for t in got] == list(range(6, MAX_HISTORY + 6))
