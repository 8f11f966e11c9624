"""The queue benchmark's workload on the upstream SDK, ``dreamlake-lakeshore`` (issue 9).

Run ONLY by the python of upstream's own environment (``bash bench/upstream_env.sh`` prints
it), from a working directory outside this repository and without PYTHONPATH: this repo's
``dreamlake/`` is a shim with the same import name, ``dreamlake.lakeshore``. Hence this file
imports nothing but the standard library and upstream; ``bench/queue.py`` copies it into a
temporary directory and runs it there::

    cp bench/upstream.py "$tmp" && cd "$tmp" && env -u PYTHONPATH "$py" upstream.py --jobs 200

The workload is ``bench/queue.py``'s: submit N no-op invocations (``{"x": i}`` → ``x + 1``),
drain them, read and check every result; submit/s, drain/s and end-to-end/s (N over the
whole of submit + drain + read). Planes: ``Dispatch(":memory:")`` drained by a worker in
this process, and a sqlite file, ``Dispatch(path)``, drained by 1 and by 2 worker processes
that each open the same file. Latency: submit → result with an idle worker already running,
p50/p99.

Upstream's idiomatic path throughout: ``@dls.udf(queue=...)`` on a module-level def (shipped
by reference), ``.submit(x=i, _dispatch=plane)``, ``dls.SyncQueue(queue, dispatch=plane)``,
``dls.run_worker(q, poll=...)`` and ``q.result(id)``. Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import dreamlake.lakeshore as dls

QUEUE = "bench"
# The fastest reasonable settings upstream offers (it has no backoff: each is a fixed sleep).
WORKER_POLL = 0.005  # run_worker(poll=): its idle sleep; default 0.05. Ours starts at 0.005.
RESULT_POLL = 0.005  # Dispatch.result(poll=): the waiter's sleep; q.result always uses 0.02.
DONE_POLL = 0.01  # how often the benchmark checks that worker processes drained (ours: 0.05)


def noop(x: int) -> int:
    return x + 1


def _guard() -> None:
    """Refuse to measure anything but upstream: this repo's shim makes ``dreamlake.lakeshore``
    the module ``lakeshore``."""
    version = metadata.version("dreamlake-lakeshore")
    if "lakeshore" in sys.modules or getattr(dls, "__version__", None) != version:
        sys.exit(
            f"upstream.py: dreamlake.lakeshore is {dls.__file__}, not upstream's package; "
            "run it with the upstream venv's python, outside the repo, without PYTHONPATH"
        )


def _body() -> Any:
    """``noop`` as an ``@udf`` on the module this file is importable as (its directory is
    ``sys.path[0]``): upstream ships it by reference (``module:qualname``). The same def in
    ``__main__`` would be cloudpickled on every submit."""
    module = importlib.import_module(Path(__file__).stem)
    return dls.udf(queue=QUEUE)(module.noop)


def _ns() -> str:
    return f"b{os.getpid()}x{time.monotonic_ns() % 10**9}"


# -- throughput -------------------------------------------------------------------------------


def throughput(path: str, n: int, processes: int) -> dict[str, Any]:
    plane = dls.Dispatch(path, ns=_ns())
    f = _body()
    q = dls.SyncQueue(QUEUE, dispatch=plane)
    t0 = time.perf_counter()
    ids = [f.submit(x=i, _dispatch=plane) for i in range(n)]
    t1 = time.perf_counter()
    if processes == 0:  # ":memory:" lives in this process: drain it here
        calls = itertools.count()  # stop() is asked before each claim: stop after n invocations
        done = dls.run_worker(q, poll=WORKER_POLL, stop=lambda: next(calls) >= n)
        assert done == n, done
    else:
        procs = _workers(path, plane.ns, processes)
        try:
            while plane.count(QUEUE, "succeeded") + plane.count(QUEUE, "failed") < n:
                if all(p.poll() is not None for p in procs):
                    raise RuntimeError("upstream.py: every worker process exited early")
                time.sleep(DONE_POLL)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
    t2 = time.perf_counter()
    values = [q.result(i) for i in ids]
    t3 = time.perf_counter()
    assert values == [i + 1 for i in range(n)]
    plane.close()
    return {
        "jobs": n,
        "processes": processes,
        "submit_per_s": n / (t1 - t0),
        "drain_per_s": n / (t2 - t1),
        "end_to_end_per_s": n / (t3 - t0),
    }


def _workers(path: str, ns: str, processes: int) -> list[subprocess.Popen[bytes]]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", path, "--ns", ns]
    # their stdout goes to stderr: this process's stdout is the JSON report
    return [subprocess.Popen(cmd, stdout=sys.stderr) for _ in range(processes)]


def worker(path: str, ns: str) -> None:
    """One worker process on the sqlite file; runs until terminated."""
    plane = dls.Dispatch(path, ns=ns)
    dls.run_worker(dls.SyncQueue(QUEUE, dispatch=plane), poll=WORKER_POLL)


# -- latency ----------------------------------------------------------------------------------


def latency(
    path: str, worker_poll: float, result_poll: float | None, n: int = 60
) -> dict[str, float]:
    """Submit → result, one invocation at a time, an idle worker thread already polling.
    ``result_poll=None`` waits with ``q.result`` (upstream's fixed 20 ms poll)."""
    from dreamlake.lakeshore import wire

    plane = dls.Dispatch(path, ns=_ns())
    f = _body()
    q = dls.SyncQueue(QUEUE, dispatch=plane)
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"poll": worker_poll, "stop": stop.is_set}
    )
    t.start()
    times = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            inv = f.submit(x=i, _dispatch=plane)
            if result_poll is None:
                value = q.result(inv, timeout=30)
            else:
                value = wire.unpack(plane.result(inv, timeout=30, poll=result_poll))
            times.append(time.perf_counter() - t0)
            assert value == i + 1
    finally:
        stop.set()
        t.join(30)
    plane.close()
    times.sort()
    return {"p50_ms": 1000 * statistics.median(times), "p99_ms": 1000 * times[int(0.99 * (n - 1))]}


