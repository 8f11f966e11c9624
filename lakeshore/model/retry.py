"""Retry rules: which failures of a body are retried, and how long the next attempt waits.

Pure: names and numbers in, a verdict out. A record carries its rule as text
(``retry_for``, ``no_retry_for``: exception type names) and numbers (``retry_backoff_s``,
``retry_backoff_cap_s``, ``retry_jitter``); the worker matches the names against the
classes of the exception the body raised, spelled as :func:`lakeshore.running.failure.kinds_of`
spells them. Nothing a record names is ever imported: matching is comparing text.

The rule, in order (docs/retries.md):

1. a body that raised ``lakeshore.Permanent`` fails at once (decided where it was raised);
2. a class of the exception named in ``no_retry_for``: fail at once;
3. ``retry_for`` not empty and none of the classes named in it: fail at once;
4. else retry while attempts remain.

Failures that are not the body's own exception (a lease that ran out, a worker's child
that died, a store that was away before the body started) carry no class names and are
retried as before while attempts remain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from lakeshore.errors import InvalidArgument

__all__ = [
    "DEFAULT_BACKOFF_CAP_S",
    "MAX_BACKOFF_CAP_S",
    "MAX_NAMES",
    "MAX_NAME_BYTES",
    "check_backoff",
    "check_names",
    "name_problem",
    "number_problem",
    "retries",
]

DEFAULT_BACKOFF_CAP_S = 300.0  # what every backoff was capped at before the cap was a field
MAX_BACKOFF_CAP_S = 3600.0  # the longest cap a record may ask for (lifecycle.MAX_BACKOFF_S)
MAX_NAMES = 32  # names in one list: a rule, not a catalogue
MAX_NAME_BYTES = 256  # one name, "module.QualName"
# A class's dotted name: identifier characters (any script), dots, and the "<locals>" of
# a class defined in a function. No spaces, no control characters: it is shown to people.
_NAME = re.compile(r"[\w.<>]+\Z")


def name_problem(name: Any) -> str | None:
    """What is wrong with one exception type name, or None when it is a valid one."""
    if type(name) is not str:
        return f"must be a str, got a {type(name).__name__}"
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_NAME_BYTES:
        return f"must be 1 to {MAX_NAME_BYTES} bytes, got {size}"
    if not _NAME.match(name) or name.startswith(".") or name.endswith(".") or ".." in name:
        return f"is not a dotted class name: {name[:60]!r}"
    return None


def check_names(names: Iterable[str], option: str, op: str) -> tuple[str, ...]:
    """Exception type names as a record keeps them: without repeats, in the order given.

    Raises:
        InvalidArgument: more than :data:`MAX_NAMES`, or a name that is not a dotted class
            name of at most :data:`MAX_NAME_BYTES` bytes.
    """
    out: list[str] = []
    for name in names:
        problem = name_problem(name)
        if problem is not None:
            raise InvalidArgument(
                op,
                f"{option}: a type name {problem}",
                "pass exception classes, or their names as 'module.QualName'",
                option=option,
            )
        if name not in out:
            out.append(name)
    if len(out) > MAX_NAMES:
        raise InvalidArgument(
            op,
            f"{option} names {len(out)} types, over the limit of {MAX_NAMES}",
            "name a common base class instead of each subclass",
            option=option,
        )
    return tuple(out)


def number_problem(name: str, value: Any) -> str | None:
    """What is wrong with a backoff setting, or None: ``retry_backoff_cap_s`` is a finite
    number from 0 to :data:`MAX_BACKOFF_CAP_S`, ``retry_jitter`` from 0 to 1, and
    ``retry_backoff_s`` any finite number >= 0."""
    high = {"retry_jitter": 1.0, "retry_backoff_s": math.inf}.get(name, MAX_BACKOFF_CAP_S)
    if (type(value) is int or type(value) is float) and math.isfinite(value) and 0 <= value <= high:
        return None
    shown = repr(value)[:40] if type(value) in (int, float, bool, str) else type(value).__name__
    return f"must be a number from 0 to {high:g}, got {shown}"


def check_backoff(name: str, value: Any, op: str) -> float:
    """A backoff setting given to a submit or a decorator, as a float.

    Raises:
        InvalidArgument: out of its range (see :func:`number_problem`).
    """
    problem = number_problem(name, value)
    if problem is not None:
        raise InvalidArgument(op, f"{name} {problem}", f"pass {name} within its range")
    return float(value)


def retries(
    retry_for: tuple[str, ...], no_retry_for: tuple[str, ...], kinds: tuple[str, ...]
) -> bool:
    """Whether a failure whose exception has the classes ``kinds`` (most derived first)
    may be retried under the rule (attempts left are the caller's to check). A failure
    with no classes is not the body's exception: it is retried as before."""
    if not kinds:
        return True
    if no_retry_for and any(k in no_retry_for for k in kinds):
        return False
    return not retry_for or any(k in retry_for for k in kinds)
