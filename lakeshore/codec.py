"""Values on the wire: msgpack with two extension types (``tuple``, ``numpy.ndarray``).

Arguments, results, stream frames and topic posts travel as msgpack; the extension types keep a
tuple a tuple and carry arrays. Pickle never carries data: a value of any other type fails to
encode, with a message that says what to send instead.

Decoding treats the bytes as hostile (anyone who can write to the bucket can write them) and
never crashes the process: depth (:data:`MAX_DEPTH`), declared lengths, extension codes, array
shapes and the items a decode builds (:func:`item_budget`) are all bounded, and ``encode``
applies the same bounds, so a producer learns at submit, not a worker at decode. Nested tuples
are decoded level by level in a loop of our own, never by msgpack calling back into itself:
each such callback held a whole unpacker on the C stack, and a few hundred levels overflowed
it (a segfault, which no ``except`` can catch).

The format and each limit: docs/record.md#encoding-and-the-schema-version.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import msgpack

from lakeshore.errors import DecodeError, InvalidArgument

__all__ = [
    "BYTES_PER_ITEM",
    "CONTAINER_ITEMS",
    "DICT_ENTRY_ITEMS",
    "ITEMS_CEILING",
    "ITEMS_FLOOR",
    "MAX_DEPTH",
    "decode",
    "decode_call",
    "encode",
    "item_budget",
    "pack_plain",
    "unpack_plain",
]

MAX_DEPTH = 100  # containers inside containers; real data stays far below it
# The budget of items a decode may build from n bytes (see the module docstring): a list
# of 4 million small ints, of 200,000 small dicts or of 20 million floats fits; denser data
# goes as a numpy array or a file.
ITEMS_FLOOR = 1 << 22
ITEMS_CEILING = 1 << 25  # 256 MiB of slots, whatever the input's size
BYTES_PER_ITEM = 8
CONTAINER_ITEMS = 8  # an empty list is 56 bytes, an empty dict 64: about 8 slots
DICT_ENTRY_ITEMS = 6  # a dict of n entries takes 37 n to 48 n bytes, past the smallest
_RULE = (
    f"an item per element of a list or tuple, {DICT_ENTRY_ITEMS} per dict entry, "
    f"{CONTAINER_ITEMS} per list, tuple or dict; at most {ITEMS_FLOOR} plus one per "
    f"{BYTES_PER_ITEM} bytes, never over {ITEMS_CEILING}"
)
# msgpack's first buffer. Its default, 1 MiB, is allocated on every call: packing a tuple
# inside a tuple (every invocation's arguments) then cost a fresh mmap each, 5x the rest of the
# encoding, and records churned the heap. The buffer grows as needed for large values.
PACK_BUFFER = 4096
_MAX_NDIM = 64  # numpy's own limit (32 before numpy 2)
_TUPLE = 1
_NDARRAY = 2
_SENDABLE = (
    "send None, bool, int, float, str, bytes, list, tuple, dict or numpy arrays; "
    "for files, write them to storage and pass their keys"
)
_LEAVES = frozenset({type(None), bool, int, float, str, bytes})
# dtype.str of every array the codec sends: bool, ints, floats, complex, bytes, unicode,
# void and datetimes; never objects, never structured descriptions
_DTYPE = re.compile(
    r"[<>|=]?(?:b1|[iu][1248]|f(?:2|4|8|12|16)|c(?:8|16|24|32)|[SUV][1-9]\d{0,9}"
    r"|[Mm]8(?:\[\d{0,6}[A-Za-z]{1,2}\])?)\Z"
)


class _Deferred:
    """A tuple whose payload is decoded after msgpack returns (see the module docstring)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def item_budget(size: int) -> int:
    """How many items a decode may build from ``size`` bytes (see the module docstring)."""
    return min(ITEMS_CEILING, ITEMS_FLOOR + size // BYTES_PER_ITEM)


# The most items one byte can add: an empty list (or dict) as an element, 1 + 8. Every byte
# of a value is decoded at one level only (a tuple's payload is opaque to its parent's), so
# all levels of a decode of n bytes build at most this many times n items.
_MOST_ITEMS_PER_BYTE = 1 + CONTAINER_ITEMS


def _counted(size: int) -> bool:
    """Whether a decode of ``size`` bytes must count what it builds: fewer bytes (up to about
    450 KiB) cannot build more than the budget whatever they hold, and are decoded without
    the hooks, which cost a call per container."""
    return _MOST_ITEMS_PER_BYTE * size > item_budget(size)


class _Budget:
    """The items one decode may still build; msgpack's hooks charge each container as it
    is completed, and the first one over the budget stops the decode."""

    __slots__ = ("counted", "left", "limit", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.limit = self.left = item_budget(size)
        self.counted = _counted(size)

    def charge(self, items: int) -> None:
        self.left -= items + CONTAINER_ITEMS
        if self.left < 0:
            raise _bad(f"its {self.size} bytes build more than {self.limit} items ({_RULE})")

    def list_hook(self, items: list[Any]) -> list[Any]:
        self.charge(len(items))
        return items

    def map_hook(self, items: dict[Any, Any]) -> dict[Any, Any]:
        self.charge(DICT_ENTRY_ITEMS * len(items))
        return items

    def limits(self, n: int) -> dict[str, Any]:
        """msgpack's options for ``n`` bytes: no declared length beyond the bytes there or
        the budget left (msgpack derives the first bound itself; spelled out so that no
        version of it can differ), and the hooks that charge what is built."""
        if not self.counted:
            return {
                "max_str_len": n,
                "max_bin_len": n,
                "max_array_len": n,
                "max_map_len": n // 2,
                "max_ext_len": n,
            }
        left = max(0, self.left)
        return {
            "max_str_len": n,
            "max_bin_len": n,
            "max_array_len": min(n, left),
            "max_map_len": min(n // 2, left // DICT_ENTRY_ITEMS),
            "max_ext_len": n,
            "list_hook": self.list_hook,
            "object_hook": self.map_hook,
        }


def unpack_plain(data: bytes) -> Any:
    """Plain msgpack (no extension types: the store's own objects, such as records and
    journal segments) with the item budget of :func:`decode`; map keys are str or bytes.

    Raises:
        DecodeError: more items than the budget allows.
        ValueError, TypeError: not msgpack (msgpack's own errors: callers turn them into
            their own, as for any corrupt object).
    """
    return msgpack.unpackb(data, raw=False, **_Budget(len(data)).limits(len(data)))


def _check_depth(value: Any, what: str) -> int:
    """Refuse a value nested deeper than MAX_DEPTH (iterative: any depth is measured
    safely); the items a decode of it builds, counted as :class:`_Budget` counts them."""
    count = 0
    stack = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, dict):
            items: Any = [*obj.keys(), *obj.values()]
            count += DICT_ENTRY_ITEMS * len(obj) + CONTAINER_ITEMS
        elif isinstance(obj, list | tuple):
            items = obj
            count += len(obj) + CONTAINER_ITEMS
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidArgument(
                f"encode {what}",
                f"the value nests lists, tuples and dicts more than {MAX_DEPTH} levels deep",
                "flatten it (or send it as JSON text, or write it to a file and pass its key)",
                limit=MAX_DEPTH,
            )
        if not _LEAVES.issuperset(map(type, items)):  # flat containers cost no Python loop
            stack.extend((x, depth + 1) for x in items if type(x) not in _LEAVES)
    return count


def _check_dtype(dtype: Any) -> None:
    if dtype.hasobject or not _DTYPE.match(dtype.str):
        raise TypeError(
            f"numpy arrays of dtype {dtype.str!r} (only plain numeric, bool, "
            "bytes, str and datetime dtypes)"
        )


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _packb(list(obj)))
    np = sys.modules.get("numpy")  # an ndarray can only exist if numpy was imported
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("numpy arrays of Python objects")
        _check_dtype(obj.dtype)
        arr = np.ascontiguousarray(obj)
        return msgpack.ExtType(_NDARRAY, _packb([arr.dtype.str, list(arr.shape), arr.tobytes()]))
    if isinstance(obj, int):  # msgpack hands over ints it cannot hold
        raise OverflowError(f"the integer {obj} (msgpack holds 64 bits; send it as a str)")
    if isinstance(obj, dict):  # dict subclasses (OrderedDict, defaultdict) as plain dicts
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, str) and type(obj).__module__.startswith("lakeshore."):
        # lakeshore's own StrEnums (a record's state, a body's kind): sent as the text they
        # stand for, which is what they were before they were enums
        return str(obj)
    raise TypeError(f"type {type(obj).__module__}.{type(obj).__qualname__}")


