"""Hostile bytes against every decoder a worker or a reader uses (issue 15, item 6 and the
fuzz bullet): values (arguments, results, frames, idempotency-key bodies), invocation records,
queue records, journal segments, topic posts and signs of life.

The decoders run in a child process (``tests/hostile_harness.py``), in a thread with a small
stack, so a segfault is seen as the child dying on a signal instead of taking pytest down.
Every input must give a value or a lakeshore error, quickly, and the child must live on.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakeshore import codec, keys
from lakeshore.errors import DecodeError, InvalidArgument, RecordError
from lakeshore.model.record import Blob, Record
from tests.handmade import deep_tuple, ext

ROOT = Path(__file__).resolve().parents[2]
MAX_DEPTH: int = getattr(codec, "MAX_DEPTH", 100)  # the limit the codec enforces
DECODERS = ["codec", "record", "queue", "segment", "topic", "sign_of_life"]
SLOW_S = 2.0  # no single input may take longer to decode (or refuse)
HANG_S = 60.0  # no answer at all this long: the child hangs


class Harness:
    """The child process, restarted after it dies."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        return subprocess.Popen(
            [sys.executable, "-m", "tests.hostile_harness"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def ask(self, decoder: str, data: bytes) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        req = {"decoder": decoder, "data": base64.b64encode(data).decode()}
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        line = proc.stdout.readline() if ready else ""
        if not line:
            if not ready:
                proc.kill()
            rc = proc.wait()
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            self._discard()
            raise AssertionError(
                f"decoder {decoder} on {len(data)} bytes ({data[:40]!r}...): "
                + ("no answer in {HANG_S} s" if not ready else f"the process died ({how})")
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self._discard()

    def _discard(self) -> None:
        """Forget the child, closing our ends of its pipes."""
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self.proc = None


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


def check(harness: Harness, decoder: str, data: bytes) -> dict[str, Any]:
    """Decode in the child; only a value or a lakeshore error, and quickly."""
    reply = harness.ask(decoder, data)
    assert reply["outcome"] in ("value", "lakeshore"), (decoder, data[:60], reply)
    assert reply["s"] < SLOW_S, (decoder, len(data), reply)
    return reply


# -- building hostile bytes by hand ------------------------------------------------------------


def deep_arrays(levels: int) -> bytes:
    return b"\x91" * levels + b"\x01"


def deep_maps(levels: int) -> bytes:
    return b"\x81\xa1k" * levels + b"\x01"


def ndarray(*items: Any) -> bytes:
    return ext(2, msgpack.packb(list(items), use_bin_type=True))


HUGE_DECLARED = [
    b"\xdb\xff\xff\xff\xffabc",  # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xffabc",  # bin32
    b"\xdd\xff\xff\xff\xff\x01",  # array32
    b"\xdf\xff\xff\xff\xff\x01\x01",  # map32
    b"\xc9\xff\xff\xff\xff\x01abc",  # ext32 (tuple)
    b"\xc9\xff\xff\xff\xff\x02abc",  # ext32 (ndarray)
    b"\x91\xdd\x7f\xff\xff\xff",  # array header inside an array
]

UNKNOWN_EXT = [
    ext(3, b"\x01"),
    ext(5, b""),
    ext(127, b"xyz"),
    ext(-128, b"\x00"),
    ext(-1, b"\x00\x00\x00\x01"),  # msgpack's own timestamp: not a lakeshore type
    msgpack.packb([1, msgpack.ExtType(9, b"x")]),
    msgpack.packb({"k": msgpack.ExtType(9, b"x")}),
]

LYING_ARRAYS = [
    ndarray("<f8", [10**12], b"\0" * 8),  # shape says 8 TB, the bytes are 8
    ndarray("<f8", [2, 2], b"\0" * 8),
    ndarray("|O", [1], b"\0" * 8),  # object dtype: pointers from a stranger
    ndarray("[('a', 'O')]", [1], b"\0" * 8),
    ndarray("i4,O", [1], b"\0" * 16),
    ndarray("<f8", [-1], b"\0" * 8),
    ndarray("<f8", "x", b"\0" * 8),
    ndarray("<f8", [True], b"\0" * 8),
    ndarray("<f8", [1] * 100, b"\0" * 8),
    ndarray("<f8", [0, 2**62, 2**62], b""),
    ndarray("<f8", [1], "not bytes"),
    ndarray("<f8", [1]),
    ndarray(b"<f8", [1], b"\0" * 8),
    ndarray("S0", [10**15], b""),
    ndarray("<f8", [1.5], b"\0" * 8),
    ext(2, msgpack.packb(["<f8", msgpack.ExtType(1, b"\x91\x01"), b"\0" * 8])),
    ext(2, b"\xc1"),
    ext(2, deep_tuple(300)),
]

VALUES = [
    deep_tuple(195),  # the 900-byte argument of the issue
    deep_tuple(480),
    deep_tuple(MAX_DEPTH + 1),
    deep_tuple(5000),
    deep_arrays(2000),
    deep_maps(2000),
    deep_arrays(MAX_DEPTH + 1),
    msgpack.packb([deep_tuple(300)] * 3, use_bin_type=True),
    ext(1, deep_arrays(1000)),
    ext(1, b"\x01"),  # a tuple whose payload is not an array
    b"\x81" + deep_tuple(300) + b"\x01",  # a deep tuple as a map key
    *HUGE_DECLARED,
    *UNKNOWN_EXT,
    *LYING_ARRAYS,
    b"",
    b"\xc1",
    b"\xa3ab",  # truncated str
    codec.encode({"a": [1, 2, (3, 4)]})[:-1],  # truncated
    b"\x01\x02",  # extra data
    b"\xa2\xff\xfe",  # not UTF-8
]


# made once: strategies must not draw from `random` (new ids and write ids do)
_RECORD = Record(id=keys.new_id(), ns="default", queue="q", fn="m:f", args=Blob(inline=b"\x90"))


def record_obj() -> dict[str, Any]:
    obj: dict[str, Any] = msgpack.unpackb(_RECORD.to_bytes())
    return obj


def segment(payload: Any, kind: Any = 0, attempt: Any = 1, first: Any = 0) -> bytes:
    return msgpack.packb({"a": attempt, "s": first, "f": [[kind, payload]]}, use_bin_type=True)  # type: ignore[no-any-return]


def post(payload: Any) -> bytes:
    body = msgpack.packb({"post": "00ff", "payload": payload}, use_bin_type=True)
    return segment(body, attempt=0)


LIFE = {"worker": "w", "queues": ["default"], "status": "idle", "running": 0, "done": 0}

CASES: list[tuple[str, bytes]] = [
    *[(d, v) for d in DECODERS for v in VALUES],
    *[("segment", segment(v)) for v in VALUES],
    *[("topic", post(v)) for v in VALUES],
    *[("record", msgpack.packb({**record_obj(), "args": {"inline": v}})) for v in VALUES[:3]],
    ("record", msgpack.packb({**record_obj(), "args": {"inline": 10**18}})),
    ("record", msgpack.packb({**record_obj(), "not_before": "soon"})),
    ("segment", msgpack.packb({"a": 1, "s": 0, "f": [[0, 10**18]]})),
    ("segment", msgpack.packb({"a": 1, "s": 0, "f": [[7, b"\xc0"]]})),
    ("segment", msgpack.packb({"a": "1", "s": 0, "f": []})),
    ("segment", msgpack.packb({"a": 1, "s": -5, "f": [[0, b"\xc0"]]})),
    ("segment", msgpack.packb({"a": 1, "s": 0, "f": [[0]]})),
    ("segment", msgpack.packb({"a": 1, "s": 0, "f": "ab"})),
    ("segment", msgpack.packb([1, 0, []])),
    ("topic", segment(msgpack.packb([1, 2]), attempt=0)),
    ("topic", segment(msgpack.packb({"payload": 5}), attempt=0)),
    ("topic", segment(msgpack.packb({"payload": "x"}), attempt=0)),
    ("topic", msgpack.packb({"a": 0, "s": 0, "f": []})),
    ("topic", msgpack.packb({"a": 0, "s": 0, "f": [[0, b"\xc0"], [0, b"\xc0"]]})),
    ("queue", msgpack.packb({"v": "2"})),
    ("queue", msgpack.packb({"v": 1, "rev": "x", "wid": 5})),
    ("queue", msgpack.packb({"v": 1, "max_depth": True, "on_full": ["reject"]})),
    ("queue", msgpack.packb({"v": 1, "lease_s": float("nan")})),
    ("queue", msgpack.packb([1, 2])),
    ("queue", msgpack.packb({"v": 1, "provider": msgpack.ExtType(1, b"\x90")})),
    ("queue", msgpack.packb({"v": 1, "provider": {"kind": "slurm", "partition": ["x"]}})),
    *[
        ("sign_of_life", codec.encode({**LIFE, "seen_at": 1e12, field: bad}))
        for field, bad in [
            ("queues", 5),
            ("queues", [1, None]),
            ("running_by_queue", [1]),
            ("running_by_queue", {"default": "x"}),
            ("seen_at", "now"),
            ("seen_at", None),
            ("seen_at", float("nan")),
            ("running", {"x": 1}),
        ]
    ],
    ("sign_of_life", codec.encode([1, 2, 3])),
    ("sign_of_life", codec.encode({"seen_at": (1, 2)})),
]


@pytest.mark.parametrize(
    ("decoder", "data"),
    CASES,
    ids=[f"{d}-{i}" for i, (d, _) in enumerate(CASES)],
)
def test_nasty_inputs_give_a_value_or_a_lakeshore_error_and_never_crash(
    harness: Harness, decoder: str, data: bytes
) -> None:
    check(harness, decoder, data)


def test_the_fixed_cases_cover_every_decoder(report: list[str]) -> None:
    decoders = sorted({d for d, _ in CASES})
    assert len(decoders) >= 6  # values, records, queue records, segments, posts, signs of life
    report.append(
        f"hostile bytes: {len(CASES)} fixed inputs to {len(decoders)} decoders in a child "
        "process, plus hypothesis fuzzing: no crash, no hang, a lakeshore error for each refusal"
    )


def test_the_deep_tuples_of_the_issue_are_refused_as_too_deep(harness: Harness) -> None:
    for levels in (195, 480):
        reply = check(harness, "codec", deep_tuple(levels))
        assert (reply["outcome"], reply["type"]) == ("lakeshore", "DecodeError")
        assert f"{MAX_DEPTH}" in reply["message"] and "deep" in reply["message"]
        reply = check(harness, "segment", segment(deep_tuple(levels)))
        assert reply["type"] == "DecodeError"


def test_lying_numpy_arrays_are_refused(harness: Harness) -> None:
    for data in LYING_ARRAYS:
        reply = check(harness, "codec", data)
        assert reply["outcome"] == "lakeshore", (data, reply)


def test_unknown_extension_types_are_refused_not_handed_over(harness: Harness) -> None:
    for data in UNKNOWN_EXT:
        reply = check(harness, "codec", data)
        assert reply["outcome"] == "lakeshore", (data, reply)


# -- random inputs (hypothesis) ----------------------------------------------------------------

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
)
structures = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(-5, 5), inner, max_size=4)
    ),
    max_leaves=12,
)
packed = structures.map(lambda v: msgpack.packb(v, use_bin_type=True))
hostile = (
    st.binary(max_size=600)
    | packed
    | st.sampled_from(VALUES)
    | st.builds(lambda v, cut: v[:cut], st.sampled_from(VALUES) | packed, st.integers(0, 64))
    | st.builds(
        lambda head, tail: head + tail, st.sampled_from(HUGE_DECLARED), st.binary(max_size=40)
    )
)
FIELDS = [f for f in record_obj() if f != "v"] + ["v"]


