"""What gc lists to find a namespace's queues: keys listed, against a topic's length.

    bash scripts/bench gc            # or: .venv/bin/python -m bench.gc [--posts N]

One queue with one finished invocation beside a topic of 0, N/10 and N posts, on a memory
store. For each, the keys that every LIST of ``lakeshore gc``'s queue discovery returned
(counted by a wrapper around the store), and the same for the old way (one listing of the
whole namespace), measured in the same run. The new figure must not grow with the topic.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.counting import Counting
from lakeshore.keys import QueueKeys, namespace_prefix, topic_seq_key
from lakeshore.model.queue_config import QueueConfig
from lakeshore.protocol.gc import queue_names
from lakeshore.store import MemoryStore

_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def measure(posts: int) -> dict[str, Any]:
    store = MemoryStore()
    keys = QueueKeys("default", "jobs")
    store.put(keys.queue_record, QueueConfig().to_bytes())
    store.put(keys.record(_ID), b"record")
    for seq in range(posts):
        store.put(topic_seq_key("default", "news", seq), b"post")
    counting = Counting(store)
    names = sorted(queue_names(counting, "default"))
    new = counting.reset()["keys"]
    sum(1 for _ in counting.list(namespace_prefix("default")))  # the old way: everything
    before = counting.reset()["keys"]
    return {"posts": posts, "queues": names, "listed": new, "listed_before": before}


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
