"""The one error tree of lakeshore.

Every error raised by lakeshore derives from :class:`LakeshoreError`. Kinds are coarse on
purpose: callers branch on *what they can do about it* (retry after a re-read, fix the input,
check the store), not on which server said what. Messages follow one form,
``"<op>: <what happened> — <what to do>"``, and the pieces are kept as attributes so that
programs never have to parse the text.

Store backends translate their native failures (``botocore`` errors, ``OSError``) into this
tree once, at the store boundary; nothing above the store layer sees a backend exception.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Conflict",
    "Failed",
    "InvalidArgument",
    "JobError",
    "Killed",
    "LakeshoreError",
    "NotFinished",
    "NotFound",
    "PermissionDenied",
    "StoreError",
    "StoreUnavailable",
    "TimedOut",
    "TooLarge",
]


class LakeshoreError(Exception):
    """Root of every lakeshore error.

    Attributes:
        op: the operation that failed, e.g. ``"put lakeshore/default/q/_queue"``.
        what: what happened, in plain words.
        todo: what the caller can do about it.
        details: structured extras (key, etag, status code, …) for programs.
    """

    def __init__(self, op: str, what: str, todo: str, **details: Any) -> None:
        self.op = op
        self.what = what
        self.todo = todo
        self.details: dict[str, Any] = details
        super().__init__(f"{op}: {what} — {todo}")

    def __getattr__(self, name: str) -> Any:
        # Structured data reads as attributes (err.key, err.status) without a subclass per field.
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(name)

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (workers in child processes); keep them picklable.
        return (_rebuild, (type(self), self.op, self.what, self.todo, self.details))


def _rebuild(
    cls: type[LakeshoreError], op: str, what: str, todo: str, details: dict[str, Any]
) -> LakeshoreError:
    return cls(op, what, todo, **details)


class NotFound(LakeshoreError, KeyError):
    """The object (or invocation, or queue) does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return Exception.__str__(self)


class Conflict(LakeshoreError):
    """A conditional write lost its condition: someone else wrote first.

    This is the normal outcome of a lost race, not a failure: re-read the object and decide
    again (retry, or move on).
    """


class InvalidArgument(LakeshoreError, ValueError):
    """Bad input from the caller: a malformed key, URL, name or setting."""


class PermissionDenied(LakeshoreError):
    """The store refused the credentials or the operation (S3 403)."""


class StoreError(LakeshoreError):
    """The store failed in a way that retrying will not fix (missing bucket, unsupported
    feature, corrupt local object)."""


class TooLarge(StoreError):
    """An object is larger than the reader allows (``get(key, max_bytes=...)``): it was not
    read. Attributes: ``key``, ``size``, ``limit``."""


class StoreUnavailable(StoreError):
    """The store could not be reached or kept failing transiently after every retry."""


class JobError(LakeshoreError):
    """An invocation ended in a terminal state other than ``succeeded``.

    Attributes (besides ``op``/``what``/``todo``): ``id``, ``state``, ``remote_type``,
    ``remote_message`` and ``remote_traceback`` — the remote error as text, never unpickled.
    """


class Failed(JobError):
    """The body raised on its last attempt (or every attempt failed)."""


class Killed(JobError):
    """The invocation was cancelled (queued or running)."""


class TimedOut(JobError):
    """The body ran past ``timeout_s``, or the invocation waited past its deadline."""


class NotFinished(LakeshoreError, TimeoutError):
    """``result(timeout=…)`` gave up waiting; the invocation is still queued or running."""
