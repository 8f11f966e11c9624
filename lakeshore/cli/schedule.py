"""``lakeshore schedule set|ls|rm|tick``: schedules of a queue (docs/schedules.md)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from lakeshore.cli.common import (
    add_call_options,
    add_common,
    ago,
    call_options,
    err,
    finite,
    json_arg,
    plane,
    print_json,
    table,
)
from lakeshore.cli.jobs import codec_plain
from lakeshore.errors import DecodeError, InvalidArgument
from lakeshore.firing import Fired, read_schedules
from lakeshore.keys import DEFAULT_QUEUE
from lakeshore.model.cron import describe
from lakeshore.model.schedule import OVERLAP, Schedule

__all__ = ["register"]


def _start(text: str | None) -> datetime | float | None:
    """``--start``: an ISO 8601 time with its offset (2026-03-01T00:00:00+01:00, or Z) or an
    epoch second."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidArgument(
            "schedule set --start",
            f"{text!r} is not a time with a zone",
            "give ISO 8601 with an offset (2026-03-01T00:00:00Z) or epoch seconds",
        )
    return when


def _when(s: Schedule) -> str:
    return f"cron {s.cron} {s.tz}" if s.cron is not None else f"every {s.every}s"


def _slot(t: int | None) -> str:
    return "-" if t is None else describe(t)


def schedule_dict(s: Schedule) -> dict[str, Any]:
    """A schedule as JSON (its arguments decoded)."""
    try:
        args: Any = codec_plain(list(s.call()))
    except DecodeError:
        args = None
    return {
        "name": s.name,
        "queue": s.queue,
        "fn": s.fn,
        "args": args,
        "cron": s.cron,
        "every": s.every,
        "tz": s.tz,
        "overlap": s.overlap,
        "start": s.start,
        "options": s.options,
        "next_slot": s.next_due,
        "last_slot": s.last_slot,
        "last_id": s.last_id,
        "fired_at": s.fired_at,
        "fired": s.fired,
        "skipped": s.skipped,
        "missed": s.missed,
    }


def _fired_dict(f: Fired) -> dict[str, Any]:
    return {
        "queue": f.queue,
        "name": f.name,
        "action": f.action,
        "slot": f.slot,
        "id": f.id,
        "missed": f.missed,
        "next_slot": f.next_slot,
        "error": f.error,
    }


def _cmd_set(args: argparse.Namespace) -> int:
    if ":" not in args.fn:
        raise InvalidArgument(
            "schedule set", f"{args.fn!r} is not module:function", "e.g. mypkg.jobs:nightly"
        )
    options = call_options(args)
    if args.priority is not None:
        options["priority"] = args.priority
    q = plane(args, create=True)
    s = q.schedule(
        args.name,
        args.fn,
        cron=args.cron,
        every=args.every,
        tz=args.tz,
        overlap=args.overlap,
        start=_start(args.start),
        args=json_arg(args.args, "schedule set", "--args", list),
        kwargs=json_arg(args.kwargs, "schedule set", "--kwargs", dict),
        queue=args.queue,
        **options,
    )
    if args.json:
        print_json(schedule_dict(s))
    else:
        print(f"schedule {s.name} on {s.queue}: {_when(s)}, next slot {_slot(s.next_due)}")
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    q = plane(args)
    found = read_schedules(q, args.queues)
    if args.json:
        print_json(
            {
                "schedules": [schedule_dict(s) for s in found if isinstance(s, Schedule)],
                "unreadable": [_fired_dict(f) for f in found if isinstance(f, Fired)],
            }
        )
        return 0
    now = q.store.now()
    rows = []
    for s in found:
        if isinstance(s, Fired):
            rows.append([s.queue, s.name, "unreadable", s.error or "", "", "", "", ""])
            continue
        rows.append(
            [
                s.queue,
                s.name,
                _when(s),
                s.fn,
                _slot(s.next_due),
                f"{ago(s.fired_at, now)} ago {s.last_id}" if s.last_id else "-",
                f"{s.fired}/{s.skipped}/{s.missed}",
                s.overlap,
            ]
        )
    header = ["QUEUE", "NAME", "WHEN", "FUNCTION", "NEXT SLOT (UTC)", "LAST FIRED"]
    print(table(rows, [*header, "FIRED/SKIPPED/MISSED", "OVERLAP"]))
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    q = plane(args)
    gone = q.unschedule(args.name, args.queue)
    if args.json:
        print_json({"name": args.name, "queue": args.queue, "removed": gone})
    elif gone:
        print(f"removed schedule {args.name} of {args.queue}")
    else:
        err(f"no schedule {args.name!r} on queue {args.queue!r}")
    return 0 if gone else 1


