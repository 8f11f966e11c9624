"""The async Queue, scopes and dls.run in a local udf, lifecycle hooks, inert run configs."""

import asyncio
import os

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import lifecycle

dp = dls.Dispatch(os.environ["PLANE"])


async def main():
    q = dls.Queue("aq", dispatch=dp)
    print(repr(q), repr(q.sync))
    inv = await q.submit({"a": 1}, key="ka", priority=1)
    job = await q.claim()
    print("claimed:", job.payload, job.attempt)
    await q.nack(job, error="e1")
    job = await q.claim()
    print("again:", job.attempt, "count running:", await q.count("running"))
    await q.ack(job, {"done": True})
    print("result:", await q.result(inv))
    inv = await q.submit("s")
    job = await q.claim()
    q.sync.post(inv, "frame0")
    await q.ack(job)
    print("async stream:", [v async for v in q.stream(inv)])
    print("cancel:", await q.cancel(await q.submit("x")))


asyncio.run(main())


@dls.udf
def make_mesh(name):
    key = f"mesh/{name}.txt"
    dls.run.write(key).write_text("mesh")
    return key


with dls.scope("scenes/7"):
    print("prefix:", dls.run.prefix, "key:", make_mesh("a"))
    with dls.scope("ep/1"):
        print("nested:", dls.run.prefix)
print("outside:", repr(dls.run.prefix))

cfg = dls.RunConfig(runner="process", host_setup=["pip install torch"])


@dls.udf(queue="gpu", config=cfg)
def train(x):
    return x


print("config kept:", train.config is cfg, train.queue)

seen = []
lifecycle.on_host_setup(lambda: seen.append("host"))
lifecycle.on_run_setup(lambda: seen.append("run"))
lifecycle.on_shutdown(lambda: seen.append("shutdown"))
print("phase:", lifecycle.phase())
lifecycle.run_host_setup_hooks()
lifecycle.run_host_setup_hooks()
lifecycle.run_run_setup_hooks()
lifecycle.run_run_setup_hooks()
print("after setup:", seen, lifecycle.phase())
lifecycle.run_shutdown_hooks()
print("after shutdown:", seen, lifecycle.phase())
lifecycle.set_host_key("hk1_x")
print("host key:", lifecycle.host_key())
lifecycle.reset()
print("reset:", lifecycle.phase(), lifecycle.host_key())
