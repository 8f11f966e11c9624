"""The scale model: what a queue asks of S3 as invocations/s and workers grow, and what it
costs.

Every figure comes from request counts measured in this run (a counting store under a real
plane: no-op invocations submitted, run by one worker and read back by another plane; an
idle worker polling), then multiplied out for 100 to 10,000 workers. What many workers add
per invocation (lost races, reads of invocations another worker took) is not in these
counts: ``bash scripts/bench simulate`` measures it. S3 serves at least 3,500
PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per partitioned prefix (LIST is
counted with the reads here; S3 does not say). All of one queue's keys share the prefix
``lakeshore/<ns>/<queue>/``, and its ids, which start with the time, all land at the end of
that key range, so this model gives each queue one partition's worth; the signs of life
and the claimers' census of them are under the namespace's ``_workers/``. Prices: S3
Standard, us-east-1 ($0.005 per 1,000 PUT, POST, LIST; $0.0004 per 1,000 GET; DELETE free).

    bash scripts/bench model
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.counting import PRICE_CLASS_A, PRICE_CLASS_B
from bench.queue import idle_cost, job_requests
from lakeshore.protocol.lanes import CENSUS_MAX_S

WRITES_PER_PREFIX = 3500
READS_PER_PREFIX = 5500
BUSY_LISTS_PER_S = 1.0  # a busy worker process lists a queue at most once a second
SIGN_OF_LIFE_S = 30.0
RESULTS = Path(__file__).resolve().parent / "results"


def per_job(keyed: bool, n: int = 500) -> dict[str, float]:
    """Requests per no-op invocation (submit, run, one result read by a plane that never
    submitted), split into writes and reads as S3 counts them for its per-prefix limits."""
    c = job_requests(keyed, n)
    deleted_keys = n  # a batch delete removes one ticket per invocation; S3 may count each key
    return {
        "put": c["PUT"] / n,
        "get": c["GET"] / n,
        "list": c["LIST"] / n,
        "batch_delete": c["BATCH_DELETE"] / n,
        "writes": (c["PUT"] + c["DELETE"] + deleted_keys) / n,
        "reads": (c["GET"] + c["LIST"]) / n,
        "requests": (c["PUT"] + c["GET"] + c["LIST"] + c["DELETE"] + c["BATCH_DELETE"]) / n,
        "usd_per_million": 1e6
        * (
            (c["PUT"] + c["LIST"] + c["BATCH_DELETE"]) / n * PRICE_CLASS_A
            + c["GET"] / n * PRICE_CLASS_B
        ),
    }


def model(job: dict[str, float], idle_per_min: float) -> dict[str, Any]:
    """Requests per second on one queue's prefix, and on the namespace's ``_workers/``
    (signs of life, and the claimers' census of them), for 100 to 10,000 workers at 0 (idle),
    100 and 1,000 invocations a second. Per invocation: one worker's counts (``job``);
    what many workers add to them (races, reads of taken invocations) is the simulation's
    (``bash scripts/bench simulate``)."""
    idle_lists_per_s = (idle_per_min - 60 / SIGN_OF_LIFE_S) / 60  # what is not a sign of life
    rows = []
    for workers in (100, 1000, 10_000):
        for jobs_per_s in (0, 100, 1000):
            busy = min(workers, jobs_per_s)  # a rough split: a worker per invocation/s is busy
            lists = busy * BUSY_LISTS_PER_S + (workers - busy) * idle_lists_per_s
            writes = jobs_per_s * job["writes"]
            reads = jobs_per_s * job["reads"] + lists
            # each worker: a sign of life every 30 s, and a census of all of them (one LIST
            # page per 1,000 workers) at most every CENSUS_MAX_S once the fleet holds still
            census_pages = workers * -(-workers // 1000) / CENSUS_MAX_S
            usd_day = 86400 * (
                jobs_per_s * job["usd_per_million"] / 1e6
                + (lists + census_pages + workers / SIGN_OF_LIFE_S) * PRICE_CLASS_A
            )
            rows.append(
                {
                    "jobs_per_s": jobs_per_s,
                    "workers": workers,
                    "writes_per_s": writes,
                    "reads_per_s": reads,
                    "writes_of_limit": writes / WRITES_PER_PREFIX,
                    "reads_of_limit": reads / READS_PER_PREFIX,
                    "workers_prefix_writes_per_s": workers / SIGN_OF_LIFE_S,
                    "workers_prefix_lists_per_s": census_pages,
                    "usd_per_day": usd_day,
                }
            )
    idle_day = 1000 * 86400 * (idle_lists_per_s + 1 / SIGN_OF_LIFE_S) * PRICE_CLASS_A
    return {
        "rows": rows,
        "max_jobs_per_s_per_queue": WRITES_PER_PREFIX / job["writes"],
        "max_idle_workers_per_queue": READS_PER_PREFIX / idle_lists_per_s,
        "idle_1000_workers_usd_per_day": idle_day,
        "idle_requests_per_worker_min": idle_per_min,
    }


def main() -> None:
    plain, keyed = per_job(False), per_job(True)
    idle = idle_cost()
    out = {"date": time.strftime("%Y-%m-%d"), "job": plain, "keyed_job": keyed}
    out["model"] = model(plain, idle)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "model.json").write_text(json.dumps(out, indent=2))
    m = out["model"]
    print(f"\nlakeshore scale model, {out['date']}\n")
    for name, j in (("no-op invocation", plain), ("with _key", keyed)):
        print(
            f"  {name:<16} {j['requests']:.2f} requests ({j['put']:.2f} PUT, {j['get']:.2f} GET, "
            f"{j['list']:.3f} LIST, {j['batch_delete']:.3f} batch DELETE): {j['writes']:.2f} "
            f"writes, {j['reads']:.2f} reads; ${j['usd_per_million']:.2f} per million invocations"
        )
    print(f"  idle worker: {m['idle_requests_per_worker_min']:.0f} requests per minute")
    print(
        f"\n  {'workers':>8} {'invocations/s':>13} {'writes/s':>9} {'of 3500':>8} {'reads/s':>8} "
        f"{'of 5500':>8} {'_workers/ PUT/s':>15} {'LIST/s':>7} {'USD/day':>9}"
    )
    for r in m["rows"]:
        print(
            f"  {r['workers']:>8} {r['jobs_per_s']:>13} {r['writes_per_s']:>9.0f} "
            f"{r['writes_of_limit']:>8.2f} {r['reads_per_s']:>8.0f} {r['reads_of_limit']:>8.2f} "
            f"{r['workers_prefix_writes_per_s']:>15.0f} {r['workers_prefix_lists_per_s']:>7.0f} "
            f"{r['usd_per_day']:>9.2f}"
        )
    print(
        f"\n  one queue's prefix holds up to {m['max_jobs_per_s_per_queue']:.0f} invocations/s of "
        f"writes and {m['max_idle_workers_per_queue']:.0f} idle workers' listings; "
        f"1,000 idle workers cost ${m['idle_1000_workers_usd_per_day']:.2f} a day"
    )


if __name__ == "__main__":
    main()
