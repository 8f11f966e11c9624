"""``lakeshore worker`` and ``lakeshore gc``: serving queues, and cleaning up after them."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

from lakeshore.cli.common import add_common, plane, print_json, require_queue
from lakeshore.dispatch import Dispatch
from lakeshore.errors import InvalidArgument
from lakeshore.gc import collect, parse_age, prune_workers
from lakeshore.keys import ROOT, check_name
from lakeshore.udf import Udf
from lakeshore.worker import run_worker

__all__ = ["register"]


def _imports(modules: list[str]) -> list[str]:
    """Import ``--import`` modules; return the queues of the @udf functions they define."""
    queues = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as e:
            raise InvalidArgument(
                "worker --import",
                f"cannot import {name!r} ({type(e).__name__}: {e})",
                "install the module here or fix PYTHONPATH",
            ) from None
        queues += [v.queue for v in vars(module).values() if isinstance(v, Udf)]
    return queues


def _cmd_worker(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    declared = _imports(args.imports or [])
    q = Dispatch(args.url, ns=args.ns, data=args.data)
    queues = args.queues or sorted(set(declared)) or ["default"]
    for name in queues:
        check_name(name, "queue")
    logging.getLogger("lakeshore.worker").info(
        "worker on %s namespace %s, queues %s, concurrency %d, isolation %s%s",
        q.store.url,
        q.ns,
        ",".join(queues),
        args.concurrency,
        args.isolation,
        f", allow {' '.join(args.allow)}" if args.allow else "",
    )
    done = run_worker(
        q,
        queues=queues,
        concurrency=args.concurrency,
        isolation=args.isolation,
        max_jobs=args.max_jobs,
        idle_exit=args.idle_exit,
        max_poll_s=args.max_poll,
        worker_id=args.worker_id,
        grace_s=args.grace,
        lease_s=args.lease,
        on_start=args.on_start,
        before_job=args.before_job,
        on_stop=args.on_stop,
        handle_signals=True,
        allow=args.allow or [],
    )
    logging.getLogger("lakeshore.worker").info("worker done: %d attempt(s)", done)
    return 0


def _queues_in(q: Dispatch) -> list[str]:
    """Every queue folder of the namespace (a full listing: fine for a janitor, which must
    look at everything anyway)."""
    base = f"{ROOT}/{q.ns}/"
    names = set()
    for info in q.store.list(base):
        head = info.key[len(base) :].split("/", 1)[0]
        if not head.startswith("_"):
            names.add(head)
    return sorted(names)


def _cmd_gc(args: argparse.Namespace) -> int:
    q = plane(args)
    older = parse_age(args.older_than) if args.older_than else None
    if args.queues:
        for name in args.queues:
            require_queue(q, name)
    names = args.queues or _queues_in(q)
    now = q.store.now()
    out = {}
    for name in names:
        rep = collect(q.ops(name), q.settings, older, now, dry_run=args.dry_run)
        out[name] = rep
    workers = prune_workers(q.store, q.ns, older, now, args.dry_run) if older is not None else 0
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "workers": workers,
                "queues": {
                    n: {
                        "expired": r.expired,
                        "orphans": r.orphans,
                        "objects": len(r.objects),
                        "kept_by_retention": r.kept_by_retention,
                    }
                    for n, r in out.items()
                },
            }
        )
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for name, r in out.items():
        print(
            f"{name}: {verb} {len(r.expired)} invocation(s), {len(r.objects)} object(s)"
            + (f"; {len(r.orphans)} orphaned folder(s)" if r.orphans else "")
            + (
                f"; kept {r.kept_by_retention} for the queue's retention"
                if r.kept_by_retention
                else ""
            )
        )
        if args.dry_run:
            for inv in r.expired:
                print(f"  {inv}")
    if workers:
        print(f"{verb} {workers} sign(s) of life of workers not seen since the cutoff")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="serve queues: claim invocations and run them",
        description="Run a worker until stopped (or --max-jobs / --idle-exit). SIGTERM or "
        "SIGINT stops claiming; running jobs get --grace seconds, then are released: queued "
        "again at once, the attempt not counted. A second signal exits at once.",
    )
    p.add_argument(
        "--queue",
        "-q",
        dest="queues",
        action="append",
        metavar="QUEUE",
        help="queue to serve (repeat for several; default: the queues of the "
        "--import modules' @udf functions, else default)",
    )
    p.add_argument(
        "--import",
        "-i",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="module to import first (its functions, its hooks); repeatable",
    )
    p.add_argument(
        "--allow",
        action="append",
        metavar="PATTERN",
        help="also run functions matching this module:qualname pattern (fnmatch, e.g. "
        "'mypkg.jobs:*') although they are not decorated with @udf, importing their module "
        "if need be; repeatable. Without it the worker runs only @udf functions of the "
        "--import modules",
    )
    p.add_argument("--concurrency", "-c", type=int, default=1, help="jobs at once (default 1)")
    p.add_argument(
        "--isolation",
        choices=["process", "thread", "auto"],
        default="process",
        help="process: a child process per slot, bodies can be killed and cannot "
        "crash the worker (default); thread: light jobs",
    )
    p.add_argument("--max-jobs", type=int, help="exit after this many attempts")
    p.add_argument(
        "--idle-exit",
        type=float,
        metavar="SECONDS",
        help="exit (code 0) after this long without work: array jobs that drain",
    )
    p.add_argument(
        "--lease",
        type=float,
        metavar="SECONDS",
        help="lease length for claimed jobs (default: the job's, 30 s); "
        "heartbeats every third of it",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="after SIGTERM, how long running jobs may finish (default 30)",
    )
    p.add_argument(
        "--max-poll",
        type=float,
        default=1.25,
        metavar="SECONDS",
        help="longest pause between polls of an idle queue (default 1.25: under 60 "
        "requests a minute however many slots)",
    )
    p.add_argument(
        "--on-start",
        metavar="MODULE:FUNCTION",
        help="hook run once per process that runs bodies, before its first job",
    )
    p.add_argument(
        "--before-job",
        metavar="MODULE:FUNCTION",
        help="hook run before every job, with the invocation record",
    )
    p.add_argument(
        "--on-stop",
        metavar="MODULE:FUNCTION",
        help="hook run when a body process shuts down in order (best effort)",
    )
    p.add_argument("--worker-id", help="name in leases and logs (default host:pid)")
    p.add_argument("--data", help="data root for dls.run files (default: beside the store)")
    p.add_argument("--log-level", default="info", help="debug, info, warning (default info)")
    add_common(p, json_output=False)
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser(
        "gc",
        help="remove finished invocations older than a retention",
        description="Remove terminal invocations that finished more than --older-than ago "
        "(never sooner than the queue's result_retention_s), with their spilled data, "
        "journals, logs, hints and keys. Lists only ids older than the cutoff.",
    )
    p.add_argument(
        "--older-than",
        metavar="AGE",
        help="e.g. 7d, 12h, 30m (default: the queue's result_retention_s)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    p.add_argument(
        "--queue",
        "-q",
        dest="queues",
        action="append",
        metavar="QUEUE",
        help="only this queue (repeatable; default: every queue of the namespace)",
    )
    add_common(p)
    p.set_defaults(func=_cmd_gc)
