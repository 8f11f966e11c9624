"""``lakeshore worker`` and ``lakeshore gc``: serving queues, and cleaning up after them."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from lakeshore.cli.common import (
    add_common,
    add_imports,
    add_queues,
    err,
    finite,
    note_if_unknown,
    plane,
    print_json,
)
from lakeshore.cli.progress import show_progress, worker_log
from lakeshore.dispatch import Dispatch
from lakeshore.errors import InvalidArgument, LakeshoreError
from lakeshore.keys import check_name
from lakeshore.protocol.gc import (
    GcReport,
    collect,
    parse_age,
    prune_workers,
    queue_names,
    retention_of,
)
from lakeshore.running.bodies import import_failure
from lakeshore.running.zygote import fork_server
from lakeshore.text import inert
from lakeshore.udf import Udf
from lakeshore.worker import run_worker

__all__ = ["register"]


def _imports(modules: list[str]) -> list[str]:
    """Import ``--import`` modules; return the queues of the @udf functions they define."""
    queues = []
    for name in modules:
        if "/" in name or (name.endswith(".py") and os.path.isfile(name)):  # a path, not a name
            module_name = name.removesuffix(".py").replace("/", ".").strip(".")
            raise InvalidArgument(
                "worker --import",
                f"{name!r} is a file path, not a module name",
                f"give the module's name, e.g. --import {inert(module_name)}, with the folder "
                "its name starts from on the import path (PYTHONPATH=. for this folder)",
            )
        try:
            module = importlib.import_module(name)
        except Exception as e:
            # the error line names the exception only; where it came from goes to the log
            logging.getLogger("lakeshore.worker").debug("--import %s failed", name, exc_info=True)
            happened, todo = import_failure(
                name,
                e,
                "install the module here or fix PYTHONPATH",
                "fix the module (or install what it imports); --log-level debug shows the "
                "traceback",
            )
            raise InvalidArgument("worker --import", happened, todo) from None
        queues += [v.queue for v in vars(module).values() if isinstance(v, Udf)]
    return queues


def _warn_undeclared(queues: list[str], declared: list[str], imported: bool, allow: bool) -> None:
    """A queue served with no body declared for it: each of its invocations will fail
    ("not declared"), so say so now, not after the queue drained into failures. With
    ``--allow`` the bodies are the patterns': nothing to tell from here."""
    if allow:
        return
    # a body is declared in any module imported by now (load_body's rule): also in the
    # submodules an --import module imports, which its own names do not show
    declared = [*declared, *_declared_queues()]
    for name in queues:
        if name in declared:
            continue
        where = "the --import modules declare no" if imported else "no --import declares a"
        logging.getLogger("lakeshore.worker").warning(
            "queue %s: %s @udf body for it — its invocations will fail as not declared; "
            "--import the module that defines them (or --allow 'module:*')",
            name,
            where,
        )


def _declared_queues() -> set[str]:
    """The queues of the @udf bodies in every module imported so far. A module that will
    not show its names, and objects that would answer isinstance() by raising (a proxy's
    ``__class__``), are passed over: a warning must not stop a worker's start."""
    found: set[str] = set()
    for module in list(sys.modules.values()):
        try:
            values = list(vars(module).values())
        except Exception:  # no __dict__, or a lazy module that fails to load
            continue
        found.update(v.queue for v in values if issubclass(type(v), Udf))
    return found


class _InertFormatter(logging.Formatter):
    """Log lines quote function names, worker names and bodies' exception text: inert."""

    def format(self, record: logging.LogRecord) -> str:
        return inert(super().format(record), multiline=True)


def _cmd_worker(args: argparse.Namespace) -> int:
    if args.isolation != "thread":
        # now, before the --import modules, the log and the store: body processes get a
        # fork of this process as their fork server, as clean as a new interpreter
        fork_server()
    level = getattr(logging, args.log_level.upper(), logging.INFO)
    formatter = _InertFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    with worker_log(level, formatter, show_progress(args.progress, sys.stderr)):
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    """Import the ``--import`` modules and serve until the worker ends (inside the log)."""
    declared = _imports(args.imports or [])
    q = Dispatch(args.url, ns=args.ns, data=args.data)
    queues = args.queues or sorted(set(declared)) or ["default"]
    for name in queues:
        check_name(name, "queue")
    _warn_undeclared(queues, declared, bool(args.imports), bool(args.allow))
    done = run_worker(  # which says what it serves, as it does from Python
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
        fire_schedules=args.schedules,
        metrics_textfile=args.metrics_textfile,
        metrics_port=args.metrics_port,
    )
    logging.getLogger("lakeshore.worker").info("worker done: %d attempt(s)", done)
    return 0


