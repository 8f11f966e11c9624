"""Property-based tests (hypothesis): the value codec, the record codec, the state machine,
and the validation of names, ids and data keys against hostile input."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lakeshore import codec, keys
from lakeshore.errors import DecodeError, IllegalTransition, InvalidArgument, RecordError
from lakeshore.model import lifecycle
from lakeshore.model.record import STATES, TERMINAL, Blob, Record
from lakeshore.scope import join

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers(-(2**63), 2**63 - 1), inner, max_size=5)
    ),
    max_leaves=20,
)


@given(values)
def test_codec_round_trips_any_value(value: Any) -> None:
    assert codec.decode(codec.encode(value)) == value


@given(st.binary(max_size=512))
def test_codec_refuses_garbage_with_its_own_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):  # the only way decoding may fail
        codec.decode(data)


@given(st.binary(max_size=512))
def test_record_codec_never_crashes_on_hostile_bytes(data: bytes) -> None:
    try:
        rec = Record.from_bytes(data)
    except RecordError:
        return
    assert rec.state in STATES


def base_record() -> Record:
    return Record(id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b"\x90"))


@given(st.integers(0, 300))
def test_truncated_records_are_refused_not_misread(cut: int) -> None:
    data = base_record().to_bytes()
    if cut >= len(data):
        return
    try:
        rec = Record.from_bytes(data[:cut])
    except RecordError:
        return
    raise AssertionError(f"a truncated record decoded: {rec}")


MOVES = [
    "claim",
    "heartbeat",
    "succeed",
    "fail",
    "fail_final",
    "expire",
    "cancel",
    "time_out",
    "release",
    "rerun",
]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(MOVES), st.floats(0, 100), st.booleans()), max_size=30))
def test_state_machine_invariants(steps: list[tuple[str, float, bool]]) -> None:
    """Random moves from random callers: each is legal (one write: rev + 1) or refused;
    leases exist exactly while running; attempts never go down; only a rerun leaves a
    terminal state; retries stop at max_attempts (released attempts aside)."""
    rec = base_record()
    now = 0.0
    token = ""
    for move, dt, right_token in steps:
        now += dt
        tok = token if right_token else "someone-else"
        before = rec
        try:
            if move == "claim":
                token = f"t{now}"
                rec = lifecycle.claim(rec, "w", token, now)
            elif move == "heartbeat":
                rec = lifecycle.heartbeat(rec, tok, now)
            elif move == "succeed":
                rec = lifecycle.succeed(rec, tok, None, now)
            elif move == "fail":
                rec = lifecycle.fail(rec, tok, {"type": "E", "message": "", "traceback": ""}, now)
            elif move == "fail_final":
                err = {"type": "E", "message": "", "traceback": ""}
                rec = lifecycle.fail(rec, tok, err, now, retry=False)
            elif move == "expire":
                rec = lifecycle.expire(rec, now)
            elif move == "cancel":
                rec = lifecycle.cancel(rec, now)
            elif move == "time_out":
                rec = lifecycle.time_out(rec, now, tok)
            elif move == "release":
                rec = lifecycle.release(rec, tok, now)
            else:
                rec = lifecycle.rerun(rec, now)
        except IllegalTransition:
            assert rec is before
            continue
        assert rec.rev == before.rev + 1 and rec.wid != before.wid
        assert rec.attempt >= before.attempt
        assert (rec.state == "running") == (rec.lease is not None)
        if before.state in TERMINAL:
            assert move == "rerun"
        if move == "fail" and rec.state == "queued":
            assert rec.attempt - rec.released <= rec.max_attempts
        assert Record.from_bytes(rec.to_bytes()) == rec


NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}\Z")


@given(st.text(max_size=80))
def test_names_accepted_are_safe_path_segments(name: str) -> None:
    try:
        keys.check_name(name, "queue")
    except InvalidArgument:
        assert not NAME.match(name)
        return
    assert NAME.match(name) and "/" not in name and name not in (".", "..")
    assert (
        keys.QueueKeys("default", name)
        .record(keys.new_id())
        .startswith(f"lakeshore/default/{name}/")
    )


@given(st.text(max_size=40))
def test_ids_accepted_are_ulids(text: str) -> None:
    try:
        inv = keys.check_id(text)
    except InvalidArgument:
        return
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", inv)


segment = st.sampled_from(["a", "b", "..", ".", "", "x y", "é", "~", "c.txt"])


@given(
    st.lists(segment, max_size=6).map("/".join),
    st.lists(segment, max_size=8).map("/".join) | st.text(max_size=30),
)
def test_data_keys_never_leave_the_root(prefix: str, key: str) -> None:
    try:
        base = join("", prefix)
        full = join(base, key)
    except InvalidArgument:
        return
    parts = full.split("/") if full else []
    assert ".." not in parts and "." not in parts and "" not in parts
    assert not full.startswith("/") and "://" not in full and "?" not in full
