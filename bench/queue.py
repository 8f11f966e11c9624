"""The queue, end to end, against issue 16's targets: throughput against the S3 floor,
requests per invocation, latency, client CPU, idle cost and contention — every figure next
to a baseline measured in the same run.

    bash scripts/bench queue            # or: .venv/bin/python -m bench.queue [--jobs N]

* **Throughput**: submit N no-op invocations (``{"x": i}`` → ``x + 1``), drain with workers,
  read and check every result; on memory, a local directory and SeaweedFS; 1 and 2 worker
  processes, and on SeaweedFS 2 processes x 8 slots. With client CPU per invocation on
  SeaweedFS (the producer while it submits and reads, the workers from their first sign of
  life).
* **The S3 floor** (``bench/floor.py``): the five requests an invocation needs at least
  (create, GET, claim, complete, GET the result), listings amortised one page of 1000 per
  LIST, with raw boto3 on the same SeaweedFS: serially, by 2 processes x 8 threads, and one
  invocation at a time for the round trip.
* **Requests per invocation**: on SeaweedFS as HTTP requests (``bench/http_count.py``):
  submit, run, and one result read by a plane that never submitted, with and without
  ``_key``; on the memory store by price class; per claim with 0 and 10,000 finished
  invocations.
* **Batch submit**: ``f.map`` of N no-op calls on SeaweedFS from one process, default
  concurrency, ids checked to be in input order.
* **Latency**: submit → result with an idle worker, p50 and p99.
* **Idle cost**: requests per minute of one idle worker once its backoff settled.
* **Contention**: lost compare-and-swap attempts per claimed invocation, 8 workers on one
  queue.
* **The S3 client**: lakeshore's planes use the default client (no ``client=`` in the URL,
  ``$LAKESHORE_S3_CLIENT`` unset: obstore for GET, PUT and LIST) unless ``--client`` names
  one; the floor stays raw boto3. ``--only s3-floor`` measures just the target of the
  default client, one worker end to end against the serial floor, in ``--rounds`` rounds
  that alternate the two.
* **Upstream**: the same throughput workload on ``dreamlake-lakeshore`` (``bench/upstream.py``).
  The embedded planes and upstream's run ``--local-jobs`` invocations (2000, as issue 16
  measured them) in ``--rounds`` rounds, each plane in turn; each of their targets is the
  round with the median ratio, shown with the range.

Results go to ``bench/results/queue.json``; the tables (``bench/targets.py``) show each
target with its measured value, its ratio to the baseline and ok / MISSED.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench import floor, http_count, targets
from bench.bodies import count_to, noop, size_of
from bench.counting import Counting, classes
from bench.seaweed_env import BUCKET, seaweed_server
from lakeshore import codec
from lakeshore.batch import default_concurrency
from lakeshore.keys import QueueKeys, new_id
from lakeshore.model.record import Blob, Record
from lakeshore.protocol.claims import Claimer
from lakeshore.store import LocalStore, MemoryStore, Store
from lakeshore.store.base import CREATE
from tests.tiers import FAKE_CREDS

ROOT = Path(__file__).resolve().parent.parent


# -- requests ---------------------------------------------------------------------------------


def requests_per_job(keyed: bool, n: int = 1000) -> dict[str, float]:
    return classes(job_requests(keyed, n), n)


def job_requests(keyed: bool, n: int) -> Counter[str]:
    """The requests of ``n`` no-op invocations, submitted, run by one worker and read back
    by a plane that never submitted them, on a counting memory store."""
    store = Counting(MemoryStore())
    q = dls.Dispatch(":memory:", store=store)
    f = q.udf(noop)
    store.reset()
    ids = [f.submit(x=i, _key=f"k{i}") if keyed else f.submit(x=i) for i in range(n)]
    dls.run_worker(q, isolation="thread", max_jobs=n)
    reader = dls.Dispatch(":memory:", store=store)
    assert [reader.result(i) for i in ids] == [i + 1 for i in range(n)]
    return store.reset()


def _finished(store: Store, n: int) -> None:
    """``n`` succeeded invocations written straight into the default queue."""
    keys = QueueKeys("default", "default")
    for _ in range(n):
        inv = new_id()
        rec = Record(
            id=inv,
            ns="default",
            queue="default",
            fn="bench.bodies:noop",
            args=Blob(inline=b"\x90"),
            state="succeeded",
            attempt=1,
            result=Blob(inline=b"\x01"),
        )
        store.put(keys.record(inv), rec.to_bytes(), CREATE)


def requests_per_claim(history: int, n: int = 50) -> dict[str, float]:
    store = Counting(MemoryStore())
    _finished(store, history)
    q = dls.Dispatch(":memory:", store=store)
    f = q.udf(noop)
    for i in range(n):
        f.submit(x=i)
    claimer = Claimer(q.plane.ops("default"), "bench")
    store.reset()
    for _ in range(n):
        held = claimer.claim(store.now())
        assert held is not None
    return classes(store.reset(), n)


# -- throughput -------------------------------------------------------------------------------


def throughput(
    url: str,
    store: Store | None,
    n: int,
    processes: int,
    slots: int,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Submit all, drain, read all: three phases, each timed, end to end = invocations /
    their sum. The worker processes start once all of them have imported everything and wait at a
    gate (process start-up is not queue throughput); the drain is timed from the gate.
    With ``slots`` > 1 the producer submits and reads with as many threads as there are
    slots in all, as the concurrent S3 floor does; otherwise one at a time, as the serial
    floor does. With worker processes, ``busy`` is the share of the machine's cores that the
    workers, the server (``server_pid``) and this process used from the gate to the last
    outcome: near 1, the drain was short of CPU rather than waiting on anything."""
    q = dls.Dispatch(url, store=store, ns=f"tp{new_id().lower()[-8:]}")
    f = q.udf(noop)
    threads = max(1, processes) * slots if slots > 1 else 1
    procs: list[subprocess.Popen[str]] = []
    worker_cpu = float("nan")
    busy = float("nan")
    gate = Path(tempfile.mkdtemp(prefix="lakeshore-gate-")) / "go"
    try:
        with ThreadPoolExecutor(threads) as pool:
            t0, cpu0 = time.perf_counter(), time.process_time()
            ids = list(pool.map(lambda i: f.submit(x=i), range(n)))
            submit_s = time.perf_counter() - t0
            producer_cpu = time.process_time() - cpu0
            if processes == 0:  # in-process worker threads (":memory:" lives in this process)
                t1 = time.perf_counter()
                dls.run_worker(q, isolation="thread", concurrency=slots, max_jobs=n)
                drain_s = time.perf_counter() - t1
            else:
                procs = _workers_ns(url, q.ns, processes, slots, gate)
                _until_ready(procs, gate)
                worker_cpu = -sum(_cpu_s(p.pid) for p in procs)  # start-up not counted
                others = -(_cpu_s(server_pid) if server_pid else 0.0) - time.process_time()
                wall = -time.perf_counter()
                started = q.store.now()
                gate.touch()  # all of them start together
                _until_done(q, ids)
                worker_cpu += sum(_cpu_s(p.pid) for p in procs)
                others += (_cpu_s(server_pid) if server_pid else 0.0) + time.process_time()
                wall += time.perf_counter()
                busy = (worker_cpu + others) / (wall * (os.cpu_count() or 1))
                # from the gate to the last outcome, both in the store's clock (so the
                # benchmark's own polling can be slow and stay out of the way)
                drain_s = max(float(q.get(i).finished_at or 0.0) for i in ids) - started
            t2 = time.perf_counter()
            cpu2 = time.process_time()
            values = list(pool.map(q.result, ids))
            read_s = time.perf_counter() - t2
            producer_cpu += time.process_time() - cpu2
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
        shutil.rmtree(gate.parent, ignore_errors=True)
    assert values == [i + 1 for i in range(n)]
    return {
        "jobs": n,
        "processes": processes,
        "slots": slots,
        "submit_per_s": n / submit_s,
        "drain_per_s": n / drain_s,
        "read_per_s": n / read_s,
        "end_to_end_per_s": n / (submit_s + drain_s + read_s),
        # client CPU: this process while it submitted and read, the worker processes from
        # their first sign of life to the last outcome (none of their start-up)
        "producer_cpu_ms_per_job": 1000 * producer_cpu / n,
        "worker_cpu_ms_per_job": 1000 * worker_cpu / n,
        "client_cpu_ms_per_job": 1000 * (producer_cpu + worker_cpu) / n,
        "busy": busy,
    }


