"""Batch submit: ``f.map`` and ``f.starmap`` — many calls of one function, written by a
pool of threads, ids returned in input order.

The batch runs in two phases. First every call is prepared in the caller's thread exactly as
``f.submit`` prepares one (options checked, arguments bound to the signature and encoded, the
key checked): a bad call raises before anything is written, so a bad batch leaves nothing
behind. Then the producer's pending files are uploaded once, and the prepared calls are
published by ``concurrency`` threads, each call with the same writes as one ``f.submit``.

Every call is attempted, also after another one failed. If any failed, :class:`MapFailed`
carries the ids of the others in input order (None where a call was not submitted) and the
error of each failed call. Calls that share a ``_keys`` entry are one invocation: the first
of them is submitted, the others get its id, as sequential submits with that key would.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from lakeshore.errors import InvalidArgument, KeyReused, LakeshoreError, MapFailed
from lakeshore.files.context import flush
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.store import LocalStore, MemoryStore, Store
from lakeshore.submit import OPTIONS, Prepared, check_options, prepare_call, publish_prepared

if TYPE_CHECKING:
    from lakeshore.running.bodies import Declared

__all__ = ["Batch", "batch_result", "default_concurrency", "prepare_batch", "submit_many"]

Call = tuple[tuple[Any, ...], dict[str, Any]]

# Threads that publish a batch. A submit is a few sequential requests of a few ms each on a
# remote store, so throughput grows with requests in flight until the client's CPU is the
# limit; S3Store keeps 64 connections, so 32 threads never wait for one. A local directory
# is bounded by the filesystem and the GIL (a few threads overlap its syscalls); memory has
# no I/O to overlap at all.
REMOTE_CONCURRENCY = 32
LOCAL_CONCURRENCY = 4
_PROGRESS_EVERY_S = 0.2  # the progress line is redrawn at most this often


def default_concurrency(store: Store) -> int:
    """Threads a batch uses on ``store`` when the caller names none."""
    if isinstance(store, MemoryStore):
        return 1
    if isinstance(store, LocalStore):
        return LOCAL_CONCURRENCY
    return REMOTE_CONCURRENCY


def map_calls(
    iterables: Sequence[Iterable[Any]], kwargs: dict[str, Any] | None, op: str
) -> list[Call]:
    """``f.map``'s calls: the i-th call takes the i-th item of every iterable, positionally.

    Raises:
        InvalidArgument: no iterable, iterables of different lengths, or ``kwargs`` not a dict.
    """
    if not iterables:
        raise InvalidArgument(
            op, "no iterable of arguments was given", "pass one iterable per positional argument"
        )
    columns = [_materialize(it, op, f"argument {n}") for n, it in enumerate(iterables)]
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        raise InvalidArgument(
            op,
            f"the iterables have different lengths ({', '.join(str(len(c)) for c in columns)})",
            "pass iterables of one length: each call takes one item of each (nothing was "
            "submitted)",
        )
    shared = _kwargs(kwargs, op)
    return [(tuple(row), shared) for row in zip(*columns, strict=True)]


def starmap_calls(items: Iterable[Any], kwargs: dict[str, Any] | None, op: str) -> list[Call]:
    """``f.starmap``'s calls: each item is the tuple (or list) of one call's positional
    arguments.

    Raises:
        InvalidArgument: an item is not a tuple or list, or ``kwargs`` is not a dict.
    """
    shared = _kwargs(kwargs, op)
    calls = []
    for i, item in enumerate(_materialize(items, op, "items")):
        if not isinstance(item, (tuple, list)):
            raise InvalidArgument(
                op,
                f"item {i} is a {type(item).__name__}, not a tuple of arguments",
                "give each call's positional arguments as a tuple, e.g. f.starmap([(1, 2), "
                "(3, 4)]); for one argument per call use f.map(items) (nothing was submitted)",
                index=i,
            )
        calls.append((tuple(item), shared))
    return calls


def submit_many(
    plane: Plane | HasPlane,
    udf: Declared,
    calls: list[Call],
    *,
    keys: Iterable[str | None] | Callable[..., str | None] | None = None,
    concurrency: int | None = None,
    progress: bool = False,
    **options: Any,
) -> list[str]:
    """Submit ``calls`` of ``udf`` to ``plane`` (a ``Dispatch`` or its ``Plane``) and return
    their ids in order; see :meth:`lakeshore.udf.Udf.map`.

    Raises:
        InvalidArgument: a bad option, key or call (nothing was written).
        KeyReused: ``strict_key`` and two calls share a key but not their arguments
            (nothing was written).
        MapFailed: some calls were not submitted (the others were).
    """
    batch = prepare_batch(plane, udf, calls, keys, concurrency, progress, options)
    flush()  # the producer's files, once for the batch, before any record names them
    return _publish_all(udf.ref, batch, progress)


@dataclasses.dataclass(frozen=True)
class Batch:
    """A prepared batch: every call, the first call of each one's key, and how many at once."""

    preps: list[Prepared]
    first: list[int]  # per call, the index of the first call with its key (itself if none)
    workers: int

    @property
    def todo(self) -> list[int]:
        """The calls to publish: the first of each key."""
        return [i for i, j in enumerate(self.first) if i == j]


