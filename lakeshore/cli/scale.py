"""``lakeshore scale``: supply a queue's workers through its provider, in a loop or once."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from lakeshore.cli.common import add_common, add_imports, dumps, finite, plane, require_queue
from lakeshore.errors import InvalidArgument
from lakeshore.providers import CommandProvider, LocalProvider, Provider, SlurmProvider
from lakeshore.scaler import Scaler, ScaleReport
from lakeshore.text import inert

__all__ = ["register"]


def _provider(args: argparse.Namespace, kind: str) -> Provider:
    templates = {"launch": args.launch, "list": args.list, "cancel": args.cancel}
    given = [f"--{k}" for k, v in templates.items() if v]
    if kind != "command" and given:
        raise InvalidArgument(
            "scale",
            f"{', '.join(given)}: only for a command provider, and the queue's is {kind!r}",
            "leave them out, or attach a command provider to the queue",
        )
    if kind != "slurm" and args.setup:
        raise InvalidArgument(
            "scale",
            f"--setup: only for a slurm provider, and the queue's is {kind!r}",
            "leave it out, or attach a slurm provider to the queue",
        )
    if kind == "local":
        return LocalProvider(args.state_dir, args.log_dir)
    if kind == "slurm":
        return SlurmProvider(args.setup, args.log_dir)
    missing = [f"--{k}" for k, v in templates.items() if not v]
    if missing:
        raise InvalidArgument(
            "scale",
            f"the queue's provider is 'command' but {', '.join(missing)} is not given",
            "pass --launch, --list and --cancel templates (see docs/providers.md)",
        )
    return CommandProvider(args.launch, args.list, args.cancel)


def _cmd_scale(args: argparse.Namespace) -> int:
    q = plane(args)
    kinds = {}
    for name in dict.fromkeys(args.queues):
        require_queue(q, name, "check the name and --ns; set its provider with `queue set`")
        block = q.queue_config(name).provider
        if block is None:
            raise InvalidArgument(
                "scale",
                f"queue {name!r} has no provider",
                f"attach one: lakeshore queue set {name} provider=local (or slurm, command)",
            )
        kinds[name] = block.kind
    if len(set(kinds.values())) > 1:
        raise InvalidArgument(
            "scale",
            f"the queues have different providers {kinds}",
            "run one scaler per provider kind",
        )
    scaler = Scaler(
        q,
        list(kinds),
        _provider(args, next(iter(kinds.values()))),
        url=args.worker_url,
        imports=args.imports or [],
        allow=args.allow or [],
        python=args.python,
        max_workers=args.max_workers,
        interval_s=args.interval,
        lease_s=args.lease,
    )
    stop = threading.Event()
    failed = False

    def show(report: ScaleReport) -> None:
        nonlocal failed
        failed = failed or report.error is not None
        text = dumps(report.as_dict(), indent=None) if args.json else inert(report.line())
        print(text, flush=True)

    def stopping(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        scaler.run(stop, show, once=args.once)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return 2 if args.once and failed else 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "scale",
        help="launch and drain a queue's workers through its provider (local, slurm, command)",
        description=(
            "Every --interval seconds, read each queue's provider block and live depth (one "
            "LIST page per 1000 live invocations, counted only as far as it changes the "
            "decision), count the workers the provider lists "
            "(waiting ones too), and launch what the queue wants: ceil(live / "
            "jobs_per_worker), at most max_workers, once the cool-down is over. "
            "Workers leave by themselves after idle_exit_s without work. Only the scaler "
            "holding the queue's lease in the store acts; a second one launches nothing. "
            "Attach a provider first: lakeshore queue set QUEUE provider=slurm "
            "provider.max_workers=4. Shell text (--setup, the command templates) and the "
            "workers' --import modules are given here, never read from the store."
        ),
    )
    p.add_argument("queues", nargs="+", metavar="QUEUE", help="queues to scale (one provider kind)")
    p.add_argument("--once", action="store_true", help="one round, then exit (cron, scrontab)")
    p.add_argument(
        "--interval",
        type=finite,
        default=30.0,
        metavar="SECONDS",
        help="seconds between rounds (default 30); a round costs each queue 3 store requests",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="this scaler's own cap over all its queues, whatever their records say",
    )
    p.add_argument(
        "--lease",
        type=finite,
        metavar="SECONDS",
        help="how long the scaler's lease lasts unrenewed: 2 x interval to 600 "
        "(default max(3 x interval, 30), at most 600)",
    )
    add_imports(p, "the workers' --import (the modules of the @udf functions); repeatable")
    p.add_argument(
        "--allow", action="append", metavar="PATTERN", help="the workers' --allow; repeatable"
    )
    p.add_argument("--python", help="the interpreter workers run (default: this one)")
    p.add_argument("--worker-url", help="the store URL workers get (default: --url)")
    p.add_argument("--log-dir", help="local, slurm: where the workers' output goes")
    p.add_argument(
        "--state-dir",
        help="local: where the scaler keeps its workers' pids "
        "(default $XDG_STATE_HOME/lakeshore/local)",
    )
    p.add_argument(
        "--setup",
        metavar="SHELL",
        help="slurm: lines run before the worker, e.g. 'module load python; source venv/bin/"
        "activate'",
    )
    p.add_argument("--launch", metavar="TEMPLATE", help="command: launch one worker ({worker})")
    p.add_argument("--list", metavar="TEMPLATE", help="command: print '<id> [state]' per worker")
    p.add_argument("--cancel", metavar="TEMPLATE", help="command: cancel worker {id}")
    add_common(p)
    p.set_defaults(func=_cmd_scale)
