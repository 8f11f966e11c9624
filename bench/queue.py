"""The queue, end to end: throughput against the S3 floor, requests per job, latency, idle
cost and contention — every figure next to a baseline measured in the same run.

    bash scripts/bench queue            # or: .venv/bin/python -m bench.queue [--jobs N]

* **Throughput**: submit N no-op jobs (``{"x": i}`` → ``x + 1``), drain with workers, read
  and check every result; on memory, a local directory and SeaweedFS; 1 and 2 worker
  processes, and 2 processes x 8 slots.
* **The S3 floor**: the minimal request sequence of one job (put record, list, get,
  conditional put to claim, conditional put to complete, get result) with raw boto3 on the
  same SeaweedFS, serially and by 2 processes x 8 threads.
* **Requests per job** (class A, class B, DELETE) with and without ``_key``, and per claim
  with 0 and 10,000 finished invocations in the queue.
* **Latency**: submit → result with an idle worker, p50 and p99.
* **Idle cost**: requests per minute of one idle worker once its backoff settled.
* **Contention**: lost compare-and-swap attempts per claimed job, 8 workers on one queue.

Results go to ``bench/results/queue.json``; the table shows each ratio with its target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench.bodies import count_to, noop, size_of
from bench.counting import Counting, classes
from bench.seaweed_env import BUCKET, seaweed_server
from lakeshore.keys import QueueKeys, new_id
from lakeshore.record import Blob, Record
from lakeshore.store import LocalStore, MemoryStore, Store
from lakeshore.store.base import CREATE
from tests.conftest import FAKE_CREDS

ROOT = Path(__file__).resolve().parent.parent


# -- requests ---------------------------------------------------------------------------------


def requests_per_job(keyed: bool, n: int = 1000) -> dict[str, float]:
    store = Counting(MemoryStore())
    q = dls.Dispatch(":memory:", store=store)
    f = q.udf(noop)
    store.reset()
    ids = [f.submit(x=i, _key=f"k{i}") if keyed else f.submit(x=i) for i in range(n)]
    dls.run_worker(q, isolation="thread", max_jobs=n)
    assert [q.result(i) for i in ids] == [i + 1 for i in range(n)]
    return classes(store.reset(), n)


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
    ops = q.ops("default")
    store.reset()
    for _ in range(n):
        held = ops.claim("bench", store.now())
        assert held is not None
    return classes(store.reset(), n)


# -- throughput -------------------------------------------------------------------------------


def throughput(url: str, store: Store | None, n: int, processes: int, slots: int) -> dict[str, Any]:
    """Submit all, drain, read all: three phases, each timed, end to end = jobs / their sum.
    The drain starts when the first worker process has announced itself (process start-up
    is not queue throughput). With ``slots`` > 1 the producer submits and reads with as many
    threads as there are slots in all, as the concurrent S3 floor does; otherwise one at a
    time, as the serial floor does."""
    q = dls.Dispatch(url, store=store, ns=f"tp{new_id().lower()[-8:]}")
    f = q.udf(noop)
    threads = max(1, processes) * slots if slots > 1 else 1
    procs: list[subprocess.Popen[str]] = []
    try:
        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            ids = list(pool.map(lambda i: f.submit(x=i), range(n)))
            submit_s = time.perf_counter() - t0
            if processes == 0:  # in-process worker threads (":memory:" lives in this process)
                t1 = time.perf_counter()
                dls.run_worker(q, isolation="thread", concurrency=slots, max_jobs=n)
                drain_s = time.perf_counter() - t1
            else:
                procs = _workers_ns(url, q.ns, processes, slots)
                started = _until_announced(q, 1)
                _until_done(q, ids)
                # from the first sign of life to the last outcome, both in the store's clock
                # (so the benchmark's own polling can be slow and stay out of the way)
                drain_s = max(float(q.get(i).finished_at or 0.0) for i in ids) - started
            t2 = time.perf_counter()
            values = list(pool.map(q.result, ids))
            read_s = time.perf_counter() - t2
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    assert values == [i + 1 for i in range(n)]
    return {
        "jobs": n,
        "processes": processes,
        "slots": slots,
        "submit_per_s": n / submit_s,
        "drain_per_s": n / drain_s,
        "read_per_s": n / read_s,
        "end_to_end_per_s": n / (submit_s + drain_s + read_s),
    }


def _until_announced(q: Any, processes: int, timeout: float = 120.0) -> float:
    """Wait until ``processes`` workers have written their signs of life; returns when the
    first of them did (the store's clock)."""
    from lakeshore.census import workers_seen

    deadline = time.monotonic() + timeout
    while True:
        seen = workers_seen(q.store, q.ns, q.store.now())
        if len(seen) >= processes:
            return min(float(w["seen_at"]) for w in seen)
        if time.monotonic() > deadline:
            raise RuntimeError("the worker processes did not start")
        time.sleep(0.01)  # polling the store: the workers are other processes


def _workers_ns(url: str, ns: str, processes: int, slots: int) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "LAKESHORE_URL": url, "PYTHONPATH": str(ROOT)}
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
    ]
    return [subprocess.Popen(cmd, env=env, text=True) for _ in range(processes)]


