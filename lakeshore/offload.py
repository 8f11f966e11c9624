"""Async spellings of blocking verbs: one implementation, run in a worker thread.

Every verb of the queue is a few blocking store requests. The async classes do not copy
them: each async verb is the blocking one, declared once with :func:`offload`, and run with
``asyncio.to_thread`` so a slow request or a long poll never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

__all__ = ["HasSync", "aiterate", "offload"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class HasSync(Protocol):
    """An async facade: ``sync`` is the blocking object whose verbs it offloads."""

    @property
    def sync(self) -> Any: ...


def offload(
    verb: Callable[Concatenate[Any, P], R], *, here: bool = False
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The async method for the blocking method ``verb``: same arguments, same result, run
    in a thread on ``self.sync`` (an async facade, :class:`HasSync`), or on ``self`` itself
    with ``here`` (a class with both spellings). Its docstring is ``verb``'s."""

    async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        target = self if here else self.sync
        return await asyncio.to_thread(verb, target, *args, **kwargs)

    functools.update_wrapper(method, verb)
    return method


async def aiterate(items: Iterator[T]) -> AsyncIterator[T]:
    """Iterate a blocking iterator from asyncio code: each ``next`` runs in a thread."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, items, done)
        if item is done:
            return
        yield item  # type: ignore[misc]
