"""Bodies for the queue tests, at module level so workers (and child processes) can import
them by reference ("tests.jobs:<name>")."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

# In-thread executions per invocation key, to prove nothing runs twice (thread isolation only).
RUNS: Counter[str] = Counter()
LIVE: Counter[str] = Counter()
MAX_LIVE: Counter[str] = Counter()
_lock = threading.Lock()


def write_pid(path: str) -> None:
    """Write this process's pid to ``path`` whole or not at all: a test that polls for the
    file reads it as soon as it exists, and must never read it empty (write, then rename)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(str(os.getpid()))
    os.replace(tmp, path)


def add_one(x: int) -> int:
    return x + 1


def echo(*args: Any, **kwargs: Any) -> Any:
    return {"args": args, "kwargs": kwargs}


def squares(n: int) -> Iterator[tuple[int, int]]:
    for i in range(n):
        yield (i, i * i)


async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


async def async_count(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


def fail_always(msg: str) -> None:
    raise ValueError(msg)


def fail_until(marker: str, times: int) -> str:
    """Fails the first ``times`` calls (counted in a file, so child processes agree)."""
    p = Path(marker)
    n = int(p.read_text()) if p.exists() else 0
    p.write_text(str(n + 1))
    if n < times:
        raise RuntimeError(f"attempt {n + 1} fails on purpose")
    return f"ok after {n + 1}"


def tracked(name: str, seconds: float = 0.0) -> str:
    with _lock:
        RUNS[name] += 1
        LIVE[name] += 1
        MAX_LIVE[name] = max(MAX_LIVE[name], LIVE[name])
    try:
        if seconds:
            time.sleep(seconds)
        return name
    finally:
        with _lock:
            LIVE[name] -= 1


def sleep_sync(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


async def sleep_async(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "woke"


def touch_then_sleep(path: str, seconds: float) -> int:
    """Marks that it started (for crash tests), then sleeps."""
    write_pid(path)
    time.sleep(seconds)
    return os.getpid()


def big(n: int) -> bytes:
    return b"r" * n


def size_of(blob: bytes) -> int:
    return len(blob)


def once_marker(path: str) -> str:
    """Create ``path`` exclusively: a second execution of the same job fails loudly."""
    with open(path, "x") as f:
        f.write(str(os.getpid()))
    return path


def once_marker_shared(path: str, until_s: float = 60.0) -> str:
    """:func:`once_marker`, then wait (polling, with a deadline) until the markers in the
    folder name two processes: the first process to start cannot drain the queue alone."""
    once_marker(path)
    folder, deadline = Path(path).parent, time.monotonic() + until_s
    while time.monotonic() < deadline:
        if len({m.read_text() for m in folder.iterdir() if m.stat().st_size}) >= 2:
            break
        time.sleep(0.01)
    return path


def slow_first_time(marker: str, seconds: float) -> int:
    """The first attempt marks itself and sleeps (to be killed); later attempts return."""
    p = Path(marker)
    if not p.exists():
        write_pid(marker)
        time.sleep(seconds)
    return os.getpid()


ORDER: list[str] = []


def note(tag: str) -> str:
    ORDER.append(tag)
    return tag


def count_to(n: int) -> Iterator[int]:
    yield from range(n)


def flaky_stream(marker: str, n: int) -> Iterator[int]:
    """First attempt yields half, then fails; the retry yields everything."""
    first = not Path(marker).exists()
    Path(marker).write_text("x")
    for i in range(n):
        if first and i == n // 2:
            raise RuntimeError("first attempt dies mid-stream")
        yield i


def bad_stream(n: int) -> Iterator[int]:
    yield from range(n)
    raise KeyError("stream broke")


def hold_after_first(flag: str) -> Iterator[str]:
    """Yields once, then waits until a reader has seen that frame (it creates ``flag``)."""
    yield "first"
    deadline = time.monotonic() + 60
    while not Path(flag).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no reader saw the first frame")
        time.sleep(0.01)
    yield "second"


def unsendable() -> object:
    return threading.Lock()


def kw(a: int, b: int = 2, *, c: int = 3) -> int:
    return a + b + c


def yields_padding(n: int, size: int) -> Iterator[bytes]:
    for _ in range(n):
        yield b"x" * size


def yields_a_lock() -> Iterator[object]:
    yield "fine"
    yield threading.Lock()


def submit_loop(plane: Any, queue: str, n: int, seconds: float, start: float) -> list[int]:
    """A producer for admission tests: submit ``n`` jobs (or for ``seconds`` from ``start``,
    a wall-clock time all producers share); return [accepted, rejected]."""
    import lakeshore as dls

    f = plane.udf(queue=queue)(add_one)
    acc = rej = i = 0
    time.sleep(max(0.0, start - time.time()))  # all producers start together
    while (i < n) if n else (time.time() < start + seconds):
        try:
            f.submit(i, _submit_timeout=600)
            acc += 1
        except dls.QueueFull:
            rej += 1
        i += 1
    return [acc, rej]


IMPORT_GATE = threading.Event()  # tests/trust_slow.py's import waits on it


# -- bodies that read and write files (dls.run) ---------------------------------------------

GATE = threading.Event()  # a generator body waits on it after its first yield


def case_pair(name: str) -> list[str]:
    """Read one input, write two outputs, return their keys."""
    import lakeshore as dls

    text = Path(dls.run.read(name)).read_text()
    upper, lower = dls.run.write(["out/upper.txt", "out/lower.txt"])
    Path(upper).write_text(text.upper())
    Path(lower).write_text(text.lower())
    return ["out/upper.txt", "out/lower.txt"]


async def async_case_pair(name: str) -> dict[str, str]:
    import lakeshore as dls

    await asyncio.sleep(0)
    text = Path(dls.run.read(name)).read_text()
    paths = dls.run.write({"up": "out/upper.txt", "low": "out/lower.txt"})
    Path(paths["up"]).write_text(text.upper())
    Path(paths["low"]).write_text(text.lower())
    return {"up": "out/upper.txt", "low": "out/lower.txt"}


def tiles(n: int, gated: bool = False) -> Iterator[str]:
    """Write and yield one key per tile; with ``gated``, wait for GATE after the first."""
    import lakeshore as dls

    for i in range(n):
        key = f"tiles/{i:03d}.txt"
        Path(dls.run.write(key)).write_text(f"tile {i}")
        yield key
        if gated and i == 0:
            GATE.wait(30)


async def async_tiles(n: int) -> AsyncIterator[str]:
    import lakeshore as dls

    for i in range(n):
        key = f"tiles/{i:03d}.txt"
        Path(dls.run.write(key)).write_text(f"tile {i}")
        await asyncio.sleep(0)
        yield key


def forgets_a_key() -> list[str]:
    import lakeshore as dls

    kept, forgotten = dls.run.write(["kept.txt", "forgotten.txt"])
    Path(kept).write_text("kept")
    Path(forgotten).write_text("forgotten")
    return ["kept.txt"]


def tiles_forgets_last(n: int) -> Iterator[str]:
    import lakeshore as dls

    for i in range(n):
        key = f"tiles/{i:03d}.txt"
        Path(dls.run.write(key)).write_text(f"tile {i}")
        if i < n - 1:
            yield key


def climbs(key: str) -> str:
    import lakeshore as dls

    return str(dls.run.read(key))


def sub_scope() -> list[str]:
    """Nested scope inside a body: returned keys are relative to the invocation's scope."""
    import lakeshore as dls

    with dls.scope("sub"):
        Path(dls.run.write("deep.txt")).write_text("deep")
    return ["sub/deep.txt"]


def writes_and_returns_none() -> None:
    import lakeshore as dls

    Path(dls.run.write("lost.txt")).write_text("x")


# -- bodies and hooks for worker and CLI tests ----------------------------------------------


def wait_for_file(path: str, timeout: float = 120.0) -> str:
    """Block until ``path`` exists (a long job that a test can end)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)
    return "done"


def chatty(n: int) -> int:
    """Prints and logs, for the log-capture tests."""
    import logging
    import sys

    print(f"hello from the body, n={n}")
    print("to stderr", file=sys.stderr)
    logging.getLogger("tests.chatty").warning("a warning with n=%d", n)
    return n


def note_pid(x: int) -> int:
    _hook_line(f"job {os.getpid()}")
    return x


def _hook_line(text: str) -> None:
    with open(os.environ["LAKESHORE_TEST_HOOKS"], "a") as f:
        f.write(text + "\n")


def hook_start() -> None:
    _hook_line(f"start {os.getpid()}")


def hook_before(record: Any) -> None:
    _hook_line(f"before {os.getpid()} {record.id}")


def hook_stop() -> None:
    _hook_line(f"stop {os.getpid()}")


def hook_start_fails() -> None:
    raise RuntimeError("model weights missing")


def writes_then_unsendable() -> Any:
    import lakeshore as dls

    Path(dls.run.write("orphan.txt")).write_text("never published")
    return ["orphan.txt", threading.Lock()]


def writes_then_blocks(seconds: float) -> str:
    import lakeshore as dls

    Path(dls.run.write("partial.bin")).write_bytes(b"x" * 1000)
    time.sleep(seconds)  # the body's own work; the test stops it by timeout
    return "partial.bin"


def pid_after_file(path: str, timeout: float = 120.0) -> int:
    """Note the body's pid in ``path + '.pid'``, block until ``path`` exists, return the pid."""
    write_pid(path + ".pid")
    wait_for_file(path, timeout)
    return os.getpid()


def nap_then(name: str, seconds: float) -> str:
    time.sleep(seconds)
    return name


def logged_nap(name: str, seconds: float, folder: str) -> str:
    """Record each execution's start and end (with its process group) for overlap checks."""
    path = Path(folder) / name
    with open(path, "a") as f:
        f.write(f"start {time.time()} {os.getpgid(0)}\n")
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"end {time.time()} {os.getpgid(0)}\n")
    return name


def die_by_group_signal() -> None:
    """An ``on_start`` hook: the child dies of SIGTERM as if a signal for the whole process
    group reached it before it could ignore it (children ignore SIGTERM once they run)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


async def wait_to_be_cancelled(path: str) -> str:
    """Waits (up to a minute) until cancelled; marks ``path`` when it is."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        Path(path).write_text("cancelled")
        raise
    return "not cancelled"


def length(s: str) -> int:
    return len(s)


def env_of(name: str) -> str | None:
    """What the body's process has in its environment under ``name``."""
    return os.environ.get(name)


def parent_pid() -> int:
    """The process that started the body's process."""
    return os.getppid()


def span_ids_lazily() -> list[str]:
    """A body whose module does not import OpenTelemetry: it does so itself, in the call
    (tests/queue/test_tracing.py). Its span's trace id and parent span id, as hex."""
    import sys

    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("body").start_as_current_span("lazy") as span:
        parent = getattr(span, "parent", None)
        return [
            f"{span.get_span_context().trace_id:032x}",
            f"{parent.span_id:016x}" if parent is not None else "",
            str("opentelemetry.trace" in sys.modules),
        ]
