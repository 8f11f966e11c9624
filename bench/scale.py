"""Many workers on one queue: P worker processes × S slots draining one queue on SeaweedFS.

Each shape gets a queue of its own holding N invocations submitted beforehand; then P
``lakeshore worker`` processes (the command line's defaults: process isolation, the default
S3 client) are started, load, wait at a gate (``bench.scale_worker.py``) and are released
together. Figures per shape, by this machine's clock (each sleeping body reports when it
began and ended; the store's clock, from Date headers in whole seconds, is too coarse to time
a drain with; the no-op drains, which report nothing, are timed by it from their first claim):

- **efficiency, start-up included**: the ideal drain (N × body ÷ P·S) over the time from the
  gate to the last outcome; everything a launched worker does before its slots are busy
  (opening the store, listing, starting body processes) counts;
- **steady**: the same between the 100th and the N−100th outcome;
- **first body**: from the gate to each worker process's first body starting (the slowest of
  them), which is its first claim and the start of a body process;
- **requests per invocation**: what the SeaweedFS server counted (its Prometheus counters, by
  S3 operation and status) while the workers ran, and the producer's submit and result reads
  apart;
- **lost claim races**: conditional writes refused with 412, per claim.

Every id must have run exactly once (one attempt, one turn in its history).

    bash scripts/bench scale    # 1x32, 4x8, 16x2, 32x1 sleeping 0.5 s; no-op at 1, 2, 16
    bash scripts/bench scale --shapes 4x8 --jobs 300
    BENCH_WORKER_ARGS="--isolation thread" bash scripts/bench scale   # extra worker options
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench.bodies import nap, noop
from bench.seaweed_env import BUCKET, seaweed_server
from lakeshore.keys import new_id
from tests.tiers import FAKE_CREDS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
_LINE = re.compile(r"^SeaweedFS_s3_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def server_counts(metrics: str) -> Counter[str]:
    """The server's request counters: ``"PUT 200"`` → how many so far."""
    text = urllib.request.urlopen(metrics, timeout=10).read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        out[f"{labels.get('type', '?')} {labels.get('code', '?')}"] += int(float(m["value"]))
    return out


def _delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})


def _launch(url: str, ns: str, processes: int, slots: int, gate: Path) -> list[Any]:
    env = {**os.environ, "LAKESHORE_URL": url, "PYTHONPATH": str(ROOT), "BENCH_GATE": str(gate)}
    cmd = [
        sys.executable,
        "-m",
        "bench.scale_worker",
        "worker",
        "--import",
        "bench.bodies",
        "--allow",  # plain functions: a worker runs them only when allowed
        "bench.bodies:*",
        "--ns",
        ns,
        "--concurrency",
        str(slots),
        "--log-level",
        "warning",
        *os.environ.get("BENCH_WORKER_ARGS", "").split(),
    ]
    return [subprocess.Popen(cmd, env=env, text=True) for _ in range(processes)]


