"""What every ``lakeshore`` command shares: the store options, output and error handling.

Everything a command prints that came from the store (records, signs of life, logs, results,
error messages) may have been written by someone else, so it goes through :func:`inert`:
control characters come out as visible escapes and cannot move the cursor, erase a line,
set the window title or write the clipboard (OSC 52) of the terminal that shows them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from lakeshore.dispatch import DEFAULT_URL, Dispatch
from lakeshore.errors import InvalidArgument, NotFound
from lakeshore.keys import QueueKeys, check_name
from lakeshore.model.record import Record, State
from lakeshore.protocol.gc import parse_age
from lakeshore.text import inert, inert_json

__all__ = [
    "add_call_options",
    "add_common",
    "add_global",
    "add_queues",
    "ago",
    "call_options",
    "default_url",
    "dumps",
    "err",
    "finite",
    "merge_global",
    "note_if_unknown",
    "plane",
    "print_json",
    "public_url",
    "require_queue",
    "store_url",
    "table",
    "took",
]


def dumps(data: Any, indent: int | None = 2) -> str:
    """JSON for stdout: non-ASCII text stays readable, terminal controls are escaped."""
    return inert_json(json.dumps(data, indent=indent, ensure_ascii=False, default=str))


def finite(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (``nan``, ``inf`` and ``1e400``
    are refused: they would hang a wait or crash the arithmetic that follows)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def json_arg(text: str | None, op: str, what: str, expected: type) -> Any:
    """A command's JSON option (``--args``, ``--kwargs``) as a ``list`` or ``dict``; empty
    when not given.

    Raises:
        InvalidArgument: not JSON, or not of the ``expected`` type.
    """
    if text is None:
        return expected()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(
            f"{op} {what}", f"not valid JSON ({e})", "quote it: '{\"x\": 1}'"
        ) from None
    if not isinstance(value, expected):
        example = "--args '[1, 2]'" if expected is list else "--kwargs '{\"x\": 1}'"
        raise InvalidArgument(
            f"{op} {what}", f"must be a JSON {expected.__name__}", f"e.g. {example}"
        )
    return value


def duration(text: str) -> float:
    """An argparse type: seconds, or a number with a unit (``30s``, ``10m``, ``2h``, ``1d``,
    ``2w``)."""
    try:
        return parse_age(text)
    except InvalidArgument:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write seconds, or e.g. 30s, 10m, 2h, 1d"
        ) from None


def aware_time(text: str) -> datetime.datetime:
    """An argparse type: an ISO 8601 time with its zone (``Z`` or ``+01:00``); a time without
    one is refused, since this machine's zone need not be the reader's."""
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone: add one, e.g. {text}Z or {text}+01:00"
        )
    return value


def waits(rec: Record, now: float) -> bool:
    """Queued, and not to be claimed before a later time (a delay or a retry's backoff)."""
    return rec.state == State.QUEUED and rec.not_before > now


def default_url() -> str:
    return os.environ.get("LAKESHORE_URL") or DEFAULT_URL


def store_url(text: str) -> str:
    """An argparse type: a store URL, never empty (an empty one would mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty URL names no store — give one, or leave it out for the default"
        )
    return text


def public_url(url: str) -> str:
    """A store URL as the user wrote it, options and all (``?endpoint_url=...``: which
    server it is, not only which bucket), less any ``user:password@`` in it or in its
    endpoint: a URL printed may be pasted anywhere."""
    parts = urlsplit(url.strip())
    if not parts.scheme or parts.scheme == "file":
        return url.strip()
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(_without_userinfo(pair) for pair in parts.query.split("&") if pair)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _without_userinfo(pair: str) -> str:
    name, eq, value = pair.partition("=")
    inner = urlsplit(unquote(value))
    if not eq or "@" not in inner.netloc:
        return pair
    host = inner.netloc.rpartition("@")[2]
    bare = urlunsplit((inner.scheme, host, inner.path, inner.query, inner.fragment))
    return f"{name}={quote(bare, safe=':/')}"


def add_common(p: argparse.ArgumentParser, json_output: bool = True) -> None:
    p.add_argument(
        "--url", type=store_url, help=f"store URL; default: $LAKESHORE_URL, else {DEFAULT_URL}"
    )
    # None, not "default", so that an explicit `--ns default` after the subcommand still
    # wins over a global --ns (merge_global puts the default in)
    p.add_argument("--ns", help="namespace (default: default)")
    p.set_defaults(ns_default="default")
    if json_output:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def add_global(p: argparse.ArgumentParser) -> None:
    """The common options before the subcommand too (``lakeshore --url X show ID``). They go
    to their own names: a subcommand's defaults would overwrite them otherwise, and one given
    after the subcommand wins (see :func:`merge_global`)."""
    p.add_argument(
        "--url", dest="global_url", type=store_url, metavar="URL", help="store URL (any command)"
    )
    p.add_argument("--ns", dest="global_ns", metavar="NS", help="namespace (any command)")
    p.add_argument(
        "--json",
        dest="global_json",
        action="store_true",
        help="machine-readable output (commands that have it)",
    )


def merge_global(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Hand the options given before the subcommand to it, unless it was given its own
    after; one the subcommand does not take is a usage error (exit 2)."""
    given = {
        "url": args.global_url,
        "ns": args.global_ns,
        "json": args.global_json or None,
    }
    for name, value in given.items():
        if value is None:
            continue
        if not hasattr(args, name):
            parser.error(f"--{name} is not an option of `lakeshore {args.command}`")
        if name in ("ns", "url") and getattr(args, name) is not None:
            continue  # given after the subcommand too: the nearer one wins
        setattr(args, name, value)
    if getattr(args, "ns", "") is None and hasattr(args, "ns_default"):
        args.ns = args.ns_default


def add_call_options(p: argparse.ArgumentParser) -> None:
    """The options of each invocation a command submits: attempts, timeout, deadline, and
    the retry rule (docs/retries.md). Read back by :func:`call_options`."""
    p.add_argument("--max-attempts", type=int, help="attempts per invocation")
    p.add_argument("--timeout", type=finite, help="timeout_s of each attempt, in seconds")
    p.add_argument("--deadline", type=finite, help="deadline_s: seconds it may wait queued")
    p.add_argument(
        "--retry-for",
        action="append",
        metavar="EXC",
        help="retry only on this exception type, by name, e.g. TimeoutError or "
        "mypkg.errors.Busy (repeat for several)",
    )
    p.add_argument(
        "--no-retry-for",
        action="append",
        metavar="EXC",
        help="fail at once on this exception type, by name (repeat for several)",
    )
    p.add_argument(
        "--retry-backoff", type=finite, metavar="S", help="base of the retry backoff, seconds"
    )
    p.add_argument(
        "--retry-backoff-cap",
        type=finite,
        metavar="S",
        help="longest wait between attempts, seconds (at most 3600)",
    )
    p.add_argument(
        "--retry-jitter",
        type=finite,
        metavar="F",
        help="fraction of each wait drawn off at random, 0 to 1",
    )


def call_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options :func:`add_call_options` read that were given, by their submit names
    (``max_attempts``, ``retry_for``...), for the library to check."""
    given = {
        "max_attempts": args.max_attempts,
        "timeout_s": args.timeout,
        "deadline_s": args.deadline,
        "retry_for": args.retry_for,
        "no_retry_for": args.no_retry_for,
        "retry_backoff_s": args.retry_backoff,
        "retry_backoff_cap_s": args.retry_backoff_cap,
        "retry_jitter": args.retry_jitter,
    }
    return {k: v for k, v in given.items() if v is not None}


def add_imports(p: argparse.ArgumentParser, help: str) -> None:
    """``--import``/``-i``, repeatable, into ``args.imports`` (None when not given)."""
    p.add_argument("--import", "-i", dest="imports", action="append", metavar="MODULE", help=help)


def add_queues(p: argparse.ArgumentParser, help: str) -> None:
    """``--queue``/``-q``, repeatable, into ``args.queues`` (None when not given)."""
    p.add_argument("--queue", "-q", dest="queues", action="append", metavar="QUEUE", help=help)


def plane(args: argparse.Namespace, create: bool = False) -> Dispatch:
    """The plane of ``--url`` and ``--ns``. Unless ``create``, a local directory that holds
    no store is refused rather than created: a mistyped path must not look like an empty
    queue (or, for gc, like nothing to do).

    Raises:
        NotFound: no store at a ``file://`` URL (and not ``create``).
        InvalidArgument: a bad URL or namespace. StoreError: the store cannot be opened.
    """
    url = args.url or default_url()
    if not create:
        _require_store(url)
    return Dispatch(url, ns=args.ns)


def _local_root(url: str) -> Path | None:
    """The directory of a local-directory store URL (as ``open_store`` reads it), else None."""
    url = url.strip()
    if url == ":memory:":
        return None
    parts = urlsplit(url)
    if parts.scheme == "file":
        path = unquote(parts.netloc + parts.path)
    elif parts.scheme == "" and ":" not in url.split("/", 1)[0]:
        path = url
    else:
        return None
    return Path(path).expanduser() if path else None


def _require_store(url: str) -> None:
    root = _local_root(url)
    if root is None:
        return  # S3: opening creates nothing, and a wrong bucket fails on its own
    try:
        (root / "objects").stat()  # what every local store has from its first open on
    except FileNotFoundError:
        raise NotFound(
            f"open {url}",
            f"there is no lakeshore store in {root}",
            "check --url or $LAKESHORE_URL; a store is created by its first submit or worker",
            url=url,
        ) from None
    except OSError:
        return  # not a directory, no permission: opening the store says what is wrong


def _queue_is_known(q: Dispatch, queue: str) -> bool:
    keys = QueueKeys(q.ns, check_name(queue, "queue"))
    return next(iter(q.store.list(keys.ids_prefix)), None) is not None


def note_if_unknown(q: Dispatch, queue: str) -> None:
    """For commands that only read: a queue with no objects is shown empty, with a note on
    stderr (a typo, or a queue gc has emptied: neither is an error when nothing is written).

    Raises:
        InvalidArgument: a bad queue name.
    """
    if not _queue_is_known(q, queue):
        err(
            f"note: queue {queue!r} in namespace {q.ns!r} has no invocations and no settings — "
            "shown empty; check the name and --ns"
        )


def require_queue(q: Dispatch, queue: str, todo: str | None = None) -> None:
    """Raise a clear NotFound unless ``queue`` has any object in the store (one LIST).

    Raises:
        InvalidArgument: a bad queue name. NotFound: the queue has no objects (never used,
            or emptied by gc and never configured).
    """
    if not _queue_is_known(q, queue):
        raise NotFound(
            f"queue {queue}",
            f"no queue {queue!r} in namespace {q.ns!r} of {q.store.url}",
            todo or "check the name and --ns (lakeshore status lists the queues workers serve)",
            queue=queue,
        )


def print_json(data: Any) -> None:
    print(dumps(data))


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


def took(s: float | None) -> str:
    """How long something ran: hundredths of a second under a minute (``0.38s``, ``12.40s``:
    a whole-second ``0s`` beside a fast attempt says nothing), else as :func:`ago`."""
    if s is None:
        return "-"
    if not math.isfinite(s) or s >= 60:
        return ago(s) if math.isfinite(s) else f"{s:g}"
    return f"{max(0.0, s):.2f}s"


def table(rows: list[list[str]], header: list[str]) -> str:
    """Aligned columns; every cell rendered :func:`inert` first (widths count what shows)."""
    rows = [[inert(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def wall(t: float | None) -> str:
    """A store time as a local date and time; a number no date can hold (a record may say
    anything finite) as the number."""
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:g}"


def err(text: object) -> None:
    """One error line on stderr (inert: an error message may quote what a record holds)."""
    print(f"lakeshore: {inert(text)}", file=sys.stderr)