def _cmd_tick(args: argparse.Namespace) -> int:
    q = plane(args)
    done = q.tick_schedules(args.queues)
    bad = [f for f in done if f.action in ("failed", "unreadable")]
    if args.json:
        print_json({"schedules": [_fired_dict(f) for f in done]})
    else:
        for f in done:
            if f.action == "fired":
                missed = f" ({f.missed} missed before it)" if f.missed else ""
                print(f"fired {f.queue}/{f.name} slot {_slot(f.slot)} -> {f.id}{missed}")
            elif f.action == "skipped":
                print(f"skipped {f.queue}/{f.name} slot {_slot(f.slot)}: the previous is live")
            elif f.action in ("failed", "unreadable"):
                err(f"{f.action} {f.queue}/{f.name}: {f.error}")
    return 1 if bad else 0


def register(sub: Any) -> None:
    top = sub.add_parser(
        "schedule",
        help="periodic invocations: set, ls, rm, tick",
        description="Schedules fire a call at every slot of a cron expression or an interval, "
        "each slot as one keyed submit: workers serving the queue fire them, and so does "
        "'lakeshore schedule tick' (for cron, scrontab or a serverless timer).",
    )
    verbs = top.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser(
        "set",
        help="create a schedule, or replace its definition",
        description="Create a schedule or replace the definition of the one of that name "
        "(its firing state is kept while its slots stay the same).",
    )
    p.add_argument("name", help="schedule name, unique per queue")
    p.add_argument("--fn", required=True, help="module:function the workers declared")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="five-field cron expression, or @hourly, @daily, ...")
    when.add_argument("--every", type=finite, help="interval in whole seconds (>= 10)")
    p.add_argument("--tz", default="UTC", help="zone of the cron expression (default UTC)")
    p.add_argument("--overlap", choices=OVERLAP, default="allow", help="default allow")
    p.add_argument("--start", help="no slot before it; anchors --every (ISO 8601 or epoch)")
    p.add_argument("--args", help="positional arguments as a JSON array")
    p.add_argument("--kwargs", help="keyword arguments as a JSON object")
    p.add_argument("--queue", help=f"queue (default: {DEFAULT_QUEUE})")
    p.add_argument("--priority", type=int, help="0 (lowest) to 9 (highest)")
    add_call_options(p)
    add_common(p)
    p.set_defaults(func=_cmd_set)

    p = verbs.add_parser(
        "ls",
        help="schedules with their next slot and last firing",
        description="List schedules: when they fire, the next slot, the last invocation "
        "fired, and how many slots were fired, skipped (overlap) and missed (catch-up).",
    )
    p.add_argument("--queue", "-q", dest="queues", action="append", metavar="QUEUE")
    add_common(p)
    p.set_defaults(func=_cmd_ls)

    p = verbs.add_parser(
        "rm",
        help="remove a schedule",
        description="Remove a schedule. Invocations it fired stay. Exit 1 if there was none.",
    )
    p.add_argument("name")
    p.add_argument("--queue", default=DEFAULT_QUEUE, help=f"queue (default: {DEFAULT_QUEUE})")
    add_common(p)
    p.set_defaults(func=_cmd_rm)

    p = verbs.add_parser(
        "tick",
        help="fire every due slot once and exit",
        description="Fire the due slot of every schedule once and exit, for cron, scrontab or "
        "a serverless timer. Any number of ticks and workers may fire at once: each slot is "
        "one invocation. Without --queue, every queue of the namespace (this lists it; with "
        "producer credentials, name the queues). Exit 1 if a schedule could not be fired.",
    )
    p.add_argument("--queue", "-q", dest="queues", action="append", metavar="QUEUE")
    add_common(p)
    p.set_defaults(func=_cmd_tick)
