"""The one error tree of lakeshore: every error class it defines lives here.

Every error raised by lakeshore derives from :class:`LakeshoreError`. The classes are few on
purpose: callers branch on *what they can do about it* (retry after a re-read, fix the input,
check the store), not on which server said what. Messages read
``"<op>: <what happened> — <what to do>"``, and the parts are attributes, so programs never
parse the text. Store backends translate their native failures (``botocore`` errors,
``OSError``) into this tree once, at the store boundary: nothing above it sees their errors.

:class:`Unsendable` never reaches a caller: the worker makes it the invocation's outcome.
:class:`Stopped` and :class:`Abandoned` stand outside the tree on purpose: they unwind a
stopped body or an abandoned slot thread, and a body's ``except LakeshoreError`` must not
swallow them.

The tree, class by class: docs/store-contract.md#errors.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Abandoned",
    "Conflict",
    "CorruptSegment",
    "DecodeError",
    "Failed",
    "Fenced",
    "HookFailed",
    "IllegalTransition",
    "InvalidArgument",
    "JobError",
    "KeyReused",
    "Killed",
    "LakeshoreError",
    "MapFailed",
    "NewerRecord",
    "NotFinished",
    "NotFound",
    "Permanent",
    "PermissionDenied",
    "ProviderError",
    "QueueFull",
    "RecordError",
    "Stopped",
    "StoreError",
    "StoreUnavailable",
    "TimedOut",
    "TooLarge",
    "TopicClosed",
    "UnknownFunction",
    "UnreturnedWrite",
    "Unsendable",
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


class Fenced(Conflict):
    """The attempt lost its lease (cancelled, expired, or taken over) before it could write:
    a body's files were not uploaded, a consumer's ack or nack was not applied."""


class InvalidArgument(LakeshoreError, ValueError):
    """Bad input from the caller: a malformed key, URL, name or setting."""


class UnreturnedWrite(InvalidArgument):
    """A body wrote a key and did not return or yield it."""


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


class RecordError(StoreError):
    """A record object that cannot be used: corrupt, truncated, or of a newer schema."""


class NewerRecord(RecordError):
    """A record written by a newer lakeshore: left alone, never overwritten."""


class DecodeError(LakeshoreError):
    """Bytes that should hold a lakeshore value do not (corrupt or foreign data)."""


class CorruptSegment(LakeshoreError):
    """A journal segment that cannot be decoded."""


class IllegalTransition(LakeshoreError):
    """The record is not in a state that allows this move (someone else moved it first)."""


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


class QueueFull(LakeshoreError):
    """Admission refused a submit: the queue is at ``max_depth`` or past its ``rate_limit``.

    Attributes: ``queue``, ``reason`` ("max_depth" or "rate_limit"), ``limit`` (the depth, or
    the count per period) and ``limit_text`` (the setting as written: ``"100"``, ``"5/s"``).
    """


class KeyReused(LakeshoreError):
    """An idempotency key was used before with different arguments (strict mode)."""


class MapFailed(LakeshoreError):
    """Some calls of a batch (``f.map`` / ``f.starmap``) were not submitted; the others were.

    Attributes (besides ``op``/``what``/``todo``): ``ids``, one entry per input in input
    order, the invocation id or None where that call was not submitted; ``errors``, a dict
    from the index of each failed call to the exception it raised; ``submitted``, how many
    calls were submitted.
    """


class UnknownFunction(LakeshoreError):
    """A worker cannot find the function an invocation names."""


class TopicClosed(LakeshoreError):
    """The topic ended with ``close()``; it takes no more posts."""


class HookFailed(LakeshoreError):
    """A worker cannot start what runs its bodies: a lifecycle hook raised, or a body's
    process cannot be started from the script the worker runs in. The worker stops."""


class ProviderError(LakeshoreError):
    """A provider could not launch, list or cancel workers: its tool is missing, failed or
    timed out. ``command`` and ``returncode`` say which and how, when known. A scaler that
    cannot list its workers launches none."""


class Unsendable(LakeshoreError):
    """A body's result, yielded value or file cannot be sent: an error that would repeat on
    every attempt, so the invocation fails without retries. ``error_type`` names it in the
    invocation's error (``UnsendableValue`` unless the cause said otherwise)."""


class Abandoned(BaseException):
    """Raised in a worker's slot thread whose body returned after the watchdog had given up
    on it: the attempt was concluded by another thread, which serves the slot now. A
    BaseException, so that no handler meant for errors catches it on the way out."""


class Permanent(Exception):
    """Raised by a body to fail its invocation at once, whatever attempts are left and
    whatever its retry rule says: ``raise dls.Permanent("no such user") from e``. The
    invocation's error names this class (or a subclass of it), with the message; when it
    was raised ``from`` another exception, the message ends with that one's type and
    message, and the traceback holds both.

    Not a :class:`LakeshoreError`: lakeshore never raises it, and a body's
    ``except LakeshoreError`` around its own calls must not swallow it. Subclass it with an
    exception of your own (``class BadInput(ValueError, dls.Permanent)``) to make that one
    permanent everywhere.
    """


class Stopped(Exception):
    """The run was stopped (cancelled, timed out, released, or its lease lost): it reports
    no outcome of its own and publishes nothing more."""