@dataclass
class _Outcome:
    """What gc did (or would do) to each queue, and to the workers' signs of life."""

    reports: dict[str, GcReport] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # queue -> why
    errors: dict[str, str] = field(default_factory=dict)  # queue (or "workers") -> message
    workers: int = 0


def _sweep(
    q: Dispatch,
    names: list[str],
    named: bool,
    older: float | None,
    now: float,
    dry_run: bool,
    only: _Outcome | None = None,
) -> _Outcome:
    """Collect every queue on its own: one bad queue is reported and the others still go.
    With ``only`` (a dry run a person confirmed), nothing beyond what it listed goes."""
    out = _Outcome()
    for name in names:
        try:
            ops = q.plane.ops(name)
            if retention_of(ops, q.plane.settings, older) is None:
                why = "no retention: pass --older-than, or set the queue's result_retention_s"
                if named:  # asked for by name: not being able to is an error
                    raise InvalidArgument(f"gc {name}", why.replace(": ", " given; ", 1), why)
                out.skipped[name] = why
                continue
            keep = None
            if only is not None:
                planned = only.reports.get(name)
                keep = set(planned.expired + planned.orphans) if planned else set()
            out.reports[name] = collect(
                ops, q.plane.settings, older, now, dry_run=dry_run, only=keep
            )
        except LakeshoreError as e:
            out.errors[name] = str(e)
    if older is not None:
        try:
            out.workers = prune_workers(q.store, q.ns, older, now, dry_run)
        except LakeshoreError as e:
            out.errors["workers"] = str(e)
    return out


def _render(out: _Outcome, dry_run: bool, stream: Any) -> None:
    verb = "would remove" if dry_run else "removed"
    for name, r in out.reports.items():
        print(
            f"{name}: {verb} {len(r.expired)} invocation(s), {len(r.objects)} object(s)"
            + (f"; {len(r.orphans)} orphaned folder(s)" if r.orphans else "")
            + (
                f"; kept {r.kept_by_retention} for the queue's retention"
                if r.kept_by_retention
                else ""
            ),
            file=stream,
        )
        if dry_run:
            for inv in r.expired + r.orphans:
                print(f"  {inv}", file=stream)
    for name, why in out.skipped.items():
        print(f"{inert(name)}: skipped ({why})", file=stream)
    if out.workers:
        print(
            f"{verb} {out.workers} sign(s) of life of workers not seen since the cutoff",
            file=stream,
        )


