"""Dependencies as pure rules: the submit's check of ``_after``, the record's dependency
fields (schema 2, hostile values refused), what a parent's state means, and the
transitions of a child (claim refused while a parent is not seen done, progress, kill)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from lakeshore import keys
from lakeshore.errors import IllegalTransition, InvalidArgument, RecordError
from lakeshore.model import lifecycle
from lakeshore.model.dependencies import MAX_AFTER, Standing, check_after, parent_standing
from lakeshore.model.record import Blob, Record, State


def rec(**kw: Any) -> Record:
    base: dict[str, Any] = dict(
        id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b"\x90")
    )
    base.update(kw)
    return Record(**base)


def ids(n: int) -> tuple[str, ...]:
    return tuple(keys.new_id() for _ in range(n))


# -- the submit's check ------------------------------------------------------------------------


def test_after_is_checked_canonical_deduplicated_and_in_order() -> None:
    a, b = ids(2)
    parents, failure = check_after([b.lower(), a, b], "run", "submit m:f")
    assert parents == (b, a) and failure == "run"
    assert check_after(None, "kill", "op") == ((), "kill")
    assert check_after([], "run", "op") == ((), "kill")  # no parents: the rule means nothing
    assert check_after(iter([a]), "kill", "op") == ((a,), "kill")


@pytest.mark.parametrize(
    ("after", "failure", "says"),
    [
        ("01JD2K7QABCDEFGHJKMNPQRSTV", "kill", "list of invocation ids, got a str"),
        (42, "kill", "list of invocation ids, got a int"),
        ([1], "kill", "holds a int"),
        (["not-an-id"], "kill", "is not an invocation id"),
        ([], "maybe", "_after_failure='maybe'"),
        ([], None, "_after_failure=None"),
    ],
)
def test_bad_after_is_refused_before_anything_is_written(
    after: Any, failure: Any, says: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_after(after, failure, "submit m:f")
    assert says in str(err.value) and str(err.value).startswith("submit m:f: ")


def test_more_parents_than_the_cap_are_refused_with_the_way_out() -> None:
    with pytest.raises(InvalidArgument) as err:
        check_after(ids(MAX_AFTER + 1), "kill", "submit m:f")
    assert f"more than {MAX_AFTER} parents" in str(err.value) and "tree" in str(err.value)
    assert err.value.limit == MAX_AFTER
    assert len(check_after(ids(MAX_AFTER), "kill", "op")[0]) == MAX_AFTER


# -- what a parent's state means -------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "kill", "run"),
    [
        ("queued", Standing.WAITING, Standing.WAITING),
        ("running", Standing.WAITING, Standing.WAITING),
        ("succeeded", Standing.DONE, Standing.DONE),
        ("failed", Standing.BROKEN, Standing.DONE),
        ("killed", Standing.BROKEN, Standing.DONE),
        ("timeout", Standing.BROKEN, Standing.DONE),
        (None, Standing.BROKEN, Standing.DONE),  # not found
    ],
)
def test_what_a_parents_state_means(state: str | None, kill: Standing, run: Standing) -> None:
    assert parent_standing(state, "kill") is kill
    assert parent_standing(state, "run") is run


# -- the record's fields ---------------------------------------------------------------------


def test_a_record_without_parents_is_stored_as_schema_1_without_the_fields() -> None:
    plain = rec()
    raw = msgpack.unpackb(plain.to_bytes())
    assert raw["v"] == 1 and not {"after", "after_failure", "after_done", "after_pass"} & set(raw)


def test_a_child_round_trips_and_is_written_as_schema_2() -> None:
    parents = ids(3)
    child = rec(after=parents, after_failure="run", after_done=2, after_pass="results")
    raw = msgpack.unpackb(child.to_bytes())
    assert raw["v"] == 2 and raw["after"] == list(parents)
    back = Record.from_bytes(child.to_bytes())
    assert back.after == parents and isinstance(back.after, tuple)
    assert (back.after_failure, back.after_done, back.after_pass, back.v) == (
        "run",
        2,
        "results",
        2,
    )
    # one field off its default is enough to mark the record for schema-2 readers
    assert msgpack.unpackb(rec(after_pass="ids").to_bytes())["v"] == 2


def _hostile(**fields: Any) -> bytes:
    raw = msgpack.unpackb(rec(after=ids(2)).to_bytes())
    raw.update(fields)
    return msgpack.packb(raw)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"after": "01JD2K7QABCDEFGHJKMNPQRSTV"}, "after"),
        ({"after": {"a": 1}}, "after"),
        ({"after": [1, 2]}, "after"),
        ({"after": ["01jd2k7qabcdefghjkmnpqrstv"]}, "after"),  # not canonical
        ({"after": ["8ZZZZZZZZZZZZZZZZZZZZZZZZZ"]}, "after"),  # past the ULID range
        ({"after": list(ids(1)) * 2}, "after"),
        ({"after": list(ids(MAX_AFTER + 1))}, "after"),
        ({"after_done": 3}, "after_done"),  # past its parents: claimable before them
        ({"after_done": -1}, "after_done"),
        ({"after_done": True}, "after_done"),
        ({"after_done": 1.0}, "after_done"),
        ({"after_failure": "ignore"}, "after_failure"),
        ({"after_failure": 1}, "after_failure"),
        ({"after_pass": "everything"}, "after_pass"),
        ({"after_pass": None}, "after_pass"),
    ],
)
def test_hostile_dependency_fields_are_refused(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(RecordError) as err:
        Record.from_bytes(_hostile(**fields))
    assert err.value.field == field


def test_a_record_that_names_itself_as_parent_is_refused() -> None:
    child = rec(after=ids(1))
    raw = msgpack.unpackb(child.to_bytes())
    raw["after"] = [child.id]
    with pytest.raises(RecordError, match="the invocation itself"):
        Record.from_bytes(msgpack.packb(raw))


def test_the_dependency_fields_are_checked_even_when_after_is_empty() -> None:
    # a hostile writer cannot hide a bad value behind an empty list of parents
    raw = msgpack.unpackb(rec().to_bytes())
    raw.update(after=[], after_done=1)
    with pytest.raises(RecordError) as err:
        Record.from_bytes(msgpack.packb(raw))
    assert err.value.field == "after_done"


# -- transitions -----------------------------------------------------------------------------


def test_a_child_is_not_claimed_before_every_parent_was_seen_done() -> None:
    child = rec(after=ids(2), after_done=1)
    with pytest.raises(IllegalTransition):
        lifecycle.claim(child, "w", "t", now=10.0)
    ready = dataclasses.replace(child, after_done=2)
    running = lifecycle.claim(ready, "w", "t", now=10.0)
    assert running.state == State.RUNNING and running.after_done == 2


def test_progress_only_moves_forward_and_only_while_queued() -> None:
    child = rec(after=ids(3), after_done=1)
    seen = lifecycle.parents_seen(child, 2)
    assert seen.after_done == 2 and seen.rev == child.rev + 1 and seen.state == State.QUEUED
    for done in (0, 1, 4):
        with pytest.raises(IllegalTransition):
            lifecycle.parents_seen(child, done)
    with pytest.raises(IllegalTransition):
        lifecycle.parents_seen(dataclasses.replace(child, state=State.RUNNING), 2)


def test_a_broken_parent_kills_the_child_and_names_the_parent() -> None:
    parents = ids(3)
    child = rec(after=parents, after_done=1)
    ended = lifecycle.parent_broke(child, 5.0, 2, "failed")
    assert ended.state == State.KILLED and ended.finished_at == 5.0
    assert ended.error is not None and ended.error["type"] == "ParentFailed"
    assert f"parent {parents[2]} failed" in ended.error["message"]
    assert ended.after_done == 2 and ended.rev == child.rev + 1  # one write
    for done in (0, 3):  # a parent already counted done cannot break it; nor one past them
        with pytest.raises(IllegalTransition):
            lifecycle.parent_broke(child, 5.0, done, "failed")
    with pytest.raises(IllegalTransition):
        lifecycle.parent_broke(dataclasses.replace(child, state=State.RUNNING), 5.0, 1, "x")
