"""``lakeshore status`` and ``lakeshore ls``: what a queue holds, at a flat cost."""

from __future__ import annotations

import argparse
from typing import Any

from lakeshore.cli.common import (
    add_common,
    ago,
    default_url,
    note_if_unknown,
    plane,
    print_json,
    public_url,
    table,
    waits,
)
from lakeshore.dispatch import Dispatch
from lakeshore.errors import InvalidArgument, LakeshoreError
from lakeshore.keys import check_id
from lakeshore.model.provider import ProviderConfig
from lakeshore.model.record import STATES
from lakeshore.protocol.census import list_invocations, queue_status, summary, workers_seen
from lakeshore.text import inert

__all__ = ["register"]


def _cmd_status(args: argparse.Namespace) -> int:
    q = plane(args)
    now = q.store.now()
    workers = workers_seen(q.store, q.ns, now)
    if args.queues:
        for name in args.queues:
            note_if_unknown(q, name)
        names = list(args.queues)
    else:  # the queues live workers serve, and the default one
        names = sorted({"default", *(n for w in workers for n in w.get("queues", []))})
    stats = [queue_status(q.plane.ops(n), now, recent=args.recent) for n in names]
    providers = {n: _provider(q, n) for n in names}
    if args.json:
        queues = [{**s.as_dict(), "provider": _public(providers[s.queue])} for s in stats]
        print_json({"queues": queues, "workers": workers})
        return 0
    rows = [
        [
            s.queue,
            f"~{s.queued}" if s.estimated else str(s.queued),
            f"~{s.running}" if s.estimated else str(s.running),
            ago(s.oldest_queued_s),
            ", ".join(f"{n} {k}" for k, n in sorted(s.recent.items())) or "-",
        ]
        for s in stats
    ]
    # the URL as given (its endpoint_url says which server), not the store's bucket alone
    print(f"{inert(public_url(args.url or default_url()))}  namespace {inert(q.ns)}\n")
    header = ["QUEUE", "QUEUED", "RUNNING", "OLDEST QUEUED", f"LAST {args.recent} SUBMITTED"]
    print(table(rows, header))
    if any(s.estimated for s in stats):
        print("\n~ split from the workers' signs of life (the total is exact)")
    attached = {n: p for n, p in providers.items() if p is not None}
    if attached:
        print("\nproviders (`lakeshore scale` supplies their workers):")
        for name, block in attached.items():
            print(f"  {inert(name)}: {inert(block.describe())}")
    print(f"\nworkers seen in the last 5 minutes: {len(workers)}")
    for w in workers:
        print(  # a sign of life is anyone's write: its text is shown inert
            f"  {inert(w.get('worker'))}  {inert(w.get('status'))}  running {w.get('running')}  "
            f"done {w.get('done')}{_failing(w)}  queues {inert(','.join(w.get('queues', [])))}  "
            f"seen {ago(w.get('seen_at'), now)} ago"
        )
    return 0


def _failing(w: dict[str, Any]) -> str:
    """How many of a worker's attempts failed; said loudly when all did (a body it cannot
    import, a missing --import: a worker that fails everything drains the queue into
    failures)."""
    done, failed = w.get("done", 0), w.get("failed", 0)
    if not failed:
        return ""
    if failed >= done:
        return f" (ALL FAILED: {failed} of {done}; check its --import and its log)"
    return f" ({failed} failed)"


def _provider(q: Dispatch, queue: str) -> ProviderConfig | None:
    """The queue's provider block (None: none, or a record that cannot be read — status
    still shows the counts)."""
    try:
        return q.queue_config(queue).provider
    except LakeshoreError:
        return None


def _public(block: ProviderConfig | None) -> dict[str, Any] | None:
    return block.public() if block else None


def _cmd_ls(args: argparse.Namespace) -> int:
    q = plane(args)
    note_if_unknown(q, args.queue)
    if args.state and args.state not in STATES:
        raise InvalidArgument("ls", f"unknown state {args.state!r}", f"use one of {STATES}")
    if args.limit < 1:
        raise InvalidArgument("ls", "--limit must be >= 1", "e.g. --limit 20")
    before = check_id(args.before) if args.before else None
    now = q.store.now()
    page = list_invocations(
        q.plane.ops(args.queue), now, state=args.state, fn=args.fn, before=before, limit=args.limit
    )
    found, more = page.records, page.next_before
    if args.json:
        print_json({"invocations": [summary(r) for r in found], "next_before": more})
        return 0
    rows = [[r.id, r.state, str(r.attempt), ago(r.submitted_at, now), r.fn] for r in found]
    head = ["ID", "STATE", "ATTEMPT", "SUBMITTED", "FUNCTION"]
    if any(waits(r, now) for r in found):  # delayed or backing off: when each comes due
        head.insert(4, "SCHEDULED")
        for row, r in zip(rows, found, strict=True):
            row.insert(4, f"in {ago(r.not_before - now)}" if waits(r, now) else "-")
    print(table(rows, head))
    if more:
        print(f"\nmore: lakeshore ls {args.queue} --before {more}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="per queue: queued, running, recent outcomes, oldest queued age, workers",
        description="Counts per queue without reading finished history: queued and running "
        "come from the tickets of live invocations, recent outcomes from the newest --recent "
        "invocations, "
        "workers from their signs of life. Without QUEUE: the queues live workers serve, "
        "and default.",
    )
    p.add_argument("queues", nargs="*", metavar="QUEUE")
    p.add_argument("--recent", type=int, default=100, help="newest invocations to count")
    add_common(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser(
        "ls",
        help="list invocations of a queue, newest first",
        description="List invocations newest first, --limit per page; the last line gives "
        "the --before cursor of the next page. --state queued|running reads only the "
        "tickets of live invocations. A page reads at most 1000 records: when a filter "
        "matches few, it comes back short, with a cursor to go on from.",
    )
    p.add_argument("queue", nargs="?", default="default", help="queue (default: default)")
    p.add_argument("--state", help=f"only this state ({', '.join(STATES)})")
    p.add_argument("--fn", help="only invocations of this function (module:qualname)")
    p.add_argument("--limit", type=int, default=20, help="rows per page (default 20)")
    p.add_argument("--before", metavar="ID", help="page cursor: only ids older than this")
    add_common(p)
    p.set_defaults(func=_cmd_ls)
