"""``lakeshore retry --queue Q``: run again every finished invocation a filter selects.

The filter and its guarantees are :mod:`lakeshore.protocol.bulk_retry`'s. The command prints
the ``--until`` it used, so that running it again with that ``--until`` does nothing.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from lakeshore.cli.common import err, note_if_unknown, plane, print_json
from lakeshore.errors import InvalidArgument
from lakeshore.keys import check_name
from lakeshore.model.record import TERMINAL
from lakeshore.protocol.bulk_retry import Selection, parse_when, retry_selected
from lakeshore.text import inert

__all__ = ["add_arguments", "refuse_mixed", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the bulk form (``lakeshore retry`` without an id)."""
    p.add_argument("--queue", help="retry every invocation of this queue the filter selects")
    p.add_argument(
        "--state",
        default=None,
        help=f"with --queue: the finished state to select ({', '.join(TERMINAL)}; default failed)",
    )
    p.add_argument("--fn", help="with --queue: only invocations of this module:qualname")
    p.add_argument(
        "--since",
        help="with --queue: only invocations submitted at or after this (an age such as 2h, "
        "or an ISO time with its offset); only that part of the queue is listed",
    )
    p.add_argument(
        "--until",
        help="with --queue: only invocations that finished at or before this (default: "
        "now); repeat a run with the --until it printed and it does nothing",
    )
    p.add_argument("--dry-run", action="store_true", help="with --queue: list what would run again")


def run(args: argparse.Namespace) -> int:
    """The bulk form: 0 when every selected invocation was queued again or moved by someone
    else first, 2 when some could not be.

    Raises:
        InvalidArgument: a bad queue, state or time.
    """
    queue = check_name(args.queue, "queue")
    q = plane(args)
    note_if_unknown(q, queue)
    now = q.store.now()
    since = parse_when(args.since, now, "since") if args.since else None
    until = parse_when(args.until, now, "until") if args.until else now
    sel = Selection(args.state or "failed", args.fn, since, until)
    tally = retry_selected(q.plane.ops(queue), sel, args.dry_run)
    until_text = datetime.fromtimestamp(until, UTC).isoformat(timespec="microseconds")
    if args.json:
        print_json(
            {
                "until": until_text,
                "dry_run": bool(args.dry_run),
                "retried": tally.retried,
                "skipped": tally.skipped,
                "errors": tally.errors,
            }
        )
    else:
        verb = "would run again" if args.dry_run else "queued again"
        for inv in tally.retried:
            print(f"{inv}  {verb}")
        for inv in tally.skipped:
            print(f"{inv}  skipped (moved by another process first)")
        for inv, why in tally.errors.items():
            err(f"{inv}: {inert(why)}")
        print(
            f"{len(tally.retried)} {verb}, {len(tally.skipped)} skipped, "
            f"{len(tally.errors)} errors; selected: {sel.state}, finished at or before "
            f"{until_text} (run again with --until {until_text} to select the same)"
        )
    return 2 if tally.errors else 0


def refuse_mixed(args: argparse.Namespace) -> None:
    """An id and ``--queue`` together, or neither, or filters without ``--queue``.

    Raises:
        InvalidArgument: the arguments do not make one of the two forms.
    """
    names = ("state", "fn", "since", "until", "dry_run")
    filters = [f"--{n.replace('_', '-')}" for n in names]
    given = any(getattr(args, n) for n in names)
    if (args.id is None) == (args.queue is None) or (args.id is not None and given):
        raise InvalidArgument(
            "retry",
            f"give either an invocation id, or --queue with the filters ({', '.join(filters)})",
            "lakeshore retry ID, or lakeshore retry --queue Q --state failed --since 2h",
        )
