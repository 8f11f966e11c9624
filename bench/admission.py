"""What admission costs a submit: requests counted, and submit rate against the same queue
without limits, measured in the same run.

    bash scripts/bench admission     # or: .venv/bin/python -m bench.admission [--jobs N]

Four configurations of one queue: no limits, ``max_depth``, ``rate_limit``, both. For each:
requests per submit by verb (PUT / GET / LIST / DELETE), counted by a wrapper around the store,
and submits per second on a local directory and on SeaweedFS (started here, on loopback), as a
ratio of the unlimited queue's rate in the same run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench.counting import Counting
from lakeshore.store import LocalStore, MemoryStore

CONFIGS: dict[str, dict[str, Any]] = {
    "none": {},
    "max_depth": {"max_depth": 1_000_000},
    "rate_limit": {"rate_limit": "1000000/s"},
    "both": {"max_depth": 1_000_000, "rate_limit": "1000000/s"},
}


def add_one(x: int) -> int:
    return x + 1


def requests_per_submit(jobs: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, conf in CONFIGS.items():
        store = Counting(MemoryStore())
        q = dls.Dispatch(store.url, store=store)
        if conf:
            q.configure("b", **conf)
        f = q.udf(queue="b")(add_one)
        f.submit(0)  # warm the settings cache and the queue record
        store.counts.clear()
        for i in range(jobs):
            f.submit(i)
        out[name] = {k: v / jobs for k, v in sorted(store.counts.items())}
    return out


def submit_rate(store_factory: Any, jobs: int) -> dict[str, float]:
    rates = {}
    for name, conf in CONFIGS.items():
        store = store_factory()
        q = dls.Dispatch(store.url, store=store)
        if conf:
            q.configure("b", **conf)
        f = q.udf(queue="b")(add_one)
        f.submit(0)
        t0 = time.perf_counter()
        for i in range(jobs):
            f.submit(i)
        rates[name] = jobs / (time.perf_counter() - t0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    counts = requests_per_submit(args.jobs)
    print("requests per submit (memory store, counted):")
    for name, c in counts.items():
        print(f"  {name:<11} " + "  ".join(f"{k} {v:.2f}" for k, v in c.items()))
    rows: dict[str, Any] = {"requests_per_submit": counts}
    backends = {"local": lambda: LocalStore(tempfile.mkdtemp(prefix="lakeshore-bench-"))}
    from bench.seaweed_env import seaweed_server
    from lakeshore.store.s3 import S3Store
    from tests.tiers import FAKE_CREDS

    with seaweed_server() as server:
        if server is not None:
            n = iter(range(100))
            backends["seaweedfs"] = lambda: S3Store(
                "lakeshore-test", f"adm-{next(n)}", endpoint_url=server.endpoint, **FAKE_CREDS
            )
        print("submits per second, and as a ratio of the same queue without limits (same run):")
        for backend, factory in backends.items():
            rates = submit_rate(factory, args.jobs)
            rows[backend] = rates
            line = "  ".join(f"{k} {v:.0f}/s ({v / rates['none']:.2f})" for k, v in rates.items())
            print(f"  {backend:<10} {line}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "admission.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