def _until_done(q: Any, ids: list[str]) -> None:
    """Wait for the last job (one GET per poll, so the wait does not load the server), then
    check the others once; any still running are waited for the same way."""
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


# -- the S3 floor -----------------------------------------------------------------------------


def _floor_job(client: Any, prefix: str, i: int) -> None:
    key = f"{prefix}/{i:08d}/record"
    etag = client.put_object(Bucket=BUCKET, Key=key, Body=b"queued" * 20, IfNoneMatch="*")["ETag"]
    client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/{i:08d}/", MaxKeys=16)
    client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    etag = client.put_object(Bucket=BUCKET, Key=key, Body=b"running" * 20, IfMatch=etag)["ETag"]
    client.put_object(Bucket=BUCKET, Key=key, Body=b"succeeded" * 20, IfMatch=etag)
    client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            retries={"total_max_attempts": 1},
            max_pool_connections=32,
            s3={"addressing_style": "path"},
            # the same checksum settings as S3Store: the floor does the same work per request
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
        **FAKE_CREDS,
    )


def floor_worker(endpoint: str, prefix: str, start: int, n: int, threads: int) -> float:
    client = _client(endpoint)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: _floor_job(client, prefix, i), range(start, start + n)))
    return time.perf_counter() - t0


def s3_floor(endpoint: str, n: int, processes: int, threads: int) -> float:
    """Jobs per second of the minimal request sequence."""
    prefix = f"floor-{new_id()}"
    if processes == 1:
        return n / floor_worker(endpoint, prefix, 0, n, threads)
    code = (
        "import sys; from bench.queue import floor_worker; "
        "print(floor_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "
        "int(sys.argv[5])))"
    )
    per = n // processes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, endpoint, prefix, str(k * per), str(per), str(threads)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    for p in procs:
        p.wait(600)
    return per * processes / (time.perf_counter() - t0)


# -- payload and streaming --------------------------------------------------------------------

PAYLOAD = 5 * 1024 * 1024


def payload(url: str, endpoint: str, n: int = 8) -> dict[str, float]:
    """MB/s of jobs whose argument is 5 MiB (spilled to its own object), drained by one
    worker process; against raw boto3 PUT + GET of the same bytes on the same server."""
    data = os.urandom(PAYLOAD)
    client = _client(endpoint)
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
    segments = len(list(q.store.list(q.ops("default").keys.journal_prefix(inv, 1))))
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
    """Lost CAS per claimed job. Each worker has a plane of its own (as separate processes
    would): the slots of one plane share a listing and never race each other."""
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


def _row(name: str, value: float, target: str, ok: bool | None, unit: str = "") -> dict[str, Any]:
    return {"measure": name, "value": value, "unit": unit, "target": target, "met": ok}


def _at_least(name: str, value: float, bound: float, unit: str) -> dict[str, Any]:
    return _row(name, value, f">= {bound:g}", value >= bound, unit)


def _at_most(name: str, value: float, bound: float, unit: str) -> dict[str, Any]:
    return _row(name, value, f"<= {bound:g}", value <= bound, unit)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lakeshore queue benchmarks")
    parser.add_argument("--jobs", type=int, default=500, help="jobs per throughput run")
    args = parser.parse_args(argv)
    n = args.jobs
    os.environ.update({k.upper(): v for k, v in FAKE_CREDS.items()})
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "jobs": n, "cores": os.cpu_count()}
    res["requests"] = {
        "no-op job": requests_per_job(False),
        "no-op job with _key": requests_per_job(True),
        "claim, 0 finished": requests_per_claim(0),
        "claim, 10000 finished": requests_per_claim(10_000),
    }
    res["idle_requests_per_min"] = idle_cost()
    res["idle_requests_per_min_8_slots"] = idle_cost(concurrency=8)
    tp: dict[str, Any] = {"memory, in-process": throughput(":memory:", MemoryStore(), n, 0, 1)}
    with tempfile.TemporaryDirectory(prefix="lakeshore-bench-") as d:
        tp["file, 1 process"] = throughput(f"file://{d}/p", None, n, 1, 1)
        tp["file, 2 processes"] = throughput(f"file://{d}/p", None, n, 2, 1)
        res["latency_file"] = latency(f"file://{d}/p", None)
        res["contention_file"] = contention(LocalStore(f"{d}/c"))
    res["latency_memory"] = latency(":memory:", MemoryStore())
    res["upstream"] = upstream(n)
    with seaweed_server() as server:
        if server is not None:
            url = f"s3://{BUCKET}/bench-{new_id()}?endpoint_url={server.endpoint}"
            res["floor_serial"] = s3_floor(server.endpoint, n, 1, 1)
            res["floor_concurrent"] = s3_floor(server.endpoint, n, 2, 8)
            tp["seaweedfs, 1 process"] = throughput(url, None, n, 1, 1)
            tp["seaweedfs, 2 processes x 8"] = throughput(url, None, n, 2, 8)
            res["latency_seaweedfs"] = latency(url, None)
            res["contention_seaweedfs"] = contention(dls.Dispatch(url).store)
            res["stream_seaweedfs"] = streaming(url)
            res["payload_seaweedfs"] = payload(url, server.endpoint)
    res["throughput"] = tp
    rows = _rows(res)
    res["table"] = rows
    print(f"\nlakeshore queue benchmarks, {n} jobs, {os.cpu_count()} cores, {res['date']}\n")
    for name, t in tp.items():
        print(
            f"  {name:<28} submit {t['submit_per_s']:8.0f}/s  drain {t['drain_per_s']:8.0f}/s"
            f"  end to end {t['end_to_end_per_s']:8.0f}/s"
        )
    print()
    for r in rows:
        mark = {True: "ok", False: "MISSED", None: "-"}[r["met"]]
        print(f"  {r['measure']:<52} {r['value']:>10.2f} {r['unit']:<10} {r['target']:<22} {mark}")
    out = ROOT / "bench" / "results" / "queue.json"
    out.write_text(json.dumps(res, indent=2))
    print(f"\nresults: {out.relative_to(ROOT)}")