def _wait_ready(procs: list[Any], gate: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(Path(f"{gate}.{p.pid}").exists() for p in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("the worker processes did not start")
        time.sleep(0.01)  # files written by other processes


def _wait_done(q: Any, ids: list[str], timeout: float) -> int:
    """Wait until every invocation is over; returns how many GETs that took (the server
    counts them with the workers' requests)."""
    deadline = time.monotonic() + timeout
    left = list(ids)
    gets = 0
    while left:
        while True:
            gets += 1
            if q.get(left[-1]).terminal:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(left)} invocations did not finish in {timeout:.0f} s")
            time.sleep(0.2)  # one GET a poll: the workers are other processes
        gets += len(left) - 1
        left = [i for i in left[:-1] if not q.get(i).terminal]
    return gets


def shape(
    url: str, metrics: str, processes: int, slots: int, n: int, body_s: float | None
) -> dict[str, Any]:
    """Drain ``n`` invocations (sleeping ``body_s``, or no-ops) with ``processes`` × ``slots``."""
    ns = f"sc{new_id().lower()[-8:]}"
    q = dls.Dispatch(url, ns=ns)
    f = q.udf(nap if body_s is not None else noop)
    c0 = server_counts(metrics)
    ids = f.map([body_s if body_s is not None else i for i in range(n)])
    c1 = server_counts(metrics)
    gate = Path(tempfile.mkdtemp(prefix="lakeshore-scale-")) / "go"
    procs = _launch(url, ns, processes, slots, gate)
    try:
        _wait_ready(procs, gate)
        c2 = server_counts(metrics)
        released = time.time()  # this machine's clock, as the bodies report (bench.bodies.nap)
        gate.touch()
        polled = _wait_done(q, ids, timeout=60 + 10 * n * (body_s or 0.05) / (processes * slots))
        for p in procs:
            p.send_signal(signal.SIGTERM)  # graceful: they flush their ticket deletes
        for p in procs:
            p.wait(60)
        c3 = server_counts(metrics)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        shutil.rmtree(gate.parent, ignore_errors=True)
    values = [q.result(i) for i in ids]  # one GET each: what a reader pays
    c4 = server_counts(metrics)
    recs = [q.get(i) for i in ids]
    bad = [r.id for r in recs if r.state != "succeeded" or r.attempt != 1 or len(r.history) != 1]
    assert not bad, f"{len(bad)} invocations did not run exactly once, e.g. {bad[:3]}"
    if body_s is None:
        assert values == [i + 1 for i in range(n)]
    if body_s is not None:  # when each body began and ended, by this machine's clock
        spans = [(float(v[0]), float(v[1])) for v in values]
    else:  # no-ops report nothing: the store's clock (whole seconds of Date headers)
        released = min(float(r.history[0].started_at) for r in recs)
        spans = [(float(r.history[0].started_at), float(r.finished_at or 0.0)) for r in recs]
    finished = sorted(end for _, end in spans)
    first: dict[str, float] = {}
    for r, (began, _) in zip(recs, spans, strict=True):
        worker_id = r.history[0].worker
        first[worker_id] = min(first.get(worker_id, float("inf")), began)
    drain_s = finished[-1] - released
    lo, hi = min(100, n // 6), max(n - 100, n - n // 6)
    steady_s = finished[hi - 1] - finished[lo - 1]
    worker = _delta(c3, c2)
    worker["GET 200"] -= polled  # the benchmark's own
    total = _delta(c4, c0)
    total["GET 200"] -= polled
    claims = n  # one claim per invocation, each won once (checked above)
    out: dict[str, Any] = {
        "processes": processes,
        "slots": slots,
        "jobs": n,
        "body_s": body_s,
        "drain_s": drain_s,
        "first_claim_s": max(first.values()) - released,
        "first_claims_s": sorted(t - released for t in first.values()),
        "workers_claiming": len(first),
        "submit": dict(_delta(c1, c0)),
        "workers": dict(worker),
        "read": dict(_delta(c4, c3)),
        "worker_requests_per_job": sum(worker.values()) / n,
        "requests_per_job": sum(total.values()) / n,
        "lost_races_per_claim": sum(v for k, v in worker.items() if k.endswith(" 412")) / claims,
    }
    if body_s is not None:
        ideal = n * body_s / (processes * slots)
        out["efficiency"] = ideal / drain_s
        out["steady"] = (hi - lo) * body_s / (processes * slots) / steady_s
        # where a drain's time goes: up to the first `lo` outcomes, the steady part, the tail
        # after the `hi`th; each against its ideal on every slot
        per = body_s / (processes * slots)
        out["phases_s"] = {
            "ramp": (finished[lo - 1] - released, lo * per),
            "steady": (steady_s, (hi - lo) * per),
            "tail": (finished[-1] - finished[hi - 1], (n - hi) * per),
        }
    else:
        out["drain_per_s"] = n / drain_s
    return out


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(p), int(s)) for p, s in (x.split("x") for x in text.split(",") if x)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shapes are PxS,PxS…, not {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="many worker processes on one queue")
    parser.add_argument("--shapes", type=_parse_shapes, default=_parse_shapes("1x32,4x8,16x2,32x1"))
    parser.add_argument("--jobs", type=int, default=600, help="invocations per shape")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each body sleeps")
    parser.add_argument(
        "--noop",
        type=_parse_shapes,
        default=_parse_shapes("1x1,2x1,16x1"),
        help="shapes of the no-op drains (requests per invocation, lost races)",
    )
    parser.add_argument("--noop-jobs", type=int, default=600)
    args = parser.parse_args(argv)
    os.environ.update({k.upper(): v for k, v in FAKE_CREDS.items()})
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    rows: list[dict[str, Any]] = []
    with seaweed_server(metrics=True) as server:
        if server is None or server.metrics is None:
            return
        url = f"s3://{BUCKET}/scale-{new_id()}?endpoint_url={server.endpoint}"
        res["seaweedfs"] = server.version
        for p, s in args.shapes:
            rows.append(shape(url, server.metrics, p, s, args.jobs, args.sleep))
            _show(rows[-1])
        for p, s in args.noop:
            rows.append(shape(url, server.metrics, p, s, args.noop_jobs, None))
            _show(rows[-1])
    res["rows"] = rows
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(res, indent=2))


def _show(r: dict[str, Any]) -> None:
    what = f"{r['processes']:>2} x {r['slots']:<2} {'sleep' if r['body_s'] else 'no-op'}"
    if r["body_s"]:
        perf = (
            f"efficiency {r['efficiency']:.2f} steady {r['steady']:.2f} drain {r['drain_s']:.1f} s"
        )
        perf += (
            " ("
            + ", ".join(
                f"{k} {got:.1f} s of {ideal:.1f}" for k, (got, ideal) in r["phases_s"].items()
            )
            + ")"
        )
    else:
        perf = f"{r['drain_per_s']:.0f}/s"
    top = sorted(r["workers"].items(), key=lambda kv: -kv[1])[:6]
    print(
        f"{what}  {perf}  first body {r['first_claim_s']:.2f} s ({r['workers_claiming']} claimed)"
        f"  requests/inv {r['requests_per_job']:.2f} (workers {r['worker_requests_per_job']:.2f})"
        f"  412/claim {r['lost_races_per_claim']:.3f}  workers: "
        + ", ".join(f"{k} {v / r['jobs']:.2f}" for k, v in top),
        flush=True,
    )


if __name__ == "__main__":
    main()