def _packb(obj: Any) -> bytes:
    # strict_types: tuples (and subclasses) reach _default instead of becoming lists.
    packer = msgpack.Packer(
        default=_default, strict_types=True, use_bin_type=True, buf_size=PACK_BUFFER
    )
    return packer.pack(obj)  # type: ignore[no-any-return]


def pack_plain(obj: Any) -> bytes:
    """msgpack of plain data (maps, lists, str, bytes, numbers; no extension types): the
    store's own objects, such as records and journal segments."""
    return msgpack.Packer(use_bin_type=True, buf_size=PACK_BUFFER).pack(obj)  # type: ignore[no-any-return]


def _bad(what: str) -> DecodeError:
    return DecodeError(
        "decode",
        what,
        "the object is corrupt or was written by another program; inspect it by hand",
    )


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        return _Deferred(data)
    if code == _NDARRAY:
        return _ndarray(data)
    raise _bad(f"extension type {code} is not one lakeshore writes")


def _ndarray(data: bytes) -> Any:
    try:
        import numpy as np
    except ImportError:
        raise DecodeError(
            "decode",
            "the value holds a numpy array but numpy is not installed here",
            "pip install numpy in this environment",
        ) from None
    # plain msgpack, no extension types: an ext in here stays an ExtType and is refused below;
    # [dtype, shape, raw] holds no map and no list longer than a shape
    n = len(data)
    parts = msgpack.unpackb(
        data, raw=False, max_str_len=n, max_bin_len=n, max_array_len=_MAX_NDIM, max_map_len=0
    )
    if not (type(parts) is list and len(parts) == 3):
        raise _bad("a numpy array is not [dtype, shape, bytes]")
    dtype_str, shape, raw = parts
    if type(dtype_str) is not str or not _DTYPE.match(dtype_str):
        raise _bad(
            f"numpy dtype {str(dtype_str)[:40]!r} is not a plain numeric, bool or bytes dtype"
        )
    dtype = np.dtype(dtype_str)
    if dtype.hasobject or dtype.itemsize < 1:
        raise _bad(f"numpy dtype {dtype_str!r} cannot be sent")
    if type(raw) is not bytes:
        raise _bad("a numpy array's data is not bytes")
    if (
        type(shape) is not list
        or len(shape) > _MAX_NDIM
        or not all(type(d) is int and 0 <= d < 2**62 for d in shape)
    ):
        raise _bad(f"numpy shape is not a list of at most {_MAX_NDIM} sizes >= 0")
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise _bad(f"numpy shape {shape[:8]} of {dtype_str} does not match {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _unpack_level(data: bytes, budget: _Budget | None) -> Any:
    """One level: nested tuples come back as _Deferred; what it builds is charged to
    ``budget``, which the levels of one value share (None: a value too small to need it)."""
    if budget is not None:
        limits = budget.limits(len(data))
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, **limits)
    n = len(data)
    return msgpack.unpackb(
        data,
        ext_hook=_ext_hook,
        raw=False,
        strict_map_key=False,
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n // 2,
        max_ext_len=n,
    )


