"""How a body's exception is named for the retry rule, on both sides of the queue.

A submitter names exception types (classes, or their names as text) in ``retry_for`` and
``no_retry_for``; the record keeps the names (:mod:`lakeshore.model.retry`). A worker names
the classes of the exception a body raised the same way (:func:`kinds_of`) and compares
text: nothing a record names is imported. Where the body runs in a child process, the child
sends the names with the error, so the decision is the parent's like any other.

A name is ``"module.QualName"``, builtins bare (``"ValueError"``), as the record's error
``type`` already spells them. A class of a script is named after the script's module when
it was run with ``python -m pkg.mod``, else ``__main__``, whichever process names it (a
body process imports the worker's script as ``__mp_main__``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lakeshore.errors import InvalidArgument
from lakeshore.model.retry import check_backoff, check_names

__all__ = ["MAX_KINDS", "RetryOptions", "kinds_of", "rule_names", "type_name"]

MAX_KINDS = 64  # classes of one exception named: deeper hierarchies are cut at their root end


def _module(name: str) -> str:
    if name in ("__main__", "__mp_main__"):
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        return spec.name if spec is not None and spec.name else "__main__"
    return name


def type_name(cls: type) -> str:
    """``"module.QualName"`` of a class; a builtin's bare name (``"ValueError"``)."""
    module = _module(getattr(cls, "__module__", None) or "?")
    qualname = getattr(cls, "__qualname__", None) or cls.__name__
    return qualname if module == "builtins" else f"{module}.{qualname}"


def kinds_of(exc: BaseException) -> tuple[str, ...]:
    """The names of the classes of ``exc``, most derived first (its MRO)."""
    return tuple(type_name(c) for c in type(exc).__mro__[:MAX_KINDS])


def rule_names(value: Any, option: str, op: str) -> tuple[str, ...]:
    """The type names a ``retry_for`` or ``no_retry_for`` option gives: an exception class,
    a name ``"module.QualName"``, or an iterable of those (``builtins.`` is dropped from a
    name, as the worker names builtins bare).

    Raises:
        InvalidArgument: something else, a class that is not an exception, or names over
            the limits of :func:`lakeshore.model.retry.check_names`.
    """
    items: Iterable[Any] = (
        (value,) if isinstance(value, (type, str)) else _iterable(value, option, op)
    )
    names: list[str] = []
    for item in items:
        if isinstance(item, type) and issubclass(item, BaseException):
            names.append(type_name(item))
        elif isinstance(item, str):
            names.append(item.removeprefix("builtins."))
        else:
            raise InvalidArgument(
                op,
                f"{option} takes exception classes or their names, got {_shown(item)}",
                "pass e.g. ValueError, 'mypkg.errors.BadInput', or a list of them",
                option=option,
            )
    return check_names(names, option, op)


def _iterable(value: Any, option: str, op: str) -> Iterable[Any]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    raise InvalidArgument(
        op,
        f"{option} takes exception classes or their names, got {_shown(value)}",
        "pass a class, a name, or a list of them",
        option=option,
    )


def _shown(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__qualname__} (not an exception)"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class RetryOptions:
    """A retry rule as a decorator or a submit gives it; None: not given here (the next
    level decides: a submit's options, then the function's, then the queue's and the
    plane's defaults). Built by :meth:`given`, which checks every value."""

    retry_for: tuple[str, ...] | None = None
    no_retry_for: tuple[str, ...] | None = None
    backoff_s: float | None = None
    backoff_cap_s: float | None = None
    jitter: float | None = None

    @classmethod
    def given(
        cls,
        op: str,
        retry_for: Any = None,
        no_retry_for: Any = None,
        retry_backoff_s: Any = None,
        retry_backoff_cap_s: Any = None,
        retry_jitter: Any = None,
    ) -> RetryOptions:
        """The options as given (exception classes or names; numbers), checked.

        Raises:
            InvalidArgument: a type list over its limits or of something else than
                exception classes and names, or a number out of its range.
        """

        def number(name: str, value: Any) -> float | None:
            return None if value is None else check_backoff(name, value, op)

        return cls(
            None if retry_for is None else rule_names(retry_for, "retry_for", op),
            None if no_retry_for is None else rule_names(no_retry_for, "no_retry_for", op),
            number("retry_backoff_s", retry_backoff_s),
            number("retry_backoff_cap_s", retry_backoff_cap_s),
            number("retry_jitter", retry_jitter),
        )

    def over(self, under: RetryOptions) -> RetryOptions:
        """These options, with what they leave open taken from ``under``."""
        return RetryOptions(
            *(
                mine if mine is not None else theirs
                for mine, theirs in zip(
                    dataclasses.astuple(self), dataclasses.astuple(under), strict=True
                )
            )
        )
