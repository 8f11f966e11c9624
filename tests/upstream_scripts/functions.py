"""udf: local when bare, remote by default with a queue; thunks; run_worker(q)."""

import os
import threading

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.dispatch import DispatchError

dp = dls.Dispatch(os.environ["PLANE"])


@dls.udf
def add(a, b=1):
    return a + b


@dls.udf(queue="fq")
def mul(a, b=2):
    return a * b


@dls.udf(queue="fq")
def boom(x):
    raise ValueError(f"bad {x}")


@dls.udf(queue="fq")
def count_to(n):
    yield from range(n)


def plain(a, b):
    return a - b


@dls.udf
def inner(x):
    return x + 100


@dls.udf(queue="fq")
def outer(x):
    return inner(x) * 2  # a bare udf called from inside another: runs right there


print("bare call:", add(2), "local:", add.local(3, b=4), "queue:", add.queue)
try:
    add.submit(1)
except TypeError as e:
    print("bare submit:", type(e).__name__)

q = dls.SyncQueue("fq", dispatch=dp)
inv = mul.submit(4, _dispatch=dp, _key="k1")
print("same key, same id:", mul.submit(4, _dispatch=dp, _key="k1") == inv, "queued:", len(q))
print("once:", dls.run_worker(q, once=True), "result:", q.result(inv, timeout=10))
print("once on an empty queue:", dls.run_worker(q, once=True))

stop = threading.Event()
worker = threading.Thread(target=dls.run_worker, args=(q,), kwargs={"stop": stop.is_set})
worker.start()
print("plain call submits and waits:", mul(7, _dispatch=dp))
print("remote:", mul.remote(10, b=3, _dispatch=dp), "local:", mul.local(5))
try:
    boom(1, _dispatch=dp)
except DispatchError as e:
    print("remote failure:", type(e).__name__, "ValueError: bad 1" in str(e))
gen = count_to.submit(4, _dispatch=dp)
print("streamed:", list(q.stream(gen, timeout=10)))
th = q.submit(dls.thunk(plain, 10, b=4))
print("thunk:", q.result(th, timeout=10), repr(dls.thunk(plain, 1, 2)))
print("call:", q.call(dls.thunk(plain, 3, b=1), timeout=10))
print("nested:", outer(1, _dispatch=dp), outer.local(2))
stop.set()
worker.join()
print(repr(add), repr(mul), repr(count_to))
