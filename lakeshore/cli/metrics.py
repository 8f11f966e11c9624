"""``lakeshore metrics``: the census behind ``lakeshore status`` as Prometheus text.

Printed, written atomically to a file for node_exporter's textfile collector, or served on
127.0.0.1 for a scraper, where one census answers every scrape of ``--interval`` seconds:
however often it is scraped, the store sees at most one census per interval
(docs/metrics.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from lakeshore.cli.common import add_common, finite, note_if_unknown, plane
from lakeshore.dispatch import Dispatch
from lakeshore.errors import InvalidArgument, LakeshoreError, StoreError
from lakeshore.model.metrics import Family, exposition
from lakeshore.model.record import STATES
from lakeshore.protocol.census import queue_status, workers_seen
from lakeshore.running.metrics import check_textfile, write_textfile
from lakeshore.running.metrics_server import DEFAULT_PORT, MetricsServer
from lakeshore.text import inert

__all__ = ["census_families", "register"]


def census_families(q: Dispatch, queues: list[str] | None, recent: int = 100) -> list[Family]:
    """One census of ``q``'s namespace as metric families: ``queues``, or (None) the
    queues live workers serve and ``default``, as ``lakeshore status`` picks them.

    Raises:
        LakeshoreError: the store failed, or a queue name is bad.
    """
    t0 = time.monotonic()
    now = q.store.now()
    workers = workers_seen(q.store, q.ns, now)
    names = queues or sorted({"default", *(n for w in workers for n in w.get("queues", []))})
    stats = [queue_status(q.plane.ops(n), now, recent=recent) for n in names]
    ns = q.ns
    queued = Family("lakeshore_queue_queued", "Invocations waiting to be claimed.")
    running = Family("lakeshore_queue_running", "Invocations running now.")
    estimated = Family(
        "lakeshore_queue_counts_estimated",
        "1 when queued and running were split from the workers' signs of life (more than "
        "256 live invocations; their sum is exact), else 0.",
    )
    oldest = Family(
        "lakeshore_queue_oldest_queued_seconds",
        "How long the oldest queued invocation has waited (0: none is queued).",
    )
    window = Family(
        "lakeshore_queue_recent_invocations",
        "How many of the newest invocations submitted the recent counts cover.",
    )
    by_state = Family(
        "lakeshore_queue_recent",
        "Of the newest invocations submitted (lakeshore_queue_recent_invocations), how many "
        "are in each state.",
    )
    serving = Family(
        "lakeshore_queue_workers", "Workers alive (seen in the last 5 minutes) serving the queue."
    )
    alive = [w for w in workers if w.get("status") != "stopped"]
    for s in stats:
        at = {"namespace": ns, "queue": s.queue}
        queued.add(s.queued, **at)
        running.add(s.running, **at)
        estimated.add(int(s.estimated), **at)
        oldest.add(s.oldest_queued_s or 0.0, **at)
        window.add(s.recent_n, **at)
        for state in STATES:
            by_state.add(s.recent.get(state, 0), **at, state=state)
        serving.add(sum(1 for w in alive if s.queue in w.get("queues", [])), **at)
    seen = Family(
        "lakeshore_workers_alive",
        "Workers whose sign of life was written in the last 5 minutes and that have not stopped.",
    )
    seen.add(len(alive), namespace=ns)
    w_running = Family(
        "lakeshore_seen_worker_running", "Attempts a worker runs, as its last sign of life says."
    )
    w_done = Family(
        "lakeshore_seen_worker_attempts_total",
        "Attempts a worker process has ended since it started, as its last sign of life says.",
        "counter",
    )
    w_failed = Family(
        "lakeshore_seen_worker_failed_total",
        "Attempts of those that raised or timed out (retried ones included), as its last sign "
        "of life says: a worker whose failures equal its attempts fails everything.",
        "counter",
    )
    for w in workers:  # newest first: of two signs that claim one name, the newest is kept
        name = w.get("worker")
        if name is None:
            continue
        w_running.add(w.get("running", 0), namespace=ns, worker=name)
        w_done.add(w.get("done", 0), namespace=ns, worker=name)
        w_failed.add(w.get("failed", 0), namespace=ns, worker=name)
    stamp = Family(
        "lakeshore_census_timestamp_seconds", "The store's time of this census (epoch seconds)."
    )
    stamp.add(now, namespace=ns)
    took = Family("lakeshore_census_duration_seconds", "How long this census took.")
    took.add(round(time.monotonic() - t0, 6), namespace=ns)
    return [
        *(queued, running, estimated, oldest, window, by_state, serving),
        *(seen, w_running, w_done, w_failed, stamp, took),
    ]


def _cmd_metrics(args: argparse.Namespace) -> int:
    if args.recent < 0:
        raise InvalidArgument("metrics", "--recent must be >= 0", "e.g. --recent 100")
    if args.serve and args.textfile:
        raise InvalidArgument("metrics", "--serve and --textfile go apart", "pick one")
    if args.interval is not None and not args.interval > 0:
        raise InvalidArgument("metrics", "--interval must be > 0", "e.g. --interval 15")
    # printed once, they would do nothing: whoever gave them expects a loop or a port
    if args.interval is not None and not (args.serve or args.textfile):
        raise InvalidArgument(
            "metrics", "--interval goes with --textfile or --serve", "add one, or drop it"
        )
    if args.port is not None and not args.serve:
        raise InvalidArgument("metrics", "--port goes with --serve", "add --serve, or drop it")
    if args.textfile:  # a typo in the folder is said now, not when the store first answers
        check_textfile(args.textfile, "metrics")
    q = plane(args)
    # a loop outlives a store that is down, even at its start (a service started at boot):
    # the census says so each round, and the note on a mistyped name is then left out
    looping = args.serve or (args.textfile and args.interval is not None)
    try:
        for name in args.queues:
            try:
                note_if_unknown(q, name)
            except StoreError:
                if not looping:
                    raise
        queues = list(args.queues) or None

        def collect() -> str:
            return exposition(census_families(q, queues, args.recent))

        if args.serve:
            return _serve(collect, args)
        if args.textfile:
            return _textfile(collect, args.textfile, args.interval)
        sys.stdout.write(collect())
        return 0
    finally:
        q.store.close()


def _serve(collect: Callable[[], str], args: argparse.Namespace) -> int:
    port = DEFAULT_PORT if args.port is None else args.port
    server = MetricsServer(collect, port=port, interval_s=args.interval or 10.0)
    print(f"lakeshore metrics: {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("lakeshore metrics: stopped", file=sys.stderr)
    finally:
        server.close()
    return 0


def _textfile(collect: Callable[[], str], path: str, interval: float | None) -> int:
    """Write the file once, or (``interval``) every ``interval`` seconds until Ctrl-C. In
    the loop, a round that fails (the store down, even at the first round: a service
    started at boot must not give up; a full disk) leaves the last file in place and is
    said on stderr. The caller checked the folder before the first round.

    Raises:
        InvalidArgument: the file cannot be written (without ``interval``).
        LakeshoreError: the census failed (without ``interval``).
    """
    try:
        while True:
            try:
                write_textfile(path, collect())
            except (LakeshoreError, OSError) as e:
                if interval is not None:
                    print(f"lakeshore metrics: {inert(str(e))}", file=sys.stderr, flush=True)
                elif isinstance(e, OSError):
                    raise InvalidArgument(
                        "metrics", f"cannot write {path}: {e}", "check the path"
                    ) from e
                else:
                    raise
            if interval is None:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "metrics",
        help="the counts of `status` as Prometheus text: printed, in a file, or served",
        description="One census of the queues (what `lakeshore status` reads: queued, "
        "running, oldest queued age, recent outcomes per state, workers alive) as Prometheus "
        "text. Without QUEUE: the queues live workers serve, and default. --textfile writes "
        "the file atomically for node_exporter's textfile collector (once, or every "
        "--interval seconds); --serve answers /metrics on 127.0.0.1, with one census per "
        "--interval seconds (default 10) however often it is scraped.",
    )
    p.add_argument("queues", nargs="*", metavar="QUEUE")
    p.add_argument("--recent", type=int, default=100, help="newest invocations to count")
    p.add_argument("--textfile", metavar="PATH", help="write the text to this file atomically")
    p.add_argument("--serve", action="store_true", help="serve /metrics on 127.0.0.1")
    p.add_argument("--port", type=int, help=f"--serve's port (default {DEFAULT_PORT})")
    p.add_argument(
        "--interval",
        type=finite,
        help="--textfile: rewrite the file every this many seconds; --serve: the least "
        "time between two censuses (default 10)",
    )
    add_common(p, json_output=False)
    p.set_defaults(func=_cmd_metrics)
