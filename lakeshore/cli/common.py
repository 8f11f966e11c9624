"""What every ``lakeshore`` command shares: the store options, output and error handling."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from lakeshore.dispatch import DEFAULT_URL, Dispatch
from lakeshore.errors import NotFound
from lakeshore.keys import QueueKeys, check_name

__all__ = ["add_common", "ago", "default_url", "plane", "print_json", "require_queue", "table"]


def default_url() -> str:
    return os.environ.get("LAKESHORE_URL") or DEFAULT_URL


def add_common(p: argparse.ArgumentParser, json_output: bool = True) -> None:
    p.add_argument("--url", help=f"store URL; default: $LAKESHORE_URL, else {DEFAULT_URL}")
    p.add_argument("--ns", default="default", help="namespace (default: default)")
    if json_output:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def plane(args: argparse.Namespace) -> Dispatch:
    return Dispatch(args.url, ns=args.ns)


def require_queue(q: Dispatch, queue: str) -> None:
    """Raise a clear NotFound unless ``queue`` has any object in the store (one LIST).

    Raises:
        InvalidArgument: a bad queue name. NotFound: the queue has never been used.
    """
    keys = QueueKeys(q.ns, check_name(queue, "queue"))
    if next(iter(q.store.list(keys.ids_prefix)), None) is None:
        raise NotFound(
            f"queue {queue}",
            f"no queue {queue!r} in namespace {q.ns!r} of {q.store.url}",
            "check the name and --ns (lakeshore status lists the queues workers serve)",
            queue=queue,
        )


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def ago(t: float | None, now: float | None = None) -> str:
    """A duration or age, short: 4s, 3m12s, 5h02m, 2d03h."""
    if t is None:
        return "-"
    s = max(0, int(t if now is None else (now - t)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def wall(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def err(text: str) -> None:
    print(f"lakeshore: {text}", file=sys.stderr)
