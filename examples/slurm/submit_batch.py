"""Submit a batch of simulations and wait for it: the producer side of the SLURM example.

Run it from a login node, a laptop or a CI job: anywhere the store can be reached. It does
not need the workers to be running yet; invocations wait in the queue for them.

    export LAKESHORE_URL=s3://my-bucket/lakeshore
    python submit_batch.py --count 500 --batch run-2026-11-30

Every submit carries an idempotency key built from the batch name and the invocation's
index (``_key="<batch>/<index>"``). Running the script again with the same ``--batch`` (after
a crash, a Ctrl-C, a lost connection) returns the same ids instead of enqueueing the
invocations twice, and then simply waits for them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import jobs  # this script's folder is on sys.path; workers find `jobs` through PYTHONPATH

import lakeshore as dls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="store URL (default: $LAKESHORE_URL, else file://~/.lakeshore)")
    p.add_argument("--ns", default="default", help="namespace (default: default)")
    p.add_argument("--count", "-n", type=int, default=100, help="how many to submit (default 100)")
    p.add_argument("--steps", type=int, default=200_000, help="walk length per invocation")
    p.add_argument("--batch", default="demo", help="batch name; part of every invocation's _key")
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    p.add_argument("--no-wait", action="store_true", help="submit, print the ids, and exit")
    args = p.parse_args()

    q = dls.Dispatch(args.url, ns=args.ns)
    simulate = q.udf(queue=jobs.QUEUE, max_attempts=3)(jobs.simulate)
    t0 = time.monotonic()
    ids = [
        simulate.submit(seed, steps=args.steps, _key=f"{args.batch}/{seed:06d}")
        for seed in range(args.count)
    ]
    print(f"{len(ids)} invocations on {q.url} queue {jobs.QUEUE}, batch {args.batch!r}", flush=True)
    if args.no_wait:
        print("\n".join(ids))
        return 0

    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    states = {inv: "queued" for inv in ids}
    delay = 0.5
    while True:
        for inv, state in states.items():
            if state in ("queued", "running"):
                states[inv] = q.status(inv)
        counts = Counter(states.values())
        done = sum(n for s, n in counts.items() if s not in ("queued", "running"))
        print(f"\r{done}/{len(ids)} finished  {dict(sorted(counts.items()))}", end="", flush=True)
        if done == len(ids) or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(delay)  # polling the store is the only way to learn; keep it gentle
        delay = min(delay * 1.5, 10.0)
    print()

    results = [q.result(inv) for inv, s in states.items() if s == "succeeded"]
    if results:
        hosts = Counter(r["host"] for r in results)
        mean = sum(r["msd"] for r in results) / len(results)
        print(f"mean msd over {len(results)} walks: {mean:.1f}  (hosts: {dict(hosts)})")
    for inv, state in states.items():
        if state != "succeeded":
            print(f"  {inv}  {state}   (lakeshore show {inv}; lakeshore logs {inv})")
    print(f"{time.monotonic() - t0:.1f} s")
    if any(s in ("queued", "running") for s in states.values()):
        return 3
    return 0 if all(s == "succeeded" for s in states.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