def _finish(obj: Any, depth: int, budget: _Budget | None) -> Any:
    """Check the depth of ``obj`` (a container at nesting level ``depth``) and decode its
    deferred tuples, bottom up. Recursion is bounded: it stops at MAX_DEPTH."""
    t = type(obj)
    if t in _LEAVES:
        return obj
    if depth > MAX_DEPTH:
        raise _bad(f"the value nests lists, tuples and dicts more than {MAX_DEPTH} levels deep")
    if t is list:
        if not _LEAVES.issuperset(map(type, obj)):
            for i, x in enumerate(obj):
                if type(x) not in _LEAVES:
                    obj[i] = _finish(x, depth + 1, budget)
        return obj
    if t is dict:
        if _LEAVES.issuperset(map(type, obj)):
            if not _LEAVES.issuperset(map(type, obj.values())):
                for k, v in obj.items():
                    if type(v) not in _LEAVES:
                        obj[k] = _finish(v, depth + 1, budget)
            return obj
        return {
            _finish(k, depth + 1, budget): _finish(v, depth + 1, budget) for k, v in obj.items()
        }
    if t is _Deferred:
        # let go of this level's bytes once read: a chain of tuples would otherwise keep a
        # copy of the value alive per level (100 levels: 100 times the input)
        data, obj.data = obj.data, b""
        items = _unpack_level(data, budget)
        del data
        if type(items) is not list:
            raise _bad("a tuple's payload is not an array")
        return tuple(_finish(items, depth, budget))
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:  # built and checked by _ndarray
        return obj
    raise _bad(f"a {t.__name__} is not a lakeshore value")