def batch_submit(url: str, n: int, concurrency: int | None = None) -> dict[str, Any]:
    """``f.map`` of ``n`` no-op calls from one process with the default concurrency (or
    ``concurrency``): invocations/s and producer CPU per invocation; then checks, outside the
    timing, that the ids came back in input order (each record holds the argument of its
    position)."""
    q = dls.Dispatch(url, ns=f"bm{new_id().lower()[-8:]}")
    f = q.udf(noop)
    f.submit(-1)  # warm-up, not timed: the client's connections and the queue's settings
    t0, cpu0 = time.perf_counter(), time.process_time()
    ids = f.map(range(n), concurrency=concurrency)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert len(set(ids)) == n
    with ThreadPoolExecutor(16) as pool:
        args = list(pool.map(lambda i: q.get(i).args.inline, ids))
    assert args == [codec.encode(((x,), {}), "args") for x in range(n)], "ids out of order"
    return {
        "jobs": n,
        "concurrency": concurrency or default_concurrency(q.store),
        "submit_per_s": n / wall,
        "producer_cpu_ms_per_job": 1000 * cpu / n,
    }


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, from /proc (Linux); NaN
    elsewhere. A child's rusage would count only once it was reaped, start-up included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _until_announced(q: Any, processes: int, timeout: float = 120.0) -> float:
    """Wait until ``processes`` workers have written their signs of life; returns when the
    first of them did (the store's clock)."""
    from lakeshore.protocol.census import workers_seen

    deadline = time.monotonic() + timeout
    while True:
        seen = workers_seen(q.store, q.ns, q.store.now())
        if len(seen) >= processes:
            return min(float(w["seen_at"]) for w in seen)
        if time.monotonic() > deadline:
            raise RuntimeError("the worker processes did not start")
        time.sleep(0.01)  # polling the store: the workers are other processes