def _rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    tp = res["throughput"]
    up = res.get("upstream")
    if up:  # None when upstream's venv could not be made (no network)
        mem = tp["memory, in-process"]["end_to_end_per_s"] / up["memory"]["end_to_end_per_s"]
        lat = up["latency_memory"]["p50_ms"] / res["latency_memory"]["p50_ms"]
        two = tp["file, 2 processes"]["end_to_end_per_s"] / up["file_2"]["end_to_end_per_s"]
        rows += [
            _at_least("memory in-process / upstream memory", mem, 3, "x"),
            _at_least("round trip p50 upstream memory / lakeshore memory", lat, 4, "x"),
            _at_least("file 2 workers / upstream sqlite file 2 workers", two, 2, "x"),
        ]
    if "floor_serial" in res:
        one = tp["seaweedfs, 1 process"]["end_to_end_per_s"]
        many = tp["seaweedfs, 2 processes x 8"]["end_to_end_per_s"]
        rows += [
            _at_least("SeaweedFS 1 worker / serial S3 floor", one / res["floor_serial"], 0.8, "x"),
            _at_least(
                "SeaweedFS 2x8 / concurrent S3 floor", many / res["floor_concurrent"], 0.8, "x"
            ),
            _at_least("SeaweedFS 2x8 / own serial", many / one, 2, "x"),
        ]
    req = res["requests"]
    for name in ("no-op job", "no-op job with _key"):
        rows.append(_at_most(f"class A per {name}", req[name]["class_a"], 5, "requests"))
        rows.append(_at_most(f"class B per {name}", req[name]["class_b"], 3, "requests"))
        rows.append(
            _row(f"USD per million, {name}", req[name]["usd_per_million"], "-", None, "USD")
        )
    flat = req["claim, 10000 finished"]["class_a"] + req["claim, 10000 finished"]["class_b"]
    base = req["claim, 0 finished"]["class_a"] + req["claim, 0 finished"]["class_b"]
    rows.append(
        _row(
            "claim requests, 10000 finished / 0 finished",
            flat / base,
            "== 1 (flat)",
            abs(flat / base - 1) < 0.05,
            "x",
        )
    )
    two = tp["file, 2 processes"]["end_to_end_per_s"]
    one_f = tp["file, 1 process"]["end_to_end_per_s"]
    rows.append(_at_least("file:// 2 workers / 1 worker", two / one_f, 1.5, "x"))
    rows.append(_at_most("idle worker", res["idle_requests_per_min"], 60, "req/min"))
    rows.append(
        _at_most("idle worker, 8 slots", res["idle_requests_per_min_8_slots"], 60, "req/min")
    )
    for backend in ("file", "seaweedfs"):
        key = f"contention_{backend}"
        if key in res:
            rows.append(
                _at_most(
                    f"lost CAS per claimed job, 8 workers, {backend}", res[key], 0.5, "per job"
                )
            )
    if "stream_seaweedfs" in res:
        st = res["stream_seaweedfs"]
        per_put, live = st["frames_per_put"], st["live_frames_per_s"]
        rows.append(_at_least("frames per PUT, SeaweedFS", per_put, 100, "frames"))
        rows.append(_at_least("frames/s read live, SeaweedFS", live, 20_000, "frames/s"))
        rows.append(
            _row("frames/s replayed, SeaweedFS", st["replay_frames_per_s"], "-", None, "frames/s")
        )
    if "payload_seaweedfs" in res:
        pl = res["payload_seaweedfs"]
        rows.append(_row("5 MiB payload jobs, SeaweedFS", pl["mb_per_s"], "-", None, "MB/s"))
        rows.append(_row("5 MiB payload / raw boto3 PUT+GET", pl["ratio"], "-", None, "x"))
    for backend in ("memory", "file", "seaweedfs"):
        key = f"latency_{backend}"
        if key in res:
            rows.append(_row(f"round trip p50, {backend}", res[key]["p50_ms"], "-", None, "ms"))
            rows.append(_row(f"round trip p99, {backend}", res[key]["p99_ms"], "-", None, "ms"))
    return rows


if __name__ == "__main__":
    main()