# -- the report -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="upstream dreamlake-lakeshore, same workload")
    parser.add_argument("--jobs", type=int, default=500, help="invocations per throughput run")
    parser.add_argument("--worker", metavar="DB", help=argparse.SUPPRESS)
    parser.add_argument("--ns", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _guard()
    if args.worker:
        worker(args.worker, args.ns)
        return
    n = args.jobs
    started = time.perf_counter()
    res: dict[str, Any] = {"version": dls.__version__, "jobs": n}
    res["memory"] = throughput(":memory:", n, 0)
    with tempfile.TemporaryDirectory(prefix="upstream-bench-") as d:
        db = str(Path(d) / "dispatch.sqlite")
        res["file_1"] = throughput(db, n, 1)
        res["file_2"] = throughput(db, n, 2)
        res["latency_file"] = latency(db, WORKER_POLL, RESULT_POLL)
        res["latency_file_defaults"] = latency(db, 0.05, None)
    res["latency_memory"] = latency(":memory:", WORKER_POLL, RESULT_POLL)
    res["latency_memory_defaults"] = latency(":memory:", 0.05, None)
    res["seconds"] = time.perf_counter() - started
    res["notes"] = [
        f"run_worker(poll={WORKER_POLL}) (default 0.05); latency waits with "
        f"Dispatch.result(poll={RESULT_POLL}) (q.result always polls every 0.02 s); "
        "both are fixed sleeps, no backoff",
        "latency_*_defaults: run_worker's default poll=0.05 and q.result",
        "memory: one run_worker in the submitting process, stopped after N invocations "
        "(upstream's plane is one sqlite connection behind one lock: more threads only queue)",
        "file: one sqlite file (WAL, sqlite's default synchronous, so each commit may sync); "
        "each worker process opens it with Dispatch(path); drain includes their start-up, "
        f"the benchmark checks for completion every {DONE_POLL} s by count()",
        "the body is a module-level @udf shipped by reference; upstream hashes its source "
        "(inspect.getsource) on every submit and again on every execution",
    ]
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
