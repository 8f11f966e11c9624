"""Typed submits, as a type checker sees them: not collected by pytest (no ``test_`` name),
checked by mypy and by pyright from tests/unit/test_typed_submit.py with unused ignores as
errors. Each wrong call carries the ignore of both checkers, so a wrong call that stops
being an error fails the test, and so does a right call that becomes one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import assert_type

import lakeshore as dls

q = dls.Dispatch(":memory:")


@q.udf
def add(x: int, y: int = 0) -> int:
    return x + y


@q.udf(queue="slow", priority=3)
def label(name: str, *, upper: bool = False) -> str:
    return name.upper() if upper else name


@dls.udf
def free(x: float) -> float:
    return x


@q.udf
def loose(x: int, **extra: object) -> int:
    return x


@q.udf
async def fetch(x: int) -> int:
    return x


@q.udf
def count(n: int) -> Iterator[int]:
    yield from range(n)


@q.udf
async def ticks(n: int) -> AsyncIterator[str]:
    for i in range(n):
        yield str(i)


async def producers() -> None:
    # right calls: the body's parameters, by position or keyword
    assert_type(add.submit(1), str)
    assert_type(add.submit(x=1, y=2), str)
    assert_type(label.submit("a", upper=True), str)
    assert_type(free.submit(1.5), str)
    assert_type(add.remote(1), int)
    assert_type(label.remote("a"), str)
    assert_type(add(1, 2), int)
    # remote waits for the result: an async body's value, a streaming body's list of yields
    assert_type(fetch.remote(1), int)
    assert_type(fetch.options(result_timeout=30).remote(1), int)
    assert_type(count.remote(3), list[int])
    assert_type(count.options(priority=1).remote(3), list[int])
    assert_type(ticks.remote(3), list[str])
    assert_type(await fetch(1), int)  # calling it runs the body here: a coroutine
    assert_type(fetch.submit(1), str)
    # options, typed
    assert_type(add.options(priority=9, delay_s=5).submit(x=1), str)
    assert_type(add.options(key="k", strict_key=True).options(max_attempts=2).submit(1), str)
    assert_type(add.options(result_timeout=30).remote(1), int)
    assert_type(add.options(priority=1).map([1, 2], keys=["a", "b"], concurrency=2), list[str])
    # a body with **kwargs takes the underscore spelling too
    assert_type(loose.submit(1, _priority=9), str)
    # async producers
    assert_type(await add.asubmit(1, y=2), str)
    assert_type(await add.options(priority=9).asubmit(x=1), str)
    assert_type(await add.amap([1, 2]), list[str])
    assert_type(await add.options(priority=1).amap([1, 2], keys=["a", "b"]), list[str])

    # wrong calls: each is an error for both checkers
    add.submit("1")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    add.submit(z=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    add.submit()  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    add.submit(1, 2, 3)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    label.submit("a", True)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    free.submit("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    await add.asubmit("1")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    add.options(priority=1).submit(y=2)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    add.options(priority=1).remote("1")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    add.options(prio=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    add.options(priority="high")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    # the underscore options work at run time, but are not the body's parameters
    add.submit(1, _priority=9)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    await fetch.remote(1)  # type: ignore[misc]  # pyright: ignore[reportGeneralTypeIssues]
    fetch.remote("1")  # type: ignore[call-overload]  # pyright: ignore[reportCallIssue, reportArgumentType]
    x: str = add.remote(1)  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    del x
