"""A child process that feeds hostile bytes to the decoders workers and readers use.

Run as ``python -m tests.hostile_harness``. Reads one JSON request per line on stdin,
``{"decoder": <name>, "data": <base64>}``, runs that decoder on the bytes in a thread with a
small stack (a worker's slots are threads, and stack overflows are what kill processes), and
writes one JSON line back: ``{"outcome": "value" | "lakeshore" | "other", "type": <exception
class>, "message": <text>, "s": <seconds>}``. A decoder that crashes the process (a segfault)
shows up in the parent as the process exiting on a signal; one that hangs, as no answer.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from lakeshore import codec
from lakeshore.errors import LakeshoreError
from lakeshore.keys import topic_seq_key, worker_key
from lakeshore.model.queue_config import QueueConfig
from lakeshore.model.record import Record
from lakeshore.protocol import census
from lakeshore.store.memory import MemoryStore
from lakeshore.streams.journal import decode_segment, to_frame
from lakeshore.streams.topic import Topic

STACK_BYTES = 1 << 20  # smaller than any platform's default thread stack


def _segment(data: bytes) -> Any:
    attempt, first, frames = decode_segment(data, "segment")
    return [to_frame(attempt, first + i, payload) for i, (_, payload) in enumerate(frames)]


def _topic(data: bytes) -> Any:
    store = MemoryStore()
    store.put(topic_seq_key("ns", "t", 0), data)
    return list(Topic(store, "ns", "t").stream())


def _sign_of_life(data: bytes) -> Any:
    # what `lakeshore status` does with the signs of life it reads
    store = MemoryStore()
    store.put(worker_key("ns", "w"), data)
    seen = census.workers_seen(store, "ns", store.now())
    for w in seen:
        f"{w.get('worker')} {w.get('status')} {w.get('running')} {w.get('done')}"
        ",".join(w.get("queues", []))
        sum(int(w.get("running_by_queue", {}).get(q, 0)) for q in ("default",))
        store.now() - w.get("seen_at")
    return seen


DECODERS: dict[str, Callable[[bytes], Any]] = {
    "codec": lambda data: codec.decode(data),
    "record": lambda data: Record.from_bytes(data),
    "queue": lambda data: QueueConfig.from_bytes(data),
    "segment": _segment,
    "topic": _topic,
    "sign_of_life": _sign_of_life,
}


def run_one(name: str, data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            DECODERS[name](data)
            out["outcome"] = "value"
        except LakeshoreError as e:
            out.update(outcome="lakeshore", type=type(e).__name__, message=str(e)[:300])
        except BaseException as e:  # reported: the parent decides
            out.update(outcome="other", type=type(e).__name__, message=str(e)[:300])

    start = time.monotonic()
    t = threading.Thread(target=target)
    t.start()
    t.join()
    out["s"] = time.monotonic() - start
    return out


def main() -> None:
    threading.stack_size(STACK_BYTES)
    for line in sys.stdin:
        req = json.loads(line)
        reply = run_one(req["decoder"], base64.b64decode(req["data"]))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
