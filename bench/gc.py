"""What gc lists to find a namespace's queues: keys listed, against a topic's length.

    bash scripts/bench gc            # or: .venv/bin/python -m bench.gc [--posts N]

One queue with one finished invocation beside a topic of 0, N/10 and N posts, on a memory
store. For each, the keys that every LIST of ``lakeshore gc``'s queue discovery returned
(counted by a wrapper around the store), and the same for the old way (one listing of the
whole namespace), measured in the same run. The new figure must not grow with the topic.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from lakeshore.gc import queue_names
from lakeshore.keys import QueueKeys, namespace_prefix, topic_seq_key
from lakeshore.queueconf import QueueConfig
from lakeshore.store import MemoryStore, ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE

_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


class _Keys(Store):
    """Counts the keys listings return."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.url, self.listed = inner, inner.url, 0

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self.inner.get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return self.inner.put(key, data, mode)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self.inner.delete(key, if_match)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        for info in self.inner.list(prefix, start_after):
            self.listed += 1
            yield info

    def now(self) -> float:
        return self.inner.now()


def measure(posts: int) -> dict[str, Any]:
    store = MemoryStore()
    keys = QueueKeys("default", "jobs")
    store.put(keys.queue_record, QueueConfig().to_bytes())
    store.put(keys.record(_ID), b"record")
    for seq in range(posts):
        store.put(topic_seq_key("default", "news", seq), b"post")
    counting = _Keys(store)
    names = sorted(queue_names(counting, "default"))
    new = counting.listed
    counting.listed = 0
    sum(1 for _ in counting.list(namespace_prefix("default")))  # the old way: everything
    return {"posts": posts, "queues": names, "listed": new, "listed_before": counting.listed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--posts", type=int, default=20_000)
    args = parser.parse_args()
    print("keys listed by gc to find the queues (one queue beside a topic; memory store):")
    for posts in (0, args.posts // 10, args.posts):
        r = measure(posts)
        print(
            f"  topic of {r['posts']:>6} posts: {r['listed']} keys listed "
            f"(whole-namespace listing: {r['listed_before']}); queues {r['queues']}"
        )


if __name__ == "__main__":
    main()
