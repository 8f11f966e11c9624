"""Values on the wire: msgpack with a small registry of extension types.

Arguments, results and stream frames travel as msgpack. Plain msgpack would turn tuples into
lists, so a few extension types keep what users expect:

==== ================ =====================================================================
code type             payload
==== ================ =====================================================================
1    ``tuple``        msgpack array of the items
2    ``numpy.ndarray`` msgpack ``[dtype.str, shape, raw bytes]`` (C order; numpy optional)
==== ================ =====================================================================

Pickle never carries data: an object of any other type fails to encode with a message that
says what to send instead.
"""

from __future__ import annotations

import sys
from typing import Any

import msgpack

from lakeshore.errors import InvalidArgument, LakeshoreError

__all__ = ["DecodeError", "decode", "encode"]

_TUPLE = 1
_NDARRAY = 2
_SENDABLE = (
    "send None, bool, int, float, str, bytes, list, tuple, dict or numpy arrays; "
    "for files, write them to storage and pass their keys"
)


class DecodeError(LakeshoreError):
    """Bytes that should hold a lakeshore value do not (corrupt or foreign data)."""


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _packb(list(obj)))
    np = sys.modules.get("numpy")  # an ndarray can only exist if numpy was imported
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("numpy arrays of Python objects")
        arr = np.ascontiguousarray(obj)
        return msgpack.ExtType(_NDARRAY, _packb([arr.dtype.str, list(arr.shape), arr.tobytes()]))
    if isinstance(obj, int):  # msgpack hands over ints it cannot hold
        raise OverflowError(f"the integer {obj} (msgpack holds 64 bits; send it as a str)")
    if isinstance(obj, dict):  # dict subclasses (OrderedDict, defaultdict) as plain dicts
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    raise TypeError(f"type {type(obj).__module__}.{type(obj).__qualname__}")


def _packb(obj: Any) -> bytes:
    # strict_types: tuples (and subclasses) reach _default instead of becoming lists.
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)  # type: ignore[no-any-return]


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        return tuple(_unpackb(data))
    if code == _NDARRAY:
        try:
            import numpy as np
        except ImportError:
            raise DecodeError(
                "decode",
                "the value holds a numpy array but numpy is not installed here",
                "pip install numpy in this environment",
            ) from None
        dtype, shape, raw = _unpackb(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    return msgpack.ExtType(code, data)


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def encode(value: Any, what: str = "value") -> bytes:
    """Encode ``value`` as msgpack with lakeshore's extension types.

    Raises:
        InvalidArgument: ``value`` holds something that cannot be sent (the message names
            the type and what to send instead).
    """
    try:
        return _packb(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgument(
            f"encode {what}", f"cannot send {e}", _SENDABLE, type=str(e)
        ) from None


def decode(data: bytes, what: str = "value") -> Any:
    """Decode bytes made by :func:`encode`.

    Raises:
        DecodeError: the bytes are not a valid lakeshore value.
    """
    try:
        return _unpackb(data)
    except DecodeError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise DecodeError(
            f"decode {what}",
            f"the stored bytes are not a lakeshore value ({type(e).__name__}: {e})",
            "the object is corrupt or was written by another program; inspect it by hand",
        ) from None
