"""Streams of a claimed job (post, since = the last seq seen) and topics."""

import os

import dreamlake.lakeshore as dls

dp = dls.Dispatch(os.environ["PLANE"])
q = dls.SyncQueue("s", dispatch=dp)

inv = q.submit("job")
job = q.claim()
print("seqs:", [q.post(inv, f"v{i}") for i in range(3)])
q.post(inv, None, final=True)
q.ack(job, "done")
for since in (-1, 0, 1, 2):
    print(f"stream(since={since}):", list(q.stream(inv, since=since, timeout=5)))
print("result:", q.result(inv, timeout=5))

t = q.topic("progress")
print(repr(t), isinstance(t, dls.Topic), "posts:", [t.post({"step": i}) for i in range(3)])
for since in (-1, 0, 1, 2):
    print(f"listen(since={since}):", t.listen(since=since, timeout=0.3))
print("listen twice:", t.listen(), t.listen())
try:
    list(t.stream(timeout=0.3))
except TimeoutError:
    print("stream without an end: TimeoutError")
print("end seq:", t.post("dropped", final=True))
print("stream:", list(t.stream(since=-1)), list(t.stream(since=1)))
print(
    "same topic from another queue:",
    dls.SyncQueue("other", dispatch=dp).topic("progress").listen(since=0),
)