def prepare_batch(
    plane: Plane | HasPlane,
    udf: Declared,
    calls: list[Call],
    keys: Iterable[str | None] | Callable[..., str | None] | None,
    concurrency: int | None,
    progress: bool,
    options: dict[str, Any],
) -> Batch:
    """Check and prepare every call of a batch, writing nothing (see :func:`submit_many`).

    Raises:
        InvalidArgument, KeyReused: as :func:`submit_many` (nothing was written).
    """
    plane = plane_of(plane)
    op = f"map {udf.ref}"
    if "key" in options:
        raise InvalidArgument(
            op,
            "_key would give every call of the batch the same key, so all of them would be "
            "one invocation",
            "pass one key per call: _keys=[...] or _keys=lambda *args: ... (nothing was submitted)",
        )
    check_options(options, op, _OPTIONS, ", _keys, concurrency and progress")
    workers = default_concurrency(plane.store) if concurrency is None else concurrency
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgument(
            op, f"concurrency={concurrency!r}", "pass an int >= 1, or None for the default"
        )
    if not isinstance(progress, bool):
        raise InvalidArgument(op, f"progress={progress!r}", "pass True or False")
    per_call = _keys(keys, calls, op)
    preps = [
        _prepare(plane, udf, op, i, call, per_call[i], options) for i, call in enumerate(calls)
    ]
    return Batch(preps, _first_of_key(preps, op), workers)


def batch_result(
    ref: str, batch: Batch, ids: dict[int, str], errors: dict[int, Exception]
) -> list[str]:
    """The ids of a published batch in input order, from the ids and errors of the calls
    it published (the first of each key).

    Raises:
        MapFailed: some calls were not submitted (the others were).
    """
    out: list[str | None] = [ids.get(j) for j in batch.first]
    failed = {i: errors[j] for i, j in enumerate(batch.first) if j in errors}
    if failed:
        i, e = next(iter(failed.items()))
        raise MapFailed(
            f"map {ref}",
            f"{len(failed)} of {len(batch.preps)} calls were not submitted (call {i}: "
            f"{type(e).__name__}: {e})",
            "the other calls are queued: .ids has every id in input order (None where not "
            "submitted) and .errors the error of each failed call; submit those again (with "
            "_keys, submitting the whole batch again is safe)",
            ids=out,
            errors=failed,
            submitted=sum(1 for x in out if x is not None),
        )
    return [x for x in out if x is not None]


# -- preparing ----------------------------------------------------------------------------------


def _materialize(items: Iterable[Any], op: str, what: str) -> list[Any]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise InvalidArgument(
            op,
            f"{what} is a {type(items).__name__}, not an iterable of values",
            "pass a list, tuple, range or generator (a str is one value here, not a sequence "
            "of characters: wrap it in a list)",
        )
    return list(items)


def _kwargs(kwargs: dict[str, Any] | None, op: str) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgument(
            op,
            f"kwargs={kwargs!r:.80} is not a dict of keyword arguments",
            "pass the keywords every call shares as a dict, e.g. kwargs={'size': 64}",
        )
    if any(k.startswith("_") for k in kwargs):
        raise InvalidArgument(
            op,
            "kwargs has a name starting with '_'",
            "submit options go to map itself (_priority=..., _keys=...), not into kwargs",
        )
    return kwargs


