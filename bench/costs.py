"""Bounded costs (issue 22, item 8): what one operation costs against what it must not grow with.

    bash scripts/bench costs         # or: .venv/bin/python -m bench.costs [--quick]

Counted in requests, keys listed and bytes fetched (not only time), on the memory store, with
the baseline of each line measured in the same run:

* **topic post through a fresh handle** vs topic length: keys listed and requests of
  ``Topic(...).post`` (what a new process pays; ``q.topic(name)`` reuses one handle per plane),
  against one full listing of the topic (what the first post cost before);
* **stream resume** vs journal length: bytes and segments fetched by ``q.stream(inv,
  since=last)``, against the bytes of the whole journal (what the resume fetched before);
* **heartbeat bytes** vs ``_key`` size: the bytes one heartbeat writes with no key and with a
  key at its cap, and what happens to the issue's 20 MB key (refused at submit).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench.counting import Counting
from lakeshore import codec, keys
from lakeshore.model import lifecycle
from lakeshore.model.record import LIMITS, Blob, Record
from lakeshore.store import MemoryStore
from lakeshore.streams.journal import END, VALUE, encode_segment
from lakeshore.streams.topic import Topic


def topic_post(posts: int) -> dict[str, Any]:
    store = Counting(MemoryStore())
    for seq in range(posts):  # what many producers left behind
        body = codec.encode({"post": f"{seq:016x}", "payload": codec.encode(seq)})
        store.inner.put(keys.topic_seq_key("b", "t", seq), encode_segment(0, seq, [(VALUE, body)]))
    store.reset()
    sum(1 for _ in store.list(keys.topic_prefix("b", "t")))  # baseline: the old first post
    base = store.reset()
    t0 = time.perf_counter()
    seq = Topic(store, "b", "t").post("new")
    took = time.perf_counter() - t0
    got = store.reset()
    assert seq == posts
    return {
        "line": "topic post, fresh handle",
        "grows_with": f"{posts} posts",
        "lists": got["LIST"],
        "keys_listed": got["keys"],
        "gets": got["GET"],
        "ms": took * 1000,
        "baseline_keys": base["keys"],
        "ratio": got["keys"] / base["keys"],
    }


def stream_resume(frames: int, per_segment: int = 1024) -> dict[str, Any]:
    store = Counting(MemoryStore())
    ops = dls.Dispatch(":memory:", store=store).plane.ops("default")
    inv = keys.new_id()
    payload = codec.encode("x" * 200)  # about the 210 bytes a frame of the issue took
    total = 0
    for first in range(0, frames, per_segment):
        batch = [(VALUE, payload)] * min(per_segment, frames - first)
        if first + per_segment >= frames:
            batch.append((END, b"\xc0"))
        data = encode_segment(1, first, batch)
        total += len(data)
        store.inner.put(ops.keys.journal(inv, 1, first), data)
    rec = Record(id=inv, ns="default", queue="default", fn="m:f", args=Blob(inline=b""))
    rec = lifecycle.claim(rec, "w", "t", 1.0)
    rec = lifecycle.succeed(
        rec, "t", None, 2.0, journal={"attempt": 1, "frames": frames + 1, "ended": True}
    )
    store.inner.put(ops.keys.record(inv), rec.to_bytes())
    q = dls.Dispatch(":memory:", store=store)
    store.reset()
    t0 = time.perf_counter()
    seen = [f.seq for f in q.stream(inv, since=frames - 1)]
    took = time.perf_counter() - t0
    got = store.reset()
    assert seen == [frames - 1]
    journal_gets = got["GET"] - 3  # the record is read three times on the way
    return {
        "line": "stream resume at the last frame",
        "grows_with": f"{frames} frames, {-(-frames // per_segment)} segments",
        "segments_fetched": journal_gets,
        "bytes_fetched": got["bytes"],
        "lists": got["LIST"],
        "ms": took * 1000,
        "baseline_bytes": total,
        "ratio": got["bytes"] / total,
    }


def heartbeat_bytes(key: str | None) -> dict[str, Any]:
    store = Counting(MemoryStore())
    q = dls.Dispatch(":memory:", store=store)
    f = q.udf(dls_noop)
    try:
        inv = f.submit(_key=key)
    except dls.InvalidArgument as e:
        return {
            "line": "heartbeat bytes",
            "grows_with": f"_key of {len(key or '')} bytes",
            "heartbeat_bytes": None,
            "refused": str(e).split(" — ")[0],
        }
    rec, _ = q.plane.ops("default").read(inv)
    running = lifecycle.claim(rec, "w", "t", store.now())
    beat = lifecycle.heartbeat(running, "t", store.now())
    return {
        "line": "heartbeat bytes",
        "grows_with": f"_key of {len(key or '')} bytes",
        "heartbeat_bytes": len(beat.to_bytes()),
        "refused": "",
    }


def dls_noop() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller topics and journals")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    topics = [topic_post(n) for n in sizes]
    streams = [stream_resume(n) for n in sizes]
    beats = [heartbeat_bytes(k) for k in (None, "k" * LIMITS["key"], "k" * (20 << 20))]
    print(f"{'topic post, fresh handle':<28} {'LISTs':>6} {'keys':>6} {'GETs':>5} {'ratio':>8}")
    for r in topics:
        print(
            f"{r['grows_with']:<28} {r['lists']:>6} {r['keys_listed']:>6} {r['gets']:>5} "
            f"{r['ratio']:>8.4f}"
        )
    print("(ratio = keys listed ÷ keys of one full listing of the topic, same run)")
    print(f"{'stream resume at the end':<28} {'segs':>6} {'bytes':>9} {'LISTs':>5} {'ratio':>8}")
    for r in streams:
        print(
            f"{r['grows_with']:<28} {r['segments_fetched']:>6} {r['bytes_fetched']:>9} "
            f"{r['lists']:>5} {r['ratio']:>8.4f}"
        )
    print("(ratio = bytes fetched ÷ bytes of the whole journal, same run)")
    print(f"{'heartbeat':<28} {'bytes per heartbeat write'}")
    for r in beats:
        shown = r["heartbeat_bytes"] if r["heartbeat_bytes"] is not None else r["refused"]
        print(f"{r['grows_with']:<28} {shown}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "costs.json").write_text(json.dumps(topics + streams + beats, indent=2))


if __name__ == "__main__":
    main()