def mistyped_record(field: str, bad: Any) -> bytes:
    return msgpack.packb({**record_obj(), field: bad}, use_bin_type=True)  # type: ignore[no-any-return]


hostile_records = st.builds(mistyped_record, st.sampled_from(FIELDS), structures)
hostile_segments = st.builds(
    lambda a, s, f: msgpack.packb({"a": a, "s": s, "f": f}, use_bin_type=True),
    structures,
    structures,
    st.lists(st.lists(structures | st.sampled_from(VALUES), max_size=3), max_size=3) | structures,
)
hostile_lives = st.builds(
    lambda field, bad: codec.encode({**LIFE, "seen_at": 1e12, field: bad}),
    st.sampled_from([*LIFE, "seen_at", "running_by_queue"]),
    structures.filter(lambda v: not _has_ext(v)),
)


def _has_ext(v: Any) -> bool:
    if isinstance(v, msgpack.ExtType):
        return True
    if isinstance(v, list):
        return any(map(_has_ext, v))
    if isinstance(v, dict):
        return any(map(_has_ext, v.values()))
    return False


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.sampled_from(DECODERS), hostile)
def test_random_bytes_give_a_value_or_a_lakeshore_error(
    harness: Harness, decoder: str, data: bytes
) -> None:
    check(harness, decoder, data)


