"""``lakeshore demo``: the whole life of a batch, in separate processes, on one store.

1. a **producer** process submits a batch and prints only the ids it got back;
2. two **worker** processes drain the queue (they share nothing but the store);
3. a **reader** process that never saw a submit reads every result by id.

The batch holds Monte-Carlo estimates of pi, a body that fails on its first attempt (to show a
retry), a generator, and one invocation that is cancelled before it runs. Everything lives in
the namespace ``demo`` of the store, so it never mixes with real queues.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import lakeshore as dls

__all__ = ["countdown", "estimate_pi", "flaky_square", "main"]

NS = "demo"


def estimate_pi(samples: int, seed: int) -> float:
    """Throw ``samples`` darts at the unit square; a few hundred ms of real work."""
    rng = random.Random(seed)
    inside = sum(1 for _ in range(samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    return 4.0 * inside / samples


def flaky_square(x: int, marker: str) -> int:
    """Fails the first time it runs (a lost node, a flaky disk…); the retry succeeds."""
    if not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise ConnectionError("simulated flaky dependency")
    return x * x


def countdown(n: int) -> Iterator[int]:
    """A generator body: its result is the list of what it yielded."""
    yield from range(n, 0, -1)


def _plane(url: str) -> dls.Dispatch:
    return dls.Dispatch(url, ns=NS, retry_backoff_s=0.2)


def _produce(url: str, workdir: str) -> None:
    q = _plane(url)
    pi, flaky, count = q.udf(estimate_pi), q.udf(flaky_square), q.udf(countdown)
    ids = [pi.submit(200_000, seed) for seed in range(8)]
    ids.append(flaky.submit(12, os.path.join(workdir, "flaky-marker")))
    ids.append(count.submit(5))
    doomed = pi.options(priority=0).submit(10_000_000, 99)  # lowest: still queued when cancelled
    q.cancel(doomed, "cancelled by the demo before it ran")
    ids.append(doomed)
    print(json.dumps(ids))


def _work(url: str, name: str) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format=f"  [{name}] %(message)s", stream=sys.stdout)
    q = _plane(url)
    for body in (estimate_pi, flaky_square, countdown):
        q.udf(body)  # a worker runs only the bodies it declares; a record cannot add any
    n = dls.run_worker(q, concurrency=2, idle_exit=1.5, worker_id=name)
    print(f"  [{name}] drained {n} attempt(s), idle for 1.5 s, exiting", flush=True)


def _read(url: str, ids: list[str]) -> None:
    q = _plane(url)
    print(
        f"  {'id':<26}  {'function':<13} {'state':<9} {'tries':>5} {'waited':>7} {'ran':>6}  result"
    )
    for inv in ids:
        rec = q.get(inv)
        try:
            value: object = q.result(inv, timeout=60)
        except dls.JobError as e:
            value = f"{e.remote_type}: {e.remote_message}"
        waited = f"{(rec.started_at or rec.finished_at or 0) - rec.submitted_at:6.2f}s"
        ran = f"{(rec.finished_at or 0) - rec.started_at:5.2f}s" if rec.started_at else "     -"
        if isinstance(value, float):
            value = round(value, 4)
        name = rec.fn.split(":")[1]
        print(f"  {inv}  {name:<13} {rec.state:<9} {rec.attempt:>5} {waited:>7} {ran:>6}  {value}")


def main(url: str | None = None) -> int:
    """Run the three-stage demo on ``url`` (default: $LAKESHORE_URL or the embedded store)."""
    url = url or os.environ.get("LAKESHORE_URL") or dls.DEFAULT_URL
    py = [sys.executable, "-m", "lakeshore.demo"]
    t0 = time.monotonic()
    print(f"lakeshore demo on {url} (namespace {NS!r})\n")
    with tempfile.TemporaryDirectory(prefix="lakeshore-demo-") as workdir:
        print("1. a producer process submits a batch and keeps only the ids:")
        out = subprocess.run(
            [*py, "produce", url, workdir], check=True, capture_output=True, text=True
        )
        ids: list[str] = json.loads(out.stdout)
        print(f"   {len(ids)} ids, e.g. {ids[0]} (the producer has exited)\n")
        print("2. two worker processes drain the queue:")
        workers = [subprocess.Popen([*py, "work", url, f"worker-{i}"]) for i in (1, 2)]
        codes = [w.wait() for w in workers]
        print("\n3. a reader process that never saw a submit reads every result by id:")
        subprocess.run([*py, "read", url, json.dumps(ids)], check=True)
    print(f"\ndone in {time.monotonic() - t0:.1f} s; worker exit codes {codes}")
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    role, *rest = sys.argv[1:] or ["main"]
    if role == "produce":
        _produce(*rest)
    elif role == "work":
        _work(*rest)
    elif role == "read":
        _read(rest[0], json.loads(rest[1]))
    else:
        sys.exit(main(*rest))