def _keys(
    keys: Iterable[str | None] | Callable[..., str | None] | None, calls: list[Call], op: str
) -> list[str | None]:
    if keys is None:
        return [None] * len(calls)
    if callable(keys):
        return [keys(*args, **kwargs) for args, kwargs in calls]
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise InvalidArgument(
            op,
            f"_keys={keys!r:.80} is neither an iterable of keys nor a function",
            "pass one key per call (a list, None for no key), or a function of a call's "
            "arguments that returns its key",
        )
    got = list(keys)
    if len(got) != len(calls):
        raise InvalidArgument(
            op,
            f"_keys has {len(got)} entries for {len(calls)} calls",
            "pass exactly one key (or None) per call (nothing was submitted)",
        )
    return got


def _prepare(
    plane: Plane,
    udf: Declared,
    op: str,
    i: int,
    call: Call,
    key: str | None,
    options: dict[str, Any],
) -> Prepared:
    args, kwargs = call
    try:
        return prepare_call(plane, udf, args, kwargs, key=key, **options)
    except LakeshoreError as e:
        # the same class, naming the call: a batch of thousands needs to say which one
        raise type(e)(
            op, f"call {i}: {e.what} (nothing was submitted)", e.todo, index=i, **e.details
        ) from e


_OPTIONS = OPTIONS - {"key"}  # one key for every call would make them one invocation


def _first_of_key(preps: list[Prepared], op: str) -> list[int]:
    """For each call, the index of the first call with its key (itself without a key).

    Raises:
        KeyReused: strict keys, and two calls share a key but not their arguments.
    """
    seen: dict[str, int] = {}
    first = []
    for i, prep in enumerate(preps):
        key = prep.draft.key
        if key is None:
            first.append(i)
            continue
        j = seen.setdefault(key, i)
        if j != i and prep.strict_key and preps[j].draft.input_hash != prep.draft.input_hash:
            raise KeyReused(
                op,
                f"calls {j} and {i} share _key {key!r} with different arguments (nothing was "
                "submitted)",
                "give each distinct call its own key, or drop _strict_key",
                index=i,
                key=key,
            )
        first.append(j)
    return first


# -- publishing ---------------------------------------------------------------------------------


def _publish_all(ref: str, batch: Batch, progress: bool) -> list[str]:
    todo, preps, workers = batch.todo, batch.preps, batch.workers
    meter = _Progress(f"map {ref}", len(todo)) if progress else None
    ids: dict[int, str] = {}
    errors: dict[int, Exception] = {}
    context = contextvars.copy_context()  # the caller's scope and run context, in each thread

    def one(i: int) -> None:
        try:
            ids[i] = context.copy().run(publish_prepared, preps[i])
        except Exception as e:  # every call is attempted; the failures are reported together
            errors[i] = e
        if meter is not None:
            meter.step(i not in errors)

    if workers == 1 or len(todo) <= 1:
        for i in todo:
            one(i)
    else:
        pool = ThreadPoolExecutor(min(workers, len(todo)), thread_name_prefix="lakeshore-map")
        try:
            for future in [pool.submit(one, i) for i in todo]:
                future.result()
        finally:
            # interrupted: calls not started are dropped; those under way finish
            pool.shutdown(wait=True, cancel_futures=True)
    if meter is not None:
        meter.done()
    return batch_result(ref, batch, ids, errors)


class _Progress:
    """One line on stderr, redrawn in place: submitted, failed, rate."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.ok = self.failed = 0
        self.started = self.drawn = time.monotonic()
        self._lock = threading.Lock()
        self._draw("\r")

    def step(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.ok += 1
            else:
                self.failed += 1
            now = time.monotonic()
            if now - self.drawn >= _PROGRESS_EVERY_S:
                self.drawn = now
                self._draw("\r")

    def done(self) -> None:
        with self._lock:
            self._draw("\r", "\n")

    def _draw(self, start: str, end: str = "") -> None:
        elapsed = time.monotonic() - self.started
        rate = f", {self.ok / elapsed:.0f}/s" if elapsed > 0 and self.ok else ""
        failed = f", {self.failed} failed" if self.failed else ""
        sys.stderr.write(
            f"{start}{self.label}: {self.ok}/{self.total} submitted{failed}{rate}{end}"
        )
        sys.stderr.flush()