def _confirm(plan: _Outcome) -> bool:
    """Show the plan on stderr and ask; True only for a yes."""
    _render(plan, True, sys.stderr)
    print("delete all of this? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _cmd_gc(args: argparse.Namespace) -> int:
    older = parse_age(args.older_than) if args.older_than is not None else None
    interactive = not args.dry_run and not args.yes
    if interactive and not sys.stdin.isatty():
        raise InvalidArgument(
            "gc",
            "gc deletes, and there is no terminal to confirm on (stdin is not a terminal)",
            "pass --yes to delete without asking, or --dry-run to only list what would go",
        )
    q = plane(args)  # a mistyped file:// path is refused, not created empty
    if args.queues:
        for name in args.queues:
            note_if_unknown(q, name)
    names = list(args.queues or sorted(queue_names(q.store, q.ns)))
    now = q.store.now()
    only = None
    if interactive:
        plan = _sweep(q, names, bool(args.queues), older, now, dry_run=True)
        for name, message in plan.errors.items():
            err(message if name != "workers" else f"signs of life: {message}")
        # objects alone: leaked admission slots, freed like the rest once confirmed
        if not any(r.expired or r.orphans or r.objects for r in plan.reports.values()) and (
            not plan.workers
        ):
            _render(plan, True, sys.stdout)
            print("nothing to delete")
            return 2 if plan.errors else 0
        if not _confirm(plan):
            print("nothing deleted", file=sys.stderr)
            return 1
        only = plan
        names = [n for n in names if n in plan.reports]  # errors are not retried unasked
    out = _sweep(q, names, bool(args.queues), older, now, dry_run=args.dry_run, only=only)
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "workers": out.workers,
                "queues": {
                    n: {
                        "expired": r.expired,
                        "orphans": r.orphans,
                        "objects": len(r.objects),
                        "kept_by_retention": r.kept_by_retention,
                    }
                    for n, r in out.reports.items()
                },
                "skipped": out.skipped,
                "errors": out.errors,
            }
        )
    else:
        _render(out, args.dry_run, sys.stdout)
    for name, message in out.errors.items():
        err(message if name != "workers" else f"signs of life: {message}")
    return 2 if out.errors else 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="serve queues: claim invocations and run them",
        description="Run a worker until stopped (or --max-jobs / --idle-exit). SIGTERM or "
        "SIGINT stops claiming; running attempts get --grace seconds, then are released: their "
        "invocations are queued again at once, the attempt not counted. A second signal exits "
        "at once.",
    )
    add_queues(
        p,
        "queue to serve (repeat for several; default: the queues of the "
        "--import modules' @udf functions, else default)",
    )
    add_imports(p, "module to import first (its functions, its hooks); repeatable")
    p.add_argument(
        "--allow",
        action="append",
        metavar="PATTERN",
        help="also run functions matching this module:qualname pattern (fnmatch, e.g. "
        "'mypkg.jobs:*') although they are not decorated with @udf, importing their module "
        "if need be; repeatable. Without it the worker runs only @udf functions of the "
        "--import modules",
    )
    p.add_argument("--concurrency", "-c", type=int, default=1, help="attempts at once (default 1)")
    p.add_argument(
        "--isolation",
        choices=["process", "thread", "auto"],
        default="process",
        help="process: a child process per slot, bodies can be killed and cannot "
        "crash the worker (default); thread: light bodies",
    )
    p.add_argument("--max-jobs", type=int, help="exit after this many attempts")
    p.add_argument(
        "--idle-exit",
        type=finite,
        metavar="SECONDS",
        help="exit (code 0) after this long without work: SLURM array jobs that drain (a retry "
        "the worker has seen backing off is work to come: it stays to run it)",
    )
    p.add_argument(
        "--lease",
        type=finite,
        metavar="SECONDS",
        help="lease length for claimed invocations (default: the invocation's, 30 s); "
        "heartbeats every third of it",
    )
    p.add_argument(
        "--grace",
        type=finite,
        default=30.0,
        metavar="SECONDS",
        help="after SIGTERM, how long running attempts may finish (default 30)",
    )
    p.add_argument(
        "--max-poll",
        type=finite,
        default=1.25,
        metavar="SECONDS",
        help="longest pause between polls of an idle queue (default 1.25: under 60 "
        "requests a minute however many slots)",
    )
    p.add_argument(
        "--on-start",
        metavar="MODULE:FUNCTION",
        help="hook run once per process that runs bodies, before its first attempt",
    )
    p.add_argument(
        "--before-job",
        metavar="MODULE:FUNCTION",
        help="hook run before every attempt, with the invocation record",
    )
    p.add_argument(
        "--on-stop",
        metavar="MODULE:FUNCTION",
        help="hook run when a body process shuts down in order (best effort)",
    )
    p.add_argument(
        "--schedules",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fire the due slots of the queues' schedules (default; --no-schedules: leave "
        "them to 'lakeshore schedule tick' or other workers)",
    )
    p.add_argument("--worker-id", help="name in leases and logs (default host:pid)")
    p.add_argument(
        "--metrics-textfile",
        metavar="PATH",
        help="rewrite this file with the worker's counters in Prometheus text at each sign "
        "of life (for node_exporter's textfile collector; docs/metrics.md)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the worker's counters on http://127.0.0.1:PORT/metrics while it runs "
        "(0: any free port, said in the start line; docs/metrics.md)",
    )
    p.add_argument("--data", help="data root for dls.run files (default: beside the store)")
    p.add_argument("--log-level", default="info", help="debug, info, warning (default info)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a status line below the log: attempts running, done, failed, retried "
        "(default: when stderr is a terminal)",
    )
    add_common(p, json_output=False)
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser(
        "gc",
        help="remove finished invocations older than a retention",
        description="Remove terminal invocations that finished more than --older-than ago "
        "(never sooner than the queue's result_retention_s), with their spilled data, "
        "journals, logs, stale tickets and keys. Shows what it will delete and asks first, "
        "unless --yes. Finds the namespace's queues with one LIST per top-level folder (not by "
        "listing what they hold), then lists only ids older than the cutoff. A queue with "
        "no retention is skipped with a note; a queue that fails is reported and the others "
        "are still collected (exit 2 if any failed).",
    )
    p.add_argument(
        "--older-than",
        metavar="AGE",
        help="e.g. 7d, 12h, 30m (default: the queue's result_retention_s)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="delete without asking (needed when stdin is not a terminal: cron, CI)",
    )
    add_queues(p, "only this queue (repeatable; default: every queue of the namespace)")
    add_common(p)
    p.set_defaults(func=_cmd_gc)
