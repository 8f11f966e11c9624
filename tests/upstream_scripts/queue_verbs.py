"""SyncQueue as a plain work queue: submit, keys, claim, ack, nack, working, counts, fencing."""

import os

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.dispatch import DispatchError

dp = dls.Dispatch(os.environ["PLANE"])
q = dls.SyncQueue("jobs", dispatch=dp)

a = q.submit({"x": 1})
b = q.submit({"x": 2}, key="k2")
print("same id for the same key:", q.submit({"x": 999}, key="k2") == b, "queued:", len(q))
job = q.claim()
print("claimed:", isinstance(job, dls.Job), job.id == a, job.payload, job.attempt, job.queue)
q.ack(job, {"ok": 1})
print("result:", q.result(a, timeout=5))

job = q.claim()
q.nack(job, error="try again")
job = q.claim()
print("after a nack: same job", job.id == b, "attempt", job.attempt)
q.nack(job, error="final", retry=False)
try:
    q.result(b, timeout=5)
except DispatchError as e:
    print("failed job:", type(e).__name__, str(e).endswith("failed: final"))

pending = q.submit("pending")
try:
    q.result(pending, timeout=0.3)
except TimeoutError as e:
    print("still queued:", type(e).__name__)
print("cancel queued:", q.cancel(pending), "again:", q.cancel(pending))

for payload in [(1, b"b", [1.5], {"k": None}), "text", None, 7]:
    inv = q.submit(payload)
    job = q.claim()
    q.ack(job, job.payload)
    print("round trip:", repr(q.result(inv, timeout=5)))

low, high = q.submit("low", priority=-2), q.submit("high", priority=3)
mid = q.submit("mid")
print("order:", [q.claim().payload for _ in range(3)])

with q.working() as job:
    print("working on an empty queue:", job)
inv = q.submit("w")
with q.working() as job:
    print("working:", job.payload)
print("acked by working:", q.result(inv, timeout=5))
inv = q.submit("boom")
try:
    with q.working() as job:
        raise ValueError("nope")
except ValueError:
    print("working re-raises; the job is queued again:", q.count("queued"))

other = dls.SyncQueue("jobs", dispatch=dp)
job = q.claim()
try:
    other.ack(job, "x")
except DispatchError as e:
    print("ack by another consumer:", type(e).__name__)
q.ack(job, "mine")
try:
    q.ack(job, "twice")
except DispatchError as e:
    print("second ack:", type(e).__name__)
print(
    "counts:",
    {s: q.count(s) for s in ["queued", "running", "succeeded", "failed", "cancelled", "bogus"]},
)
print(repr(q))