@FUZZ
@given(hostile_records)
def test_records_with_random_field_values_give_a_record_or_a_record_error(
    harness: Harness, data: bytes
) -> None:
    check(harness, "record", data)


@FUZZ
@given(hostile_segments)
def test_segments_of_random_shape_give_frames_or_a_lakeshore_error(
    harness: Harness, data: bytes
) -> None:
    check(harness, "segment", data)
    check(harness, "topic", data)


@FUZZ
@given(hostile_lives)
def test_signs_of_life_of_random_shape_are_read_or_skipped(harness: Harness, data: bytes) -> None:
    check(harness, "sign_of_life", data)


# -- the codec's limits, in process --------------------------------------------------------------


def nested(levels: int, kind: str) -> Any:
    v: Any = 1
    for _ in range(levels):
        v = (v,) if kind == "tuple" else [v] if kind == "list" else {"k": v}
    return v


@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_encode_refuses_a_value_nested_too_deep(kind: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        codec.encode(nested(MAX_DEPTH + 1, kind), "arguments of m:f")
    assert e.value.op == "encode arguments of m:f"
    assert f"{MAX_DEPTH}" in e.value.what and " — " in str(e.value)
    # far deeper than the recursion limit: refused the same way, not a RecursionError
    with pytest.raises(InvalidArgument):
        codec.encode(nested(100_000, kind))


@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_values_at_the_depth_limit_round_trip(kind: str) -> None:
    value = nested(MAX_DEPTH, kind)
    assert codec.decode(codec.encode(value)) == value


def test_a_self_containing_list_is_refused_at_encode() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidArgument):
        codec.encode(loop)


