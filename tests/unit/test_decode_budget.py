"""What a decode builds is bounded per input byte (issue 31, finding 10c): a 32 MB array of
nils used to become a 256 MB list, an array of empty lists 64 bytes per byte, and a chain
of tuples one copy of the value per level.

Memory is measured with ``tracemalloc`` (which sees msgpack's allocations too); the inputs
are made before tracing starts, so the peak is what the decode itself built.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from lakeshore import codec
from lakeshore.errors import CorruptSegment, DecodeError, InvalidArgument, RecordError
from lakeshore.model.record import Record
from lakeshore.streams.journal import decode_segment

SLOT = 8  # bytes of one item's slot in a list


def array_of(n: int, item: bytes) -> bytes:
    """msgpack array32 of ``n`` copies of one encoded item."""
    return b"\xdd" + n.to_bytes(4, "big") + item * n


def peak_of(decode: Callable[[], Any]) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        decode()
        raised = None
    except Exception as e:
        raised = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def test_an_array_of_16_mib_of_nils_is_refused_before_its_list_is_built() -> None:
    data = array_of(16 << 20, b"\xc0")
    peak, raised = peak_of(lambda: codec.decode(data))
    assert isinstance(raised, DecodeError), raised
    assert "more items than" in raised.what
    assert peak < len(data), peak  # was 8.7 times the input: a 134 MB list


def test_many_lists_each_within_the_budget_are_refused_once_they_add_up() -> None:
    inner = array_of(1 << 20, b"\xc0")
    data = b"\xdc\x00\x10" + inner * 16  # 16 arrays of 1 Mi nils: 16 MiB
    peak, raised = peak_of(lambda: codec.decode(data))
    assert isinstance(raised, DecodeError), raised
    assert "build more than" in raised.what
    # the budget's slots, plus the list being built when it ran out
    assert peak < 4 * len(data), peak


@pytest.mark.slow
@pytest.mark.parametrize("empty", [b"\x90", b"\x80"], ids=["lists", "dicts"])
def test_empty_containers_are_charged_what_they_cost(empty: bytes) -> None:
    data = array_of(2 << 20, empty)  # one byte each, 56 to 64 bytes each once built
    peak, raised = peak_of(lambda: codec.decode(data))
    assert isinstance(raised, DecodeError), raised
    assert peak < 2 * SLOT * codec.item_budget(len(data)), peak  # was 144 MB


def test_a_chain_of_tuples_keeps_one_copy_of_the_value_not_one_per_level() -> None:
    value: Any = b"x" * (1 << 20)
    for _ in range(codec.MAX_DEPTH - 1):
        value = (value,)
    data = codec.encode(value)
    peak, raised = peak_of(lambda: codec.decode(data))
    assert raised is None
    assert peak < 4 * len(data), peak  # was 100 times the input


@pytest.mark.slow
def test_a_segment_of_a_million_empty_frames_is_corrupt_without_being_built() -> None:
    frames = array_of(1 << 20, b"\x92\x00\xc4\x00")  # [0, b""] a million times
    data = b"\x83\xa1a\x01\xa1s\x00\xa1f" + frames
    peak, raised = peak_of(lambda: decode_segment(data, "journal/0001/000000000000"))
    assert isinstance(raised, CorruptSegment), raised
    assert peak < 2 * SLOT * codec.item_budget(len(data)), peak


def test_a_record_of_8_mib_of_nils_is_refused_at_its_header() -> None:
    data = b"\x81\xa1v" + array_of(8 << 20, b"\xc0")
    peak, raised = peak_of(lambda: Record.from_bytes(data))
    assert isinstance(raised, RecordError), raised
    assert peak < len(data), peak


@pytest.mark.parametrize(
    "value",
    [
        list(range(1_000_000)),  # a million small ints, as an argument
        [7] * 4_000_000,
        [{"a": i, "b": "x"} for i in range(200_000)],
        ((list(range(1_000_000)),), {"scale": 2.0}),  # a call's arguments
    ],
    ids=["1M ints", "4M ints", "200k dicts", "call"],
)
def test_real_data_within_the_budget_still_round_trips(value: Any) -> None:
    assert codec.decode(codec.encode(value)) == value


def test_encode_refuses_a_value_no_reader_would_build_so_the_producer_learns_at_submit() -> None:
    with pytest.raises(InvalidArgument, match="numpy array") as e:
        codec.encode([0] * 5_000_000, "arguments of f")
    assert e.value.details["items"] > e.value.details["limit"]
    # what encode lets through, decode takes: the two count alike
    fits = [{"k": [1, 2]}] * (codec.ITEMS_FLOOR // 40)
    assert codec.decode(codec.encode(fits)) == fits
