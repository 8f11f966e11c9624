"""``lakeshore doctor``, ``demo`` and ``queue``: the store and the queues' settings."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lakeshore.cli.common import (
    add_common,
    default_url,
    dumps,
    note_if_unknown,
    plane,
    require_queue,
    store_url,
)
from lakeshore.dispatch import DEFAULT_URL
from lakeshore.doctor import Check
from lakeshore.errors import InvalidArgument
from lakeshore.model.provider import SLURM_FIELDS
from lakeshore.text import inert

__all__ = ["register"]


def _cmd_doctor(args: argparse.Namespace) -> int:
    from lakeshore.doctor import diagnose
    from lakeshore.store import open_store

    if args.threads < 2 or args.rounds < 1:
        print("lakeshore: doctor: --threads must be >= 2 and --rounds >= 1", file=sys.stderr)
        return 2
    url = args.url or default_url()
    progress = None if args.json else _progress
    if progress:
        print(f"lakeshore doctor: {url}\n", flush=True)
    with open_store(url) as store:
        report = diagnose(
            store,
            threads=args.threads,
            rounds=args.rounds,
            on_check=progress,
            ns=args.ns,
            quick=args.quick,
        )
    if args.json:
        print(
            dumps(
                {
                    "url": report.url,
                    "safe": report.safe,
                    "skipped": report.skipped,
                    "checks": [vars(c) for c in report.checks],
                }
            )
        )
    else:
        print("\n" + inert(report.render().splitlines()[-1]))
    return 0 if report.safe else 1


def _progress(check: Check) -> None:
    print(inert(check.line()), flush=True)  # a check may quote what the server answered


def _parse_setting(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise InvalidArgument("queue set", f"{text!r} is not NAME=VALUE", "e.g. max_depth=100")
    value: Any = raw
    if raw.lower() in ("none", "null", ""):
        value = None
    elif name not in _WORDS:  # a SLURM account "0123" or partition "1e3" stays a word
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
    return name, value


_WORDS = {"provider", *(f"provider.{name}" for name in (*SLURM_FIELDS, "kind"))}


def _cmd_queue(args: argparse.Namespace) -> int:
    creating = args.action == "set" and args.create
    if args.action == "set" and not args.settings:
        raise InvalidArgument("queue set", "no settings given", "pass NAME=VALUE pairs")
    changes = dict(map(_parse_setting, args.settings)) if args.action == "set" else {}
    q = plane(args, create=creating)
    if args.action == "show":
        note_if_unknown(q, args.queue)
    elif not creating:  # a typo in the name must not quietly make a second queue
        require_queue(
            q,
            args.queue,
            "check the name and --ns, or pass --create to make a new queue with these settings",
        )
    if args.action == "set":
        conf = q.configure(args.queue, **changes)
    else:
        conf = q.queue_config(args.queue)
    data = conf.public()
    if args.json:
        print(dumps({"queue": args.queue, "ns": args.ns, "rev": conf.rev, **data}))
    else:
        print(f"queue {args.ns}/{args.queue} on {q.store.url} (rev {conf.rev})")
        for k, v in data.items():
            if k == "provider" and conf.provider is not None:
                v = conf.provider.describe()
            print(f"  {k:<20} {'-' if v is None else inert(v)}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lakeshore.demo import main as demo

    return demo(args.url)


def register(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="probe a store and say whether lakeshore is safe on it",
        description=(
            "Probe a store the way lakeshore uses it (create-only and If-Match writes, "
            "conditional deletes, multi-thread races, list-after-write, the store clock) "
            "and print a verdict. Exits 1 when lakeshore would be unsafe on it."
        ),
    )
    doctor.add_argument(
        "url",
        nargs="?",
        type=store_url,
        help=f"store URL (':memory:', 'file:///dir', 's3://bucket/prefix'); "
        f"default: $LAKESHORE_URL, else {DEFAULT_URL}",
    )
    doctor.add_argument("--threads", type=int, default=8, help="threads per race round (default 8)")
    doctor.add_argument("--rounds", type=int, default=20, help="race rounds (default 20)")
    doctor.add_argument(
        "--quick",
        action="store_true",
        help="skip the two races (create race, if-match race): a few dozen requests, seconds "
        "instead of a minute on some servers; the verdict then covers one writer at a time",
    )
    doctor.add_argument(
        "--ns",
        help="probe inside this namespace (lakeshore/NS/_doctor/), so that a worker's "
        "credentials suffice; default: a folder lakeshore-doctor/ beside the namespaces",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_cmd_doctor)
    demo = sub.add_parser(
        "demo",
        help="run a batch through producer, worker and reader processes on one store",
        description=(
            "A producer process submits a batch, two worker processes drain it, and a reader "
            "process reads every result by id. Uses the namespace 'demo' of the store."
        ),
    )
    demo.add_argument(
        "url",
        nargs="?",
        type=store_url,
        help=f"store URL; default: $LAKESHORE_URL, else {DEFAULT_URL}",
    )
    demo.set_defaults(func=_cmd_demo)
    queue = sub.add_parser(
        "queue",
        help="show or change a queue's settings (admission, defaults)",
        description=(
            "Show a queue's record, or change fields of it by compare-and-swap: "
            "lakeshore queue set thumbnails max_depth=100 on_full=block rate_limit=20/s. "
            "VALUE 'none' clears a limit. Numbers must be finite. A provider is attached with "
            "provider=local|slurm|command and its fields with provider.NAME=VALUE "
            "(provider.max_workers=4 provider.partition=debug); provider=none detaches it. "
            "set refuses a queue that does not exist yet unless --create is given."
        ),
    )
    queue.add_argument("action", choices=["show", "set"])
    queue.add_argument("queue", help="queue name")
    queue.add_argument("settings", nargs="*", metavar="NAME=VALUE")
    queue.add_argument(
        "--create",
        action="store_true",
        help="with set: create the queue (and the store) if it does not exist yet",
    )
    add_common(queue)
    queue.set_defaults(func=_cmd_queue)