def test_too_deep_bytes_are_a_decode_error_in_process() -> None:
    for data in (deep_tuple(MAX_DEPTH + 1), deep_arrays(MAX_DEPTH + 1), deep_maps(MAX_DEPTH + 1)):
        with pytest.raises(DecodeError, match="deep"):
            codec.decode(data)


def test_numpy_arrays_still_round_trip() -> None:
    np = pytest.importorskip("numpy")
    for arr in (
        np.arange(12, dtype="<i4").reshape(3, 4),
        np.zeros((0, 5)),
        np.array([True, False]),
        np.array([b"ab", b"c"]),
        np.array(["x", "yz"]),
        np.array([1.5], dtype=">f8"),
        np.array(["2024-01-01"], dtype="datetime64[ns]"),
        np.float32(2.5) * np.ones((2, 2, 2), dtype=np.float32),
    ):
        back = codec.decode(codec.encode((arr, [arr])))
        assert back[0].dtype == arr.dtype and (back[0] == arr).all()
    with pytest.raises(InvalidArgument):
        codec.encode(np.array([object()]))


def test_every_record_decoder_error_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        Record.from_bytes(mistyped_record("not_before", "soon"))


@pytest.mark.parametrize(
    "fields",
    [{"rev": "x"}, {"wid": 5}, {"v": True}, {"max_depth": True}, {"lease_s": float("nan")}],
)
def test_a_mistyped_queue_record_is_a_record_error(fields: dict[str, Any]) -> None:
    from lakeshore.model.queue_config import QueueConfig

    with pytest.raises(RecordError):
        QueueConfig.from_bytes(msgpack.packb({"v": 1, **fields}))