def encode(value: Any, what: str = "value") -> bytes:
    """Encode ``value`` as msgpack with lakeshore's extension types.

    Raises:
        InvalidArgument: ``value`` holds something that cannot be sent (the message names
            the type and what to send instead), nests deeper than :data:`MAX_DEPTH`, or is
            more items than a decoder accepts from its bytes (:func:`item_budget`).
    """
    items = _check_depth(value, what)
    try:
        data = _packb(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgument(
            f"encode {what}", f"cannot send {e}", _SENDABLE, type=str(e)
        ) from None
    limit = item_budget(len(data))
    if items > limit:
        raise InvalidArgument(
            f"encode {what}",
            f"the value counts {items} items in {len(data)} bytes, more than a reader builds "
            f"from that many bytes ({limit}; {_RULE})",
            "send many small numbers as a numpy array, or write the data to a file and pass "
            "its key",
            items=items,
            limit=limit,
        )
    return data


def decode(data: bytes, what: str = "value") -> Any:
    """Decode bytes made by :func:`encode`; safe on any bytes (see the module docstring).

    Raises:
        DecodeError: the bytes are not a valid lakeshore value, or hold one nested deeper
            than :data:`MAX_DEPTH`, or more items than :func:`item_budget` allows them, or
            an unknown extension type, or a malformed array.
    """
    budget = _Budget(len(data)) if _counted(len(data)) else None
    try:
        return _finish(_unpack_level(data, budget), 1, budget)
    except DecodeError as e:
        raise DecodeError(f"decode {what}", e.what, e.todo) from None
    except Exception as e:  # msgpack raises several unrelated types for bad input
        if isinstance(e, ValueError) and " exceeds max_" in str(e):  # refused at a header
            what_happened = (
                f"a list or dict in its {len(data)} bytes declares more items than the bytes "
                f"hold or than a decode builds from them ({item_budget(len(data))}; {_RULE})"
            )
        else:
            what_happened = (
                f"the stored bytes are not a lakeshore value ({type(e).__name__}: {str(e)[:200]})"
            )
        raise DecodeError(
            f"decode {what}",
            what_happened,
            "the object is corrupt or was written by another program; inspect it by hand",
        ) from None


def decode_call(data: bytes, what: str = "arguments") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Decode a call's arguments, the pair ``(positional tuple, keyword dict)`` a submit
    encodes; anything else (someone else's bytes) is refused, never unpacked.

    Raises:
        DecodeError: not a lakeshore value, or not a (tuple, dict of str) pair.
    """
    value = decode(data, what)
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], tuple)
        and isinstance(value[1], dict)
        and all(isinstance(k, str) for k in value[1])
    ):
        return value[0], value[1]
    raise DecodeError(
        f"decode {what}",
        f"not a call's arguments (a {type(value).__name__}, not a pair of a tuple and a dict)",
        "submit through lakeshore; these bytes were written by something else",
    )