def _until_ready(procs: list[subprocess.Popen[str]], gate: Path, timeout: float = 120) -> None:
    """Wait until every worker process has imported everything and waits at ``gate``."""
    deadline = time.monotonic() + timeout
    while not all(Path(f"{gate}.{p.pid}").exists() for p in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("the worker processes did not start")
        time.sleep(0.01)  # files written by other processes


def _workers_ns(
    url: str, ns: str, processes: int, slots: int, gate: Path | None = None
) -> list[subprocess.Popen[str]]:
    """Worker processes on ``ns``; with ``gate``, each waits for that file before its first
    claim (``bench.bodies:gate``)."""
    env = {**os.environ, "LAKESHORE_URL": url, "PYTHONPATH": str(ROOT)}
    if gate is not None:
        env["BENCH_GATE"] = str(gate)
    cmd = [
        sys.executable,
        "-m",
        "lakeshore",
        "worker",
        "--import",
        "bench.bodies",
        "--allow",  # its bodies are plain functions: the worker runs them only when allowed
        "bench.bodies:*",
        "--ns",
        ns,
        "--isolation",
        "thread",
        "--concurrency",
        str(slots),
        "--max-poll",
        "0.05",
        "--log-level",
        "warning",
        "--on-start",
        "bench.bodies:gate",
    ]
    return [subprocess.Popen(cmd, env=env, text=True) for _ in range(processes)]


def _until_done(q: Any, ids: list[str]) -> None:
    """Wait for the last invocation (one GET per poll, so the wait does not load the server),
    then check the others once; any still running are waited for the same way."""
    left = list(ids)
    while left:
        while not q.get(left[-1]).terminal:
            time.sleep(0.2)  # polling a record: the worker processes share nothing else
        left = [i for i in left[:-1] if not q.get(i).terminal]


def upstream(n: int) -> dict[str, Any] | None:
    """The same workload on the upstream SDK, ``dreamlake-lakeshore`` (``bench/upstream.py``),
    in its own venv (``bench/upstream_env.sh`` makes ``.bench-upstream/`` if missing). None,
    with the reason printed, if that venv cannot be made (no network) or the run fails.

    Upstream's import name, ``dreamlake.lakeshore``, is also our shim's: its script runs from
    a copy in a temporary directory, with upstream's python and without PYTHONPATH, so neither
    this repo nor our package is ever on its ``sys.path``.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("LAKESHORE_")
    }
    made = subprocess.run(
        ["bash", str(ROOT / "bench" / "upstream_env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if made.returncode != 0 or not made.stdout.strip():
        why = (made.stderr.strip().splitlines() or [f"exit status {made.returncode}"])[-1]
        print(f"upstream comparison skipped: no upstream venv ({why})")
        return None
    python = made.stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory(prefix="lakeshore-upstream-") as d:
        script = Path(d) / "upstream.py"
        script.write_bytes((ROOT / "bench" / "upstream.py").read_bytes())
        try:
            run = subprocess.run(
                [python, str(script), "--jobs", str(n)],
                cwd=d,
                env=env,
                capture_output=True,
                text=True,
                timeout=600 + n,
            )
        except subprocess.TimeoutExpired:
            print("upstream comparison skipped: bench/upstream.py timed out")
            return None
    if run.returncode != 0:
        print(f"upstream comparison skipped: bench/upstream.py failed:\n{run.stderr[-2000:]}")
        return None
    result: dict[str, Any] = json.loads(run.stdout)
    return result


# -- payload and streaming --------------------------------------------------------------------

PAYLOAD = 5 * 1024 * 1024


def payload(url: str, endpoint: str, n: int = 8) -> dict[str, float]:
    """MB/s of invocations whose argument is 5 MiB (spilled to its own object), drained by
    one worker process; against raw boto3 PUT + GET of the same bytes on the same server."""
    data = os.urandom(PAYLOAD)
    client = floor.client(endpoint)
    prefix = f"payload-{new_id()}"
    b0 = time.perf_counter()
    for i in range(n):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{i}", Body=data)
        assert len(client.get_object(Bucket=BUCKET, Key=f"{prefix}/{i}")["Body"].read()) == PAYLOAD
    raw = n * PAYLOAD / 1e6 / (time.perf_counter() - b0)
    q = dls.Dispatch(url, ns=f"pl{new_id().lower()[-8:]}")
    f = q.udf(size_of)
    procs = _workers_ns(url, q.ns, 1, 1)
    try:
        _until_announced(q, 1)
        t0 = time.perf_counter()
        ids = [f.submit(data=data) for _ in range(n)]
        assert [q.result(i, timeout=300) for i in ids] == [PAYLOAD] * n
        ours = n * PAYLOAD / 1e6 / (time.perf_counter() - t0)
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
    return {"mb_per_s": ours, "raw_mb_per_s": raw, "ratio": ours / raw}


def streaming(url: str, frames: int = 10_000) -> dict[str, float]:
    """A 10,000-yield generator run by a worker process, followed live by this process:
    frames/s read (first frame to last) and frames per PUT."""
    q = dls.Dispatch(url, ns=f"st{new_id().lower()[-8:]}")
    gen = q.udf(count_to)
    inv = gen.submit(frames)
    procs = _workers_ns(url, q.ns, 1, 1)
    try:
        first = last = 0.0
        seen = 0
        for frame in q.stream(inv):
            now = time.perf_counter()
            if seen == 0:
                first = now
            assert frame.value == seen, "every frame, in order"
            seen, last = seen + 1, now
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
    assert seen == frames
    segments = len(list(q.store.list(q.plane.ops("default").keys.journal_prefix(inv, 1))))
    t0 = time.perf_counter()
    replayed = sum(1 for _ in dls.Dispatch(url, ns=q.ns).stream(inv))  # a fresh reader
    replay = time.perf_counter() - t0
    assert replayed == frames
    return {
        "frames": frames,
        "live_frames_per_s": (frames - 1) / max(1e-9, last - first),
        "replay_frames_per_s": frames / replay,
        "segments": segments,
        "frames_per_put": frames / segments,
    }


# -- latency, idle cost, contention -----------------------------------------------------------


def latency(url: str, store: Store | None, n: int = 60) -> dict[str, float]:
    q = dls.Dispatch(url, store=store, ns=f"lat{new_id().lower()[-8:]}")
    f = q.udf(noop)
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"stop": stop, "isolation": "thread", "max_poll_s": 0.05},
    )
    t.start()
    times = []
    try:
        # warm-up, not timed: the first submit to a new queue also creates its queue record
        assert q.result(f.submit(x=-1), timeout=60) == 0
        for i in range(n):
            t0 = time.perf_counter()
            assert q.result(f.submit(x=i), timeout=30) == i + 1
            times.append(time.perf_counter() - t0)
    finally:
        stop.set()
        t.join(30)
    times.sort()
    return {"p50_ms": 1000 * statistics.median(times), "p99_ms": 1000 * times[int(0.99 * (n - 1))]}


def idle_cost(seconds: float = 20.0, concurrency: int = 1) -> float:
    store = Counting(LocalStore(tempfile.mkdtemp(prefix="lakeshore-idle-")))
    q = dls.Dispatch(store.url, store=store)
    q.udf(noop)
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"stop": stop, "concurrency": concurrency}
    )
    t.start()
    time.sleep(float(os.environ.get("BENCH_IDLE_SETTLE", "10")))  # the poll backoff settles
    store.reset()
    time.sleep(seconds)  # measuring a rate over a fixed window
    seen = store.reset()
    stop.set()
    t.join(30)
    return sum(seen.values()) * 60.0 / seconds


class _Conflicts(Counting):
    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        from lakeshore.errors import Conflict
        from lakeshore.store.base import OVERWRITE

        try:
            return super().put(key, data, mode or OVERWRITE)
        except Conflict:
            self._count("CONFLICT")
            raise


def contention(inner: Store, n: int = 400, workers: int = 8) -> float:
    """Lost CAS per claimed invocation. Each worker has a plane of its own (as separate
    processes would): the slots of one plane share a listing and never race each other."""
    store = _Conflicts(inner)
    ns = f"ct{new_id().lower()[-8:]}"
    q = dls.Dispatch(inner.url, store=store, ns=ns)
    f = q.udf(noop)
    ids = [f.submit(x=i) for i in range(n)]
    store.reset()
    planes = [dls.Dispatch(inner.url, store=store, ns=ns) for _ in range(workers)]
    for p in planes:
        p.udf(noop)
    threads = [
        threading.Thread(
            target=dls.run_worker,
            args=(p,),
            kwargs={"isolation": "thread", "idle_exit": 0.5, "max_poll_s": 0.05},
        )
        for p in planes
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(q.get(i).state == "succeeded" for i in ids)
    return store.reset()["CONFLICT"] / n


# -- the report -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lakeshore queue benchmarks")
    parser.add_argument(
        "--jobs", type=int, default=500, help="invocations per throughput run on S3"
    )
    parser.add_argument(
        "--local-jobs",
        type=int,
        default=2000,
        help="invocations per throughput run of the embedded planes and upstream's "
        "(issue 16: 2000)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the embedded planes and upstream, in turn; each target is the median",
    )
    parser.add_argument(
        "--only",
        choices=["local", "s3-floor"],
        help="local: only the embedded planes' throughput (memory, file) and upstream's; "
        "s3-floor: only S3 with 1 worker end to end against the serial floor, in --rounds "
        "rounds",
    )
    parser.add_argument(
        "--no-upstream", action="store_true", help="skip the upstream SDK (its targets: n/a)"
    )
    parser.add_argument(
        "--client",
        choices=["default", "boto3", "obstore"],
        default="default",
        help="the S3 client of lakeshore's planes: default is what a URL without client= "
        "gets (the floor stays raw boto3)",
    )
    args = parser.parse_args(argv)
    n = args.jobs
    if args.rounds < 1 or args.rounds % 2 == 0:
        parser.error("--rounds must be odd (its median is one of the rounds)")
    if args.only == "local":
        local_only(args.local_jobs, args.rounds, with_upstream=not args.no_upstream)
        return
    os.environ.update({k.upper(): v for k, v in FAKE_CREDS.items()})
    # every plane of this run and its worker processes read it; unset, they get the default
    os.environ.pop("LAKESHORE_S3_CLIENT", None)
    if args.client != "default":
        os.environ["LAKESHORE_S3_CLIENT"] = args.client
    if args.only == "s3-floor":
        s3_floor_only(n, args.rounds)
        return
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "jobs": n, "cores": os.cpu_count()}
    res["local_jobs"], res["rounds"] = args.local_jobs, args.rounds
    res["requests"] = {
        "no-op job": requests_per_job(False),
        "no-op job with _key": requests_per_job(True),
        "claim, 0 finished": requests_per_claim(0),
        "claim, 10000 finished": requests_per_claim(10_000),
    }
    res["idle_requests_per_min"] = idle_cost()
    res["idle_requests_per_min_8_slots"] = idle_cost(concurrency=8)
    res["local_rounds"] = local_rounds(args.local_jobs, args.rounds, not args.no_upstream)
    tp: dict[str, Any] = dict(res["local_rounds"][0]["throughput"])
    res["upstream"] = res["local_rounds"][0]["upstream"]
    with tempfile.TemporaryDirectory(prefix="lakeshore-bench-") as d:
        res["latency_file"] = latency(f"file://{d}/p", None)
        res["contention_file"] = contention(LocalStore(f"{d}/c"))
    res["latency_memory"] = latency(":memory:", MemoryStore())
    with seaweed_server() as server:
        if server is not None:
            url = f"s3://{BUCKET}/bench-{new_id()}?endpoint_url={server.endpoint}"
            res["seaweedfs"] = server.version
            res["s3_client"] = _client_info(url)
            # counted by botocore's events: always on the boto3 client (the same requests)
            counted = f"{url}&client=boto3"
            res["requests_s3"] = {
                "no-op job": http_count.requests_per_job(counted, False, min(n, 300)),
                "no-op job with _key": http_count.requests_per_job(counted, True, min(n, 300)),
            }
            res["floor_serial"] = floor.serial(server.endpoint, n)
            res["floor_concurrent"] = floor.concurrent(server.endpoint, n)
            res["floor_round_trip"] = floor.round_trip(server.endpoint)
            res["batch_submit"] = batch_submit(url, n)
            pid = server.process.pid
            tp["seaweedfs, 1 process"] = throughput(url, None, n, 1, 1, pid)
            tp["seaweedfs, 2 processes"] = throughput(url, None, n, 2, 1, pid)
            tp["seaweedfs, 2 processes x 8"] = throughput(url, None, n, 2, 8, pid)
            res["latency_seaweedfs"] = latency(url, None)
            res["contention_seaweedfs"] = contention(dls.Dispatch(url).store)
            res["stream_seaweedfs"] = streaming(url)
            res["payload_seaweedfs"] = payload(url, server.endpoint)
    res["throughput"] = tp
    res["issue16"] = targets.issue16(res)
    res["held"] = targets.held(res)
    print(
        f"\nlakeshore queue benchmarks, {n} invocations on S3, {args.local_jobs} invocations x "
        f"{args.rounds} rounds on the embedded planes (the first round shown), "
        f"{os.cpu_count()} cores, {res['date']}, S3 client {args.client}: "
        f"{res.get('s3_client', 'n/a (no SeaweedFS)')}\n"
    )
    _phases(tp)
    phases: dict[str, Any] = {}
    if "floor_serial" in res:
        phases["S3 floor, 1 thread"] = res["floor_serial"]
    _phases(phases)
    if "floor_concurrent" in res:
        e2e = res["floor_concurrent"]["end_to_end_per_s"]
        print(f"  {'S3 floor, 2 x 8 threads':<28} end to end {e2e:8.1f}/s")
    targets.show("Issue 16 targets", res["issue16"])
    targets.show("Held from before (must not regress), and figures without a target", res["held"])
    out = ROOT / "bench" / "results" / "queue.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nresults: {out.relative_to(ROOT)}")


def _client_info(url: str) -> str:
    """Which client a plane on ``url`` sends its requests with, as the doctor says it."""
    store = dls.Dispatch(url).store
    try:
        return str(getattr(store, "client_info", "not S3"))
    finally:
        store.close()


def s3_floor_only(n: int, rounds: int) -> None:
    """The default client's target alone: one worker process end to end (submit, drain, read)
    against the serial floor of raw boto3 on the same SeaweedFS, ``rounds`` times in turn,
    so that load elsewhere on the machine hits one round rather than one side of every
    ratio; the median round's ratio is the figure. Results go to
    ``bench/results/queue-s3-floor.json``."""
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "jobs": n, "cores": os.cpu_count()}
    with seaweed_server() as server:
        if server is None:
            print("no SeaweedFS: nothing to measure")
            return
        url = f"s3://{BUCKET}/bench-{new_id()}?endpoint_url={server.endpoint}"
        res["seaweedfs"], res["s3_client"] = server.version, _client_info(url)
        res["rounds"] = []
        for _ in range(rounds):
            fl = floor.serial(server.endpoint, n)
            one = throughput(url, None, n, 1, 1, server.process.pid)
            res["rounds"].append({"floor_serial": fl, "one_worker": one})
    ratios = [
        r["one_worker"]["end_to_end_per_s"] / r["floor_serial"]["end_to_end_per_s"]
        for r in res["rounds"]
    ]
    res["ratio_median"] = statistics.median(ratios)
    print(
        f"\nS3, 1 worker, end to end ÷ serial floor: {n} invocations x {rounds} rounds, "
        f"{os.cpu_count()} cores, {res['date']}\nS3 client: {res['s3_client']}\n"
    )
    for i, r in enumerate(res["rounds"], 1):
        print(f"  round {i}")
        _phases({"lakeshore, 1 worker": r["one_worker"], "S3 floor, 1 thread": r["floor_serial"]})
    median = res["ratio_median"]
    print(
        f"\n  ratio per round {', '.join(f'{x:.2f}' for x in ratios)}; median {median:.2f}x "
        f"(bound >= 1.0x): {'ok' if median >= 1.0 else 'MISSED'}"
    )
    out = ROOT / "bench" / "results" / "queue-s3-floor.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nresults: {out.relative_to(ROOT)}")


def local_rounds(n: int, rounds: int, with_upstream: bool) -> list[dict[str, Any]]:
    """``rounds`` rounds of the embedded planes' throughput and upstream's, one after the
    other within each round, so that a burst of load elsewhere on the machine hits one round
    and not one side of every ratio."""
    out: list[dict[str, Any]] = []
    for _ in range(rounds):
        tp: dict[str, Any] = {"memory, in-process": throughput(":memory:", MemoryStore(), n, 0, 1)}
        with tempfile.TemporaryDirectory(prefix="lakeshore-bench-") as d:
            tp["file, 1 process"] = throughput(f"file://{d}/p", None, n, 1, 1)
            tp["file, 2 processes"] = throughput(f"file://{d}/p", None, n, 2, 1)
        out.append({"throughput": tp, "upstream": upstream(n) if with_upstream else None})
    return out


def local_only(n: int, rounds: int, with_upstream: bool = True) -> None:
    """The embedded planes alone (no SeaweedFS, no request counts): their three targets.
    Results go to ``bench/results/queue-local.json``."""
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "jobs": n, "cores": os.cpu_count()}
    res["local_rounds"] = local_rounds(n, rounds, with_upstream)
    res["throughput"] = res["local_rounds"][0]["throughput"]
    res["upstream"] = res["local_rounds"][0]["upstream"]
    res["local"] = targets.local(res)
    print(f"\nlakeshore local planes, {n} invocations, {os.cpu_count()} cores, {res['date']}\n")
    for i, r in enumerate(res["local_rounds"], 1):
        print(f"  round {i}")
        _phases(r["throughput"])
        if r["upstream"]:
            _phases({f"upstream {k}": r["upstream"][k] for k in ("memory", "file_1", "file_2")})
    targets.show("Issue 16 targets, local planes", res["local"])
    out = ROOT / "bench" / "results" / "queue-local.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nresults: {out.relative_to(ROOT)}")


def _phases(tp: dict[str, Any]) -> None:
    for name, t in tp.items():
        read = t.get("read_per_s", math.nan)  # upstream's runs time no read phase apart
        print(
            f"  {name:<28} submit {t['submit_per_s']:8.0f}/s  drain {t['drain_per_s']:8.0f}/s"
            f"  read {read:8.0f}/s  end to end {t['end_to_end_per_s']:8.1f}/s"
        )


if __name__ == "__main__":
    main()
