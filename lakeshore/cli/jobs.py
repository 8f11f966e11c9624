"""Commands on invocations by id: submit, show, result, tail, logs, cancel, wait, retry."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from lakeshore.cli import bulk_retry
from lakeshore.cli.common import (
    add_call_options,
    add_common,
    ago,
    aware_time,
    call_options,
    dumps,
    duration,
    err,
    finite,
    json_arg,
    plane,
    print_json,
    took,
    waits,
    wall,
)
from lakeshore.errors import Failed, InvalidArgument, JobError, LakeshoreError, NotFound
from lakeshore.keys import check_id
from lakeshore.model.dependencies import parents_line
from lakeshore.model.record import TERMINAL, Record
from lakeshore.running.bodies import Declared, import_ref
from lakeshore.text import inert

__all__ = ["register"]


def _cmd_submit(args: argparse.Namespace) -> int:
    kwargs = json_arg(args.kwargs, "submit", "--kwargs", dict)
    pos = json_arg(args.args, "submit", "--args", list)
    if ":" not in args.function:
        raise InvalidArgument(
            "submit", f"{args.function!r} is not module:function", "e.g. mypkg.jobs:resize"
        )
    q = plane(args, create=True)  # a first submit is how a store comes to be
    target = import_ref(args.function)  # the user names it here, on their own authority
    fn = target.fn if isinstance(target, Declared) else target
    queue = args.queue or (target.queue if isinstance(target, Declared) else "default")
    options = {f"_{k}": v for k, v in call_options(args).items()}
    if args.key:
        options["_key"] = args.key
    if args.priority is not None:
        options["_priority"] = args.priority
    if args.delay is not None:
        options["_delay_s"] = args.delay
    if args.not_before is not None:
        options["_not_before"] = args.not_before
    if args.after:  # docs/dependencies.md
        options.update(_after=args.after, _after_failure=args.after_failure)
    twice = sorted(set(kwargs) & set(options))
    if twice:  # else a TypeError of the call below, as a traceback
        raise InvalidArgument(
            "submit",
            f"--kwargs gives {twice[0]!r}, which the command's options give too",
            "give it once: as the option, or in --kwargs",
        )
    # a @udf keeps its settings and its retry rule; the command's options go over them
    own = target if isinstance(target, Declared) else Declared(fn, False)
    rule = own.retry
    inv = q.udf(
        queue=queue,
        max_attempts=own.max_attempts,
        timeout_s=own.timeout_s,
        priority=own.priority,
        retry_for=rule.retry_for,
        no_retry_for=rule.no_retry_for,
        retry_backoff_s=rule.backoff_s,
        retry_backoff_cap_s=rule.backoff_cap_s,
        retry_jitter=rule.jitter,
    )(fn).submit(*pos, **kwargs, **options)
    if args.json:
        print_json({"id": inv, "queue": queue})
    else:
        print(inv)
    return 0


def record_dict(rec: Record) -> dict[str, Any]:
    """A record as plain data (bytes shown by size)."""

    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return {"bytes": len(v)}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(rec).items()}


def _cmd_show(args: argparse.Namespace) -> int:
    check_id(args.id)
    q = plane(args)
    rec = q.get(args.id)
    if args.json:
        print_json(record_dict(rec))
        return 0
    lease = rec.lease
    now = q.store.now()  # record times are in the store's clock, not this machine's
    run_s = (rec.finished_at or now) - rec.started_at if rec.started_at else None
    rows = [
        ("id", rec.id),
        ("function", rec.fn),
        ("queue", f"{rec.ns}/{rec.queue}"),
        ("state", rec.state),
        (
            "attempt",
            f"{rec.attempt} of {rec.max_attempts}"
            + (f" ({rec.released} released)" if rec.released else "")
            # the words `retry` prints: a queued record's count is of attempts made so far
            + (f", attempt {rec.attempt + 1} is next" if _next_is_due(rec) else ""),
        ),
        ("priority", rec.priority),
        ("key", rec.key or "-"),
        ("scope", rec.prefix or "-"),
        ("submitted", wall(rec.submitted_at)),
        ("scheduled", _scheduled(rec, now)),
        ("started", wall(rec.started_at)),
        ("finished", wall(rec.finished_at)),
        ("ran for", took(run_s)),
        (
            "worker",
            f"{lease.worker} (lease {ago(lease.expires_at - now)} left)" if lease else "-",
        ),
        ("timeout", f"{rec.timeout_s}s" if rec.timeout_s else "-"),
        (
            "result",
            "-"
            if rec.result is None
            else f"{rec.result.size or len(rec.result.inline or b'')} bytes"
            + (" (spilled)" if rec.result.ref else ""),
        ),
        (
            "stream",
            "-"
            if not rec.journal
            else f"{rec.journal.get('frames')} frames of attempt {rec.journal.get('attempt')}",
        ),
    ]
    if rec.after or rec.after_pass:  # a child: docs/dependencies.md
        queued = rec.state == "queued"
        rows.append(
            (
                "parents",
                parents_line(
                    len(rec.after), rec.after_done, queued, rec.after_failure, rec.after_pass
                ),
            )
        )
    for name, value in rows:
        print(f"{name:<10} {inert(value)}")  # fn, key, worker: written by others
    if rec.history:  # the attempts, each on a line of its own, indented
        print("attempts")
        for t in rec.history:
            spent = f"{t.ended_at - t.started_at:.2f}s" if t.ended_at is not None else "running"
            ended = t.outcome or ""
            print(f"    {t.attempt:<4} {inert(t.worker)}  {wall(t.started_at)}  {spent}  {ended}")
    if rec.error:  # then the error, which the traceback follows
        error = f"{rec.error.get('type')}: {rec.error.get('message')}"
        print(f"{'error':<10} {inert(error)}")
    trace = rec.error.get("traceback", "") if rec.error else ""
    if trace.strip():  # the last field: its lines follow, indented
        print("traceback")
        print(_indented(trace))
    return 0


def _next_is_due(rec: Record) -> bool:
    """Queued after an attempt (a retry, a rerun, a release): another one comes."""
    return rec.state == "queued" and rec.attempt > 0


def _scheduled(rec: Record, now: float) -> str:
    """A delayed submit's time (kept after it ran), and while it is queued and not yet
    claimable, how long until it is (a delay, or a retry's backoff)."""
    parts = [wall(rec.scheduled_at)] if rec.scheduled_at is not None else []
    if waits(rec, now):
        if rec.scheduled_at is None or rec.not_before != rec.scheduled_at:
            parts.append(f"next attempt {wall(rec.not_before)}")
        parts.append(f"(in {ago(rec.not_before - now)})")
    return " ".join(parts) or "-"


def _indented(text: str) -> str:
    """A remote traceback to print: inert (written on a worker, read from the store: anyone
    who can write the record chose it) but keeping its lines, each indented by four."""
    return "\n".join("    " + line for line in inert(text, multiline=True).rstrip().splitlines())


def _cmd_result(args: argparse.Namespace) -> int:
    check_id(args.id)
    q = plane(args)
    try:
        value = q.result(args.id, timeout=args.timeout)
    except JobError as e:
        if not _told_with_traceback(e):
            raise
        return 1
    if args.json or not isinstance(value, str):
        print(dumps(codec_plain(value), indent=None))
    else:
        print(inert(value, multiline=True))  # the body's own text: keep its lines
    return 0


def _told_with_traceback(e: JobError) -> bool:
    """For a body that raised: print its remote traceback on stderr, then the error line
    pointing at it (the exit code stays 1, as for every JobError). False, with nothing
    printed, when nothing raised on the worker (a cancel, a timeout, a body that never
    loaded): the error line says it all.

    The exception's own message points Python callers at its ``remote_traceback``, which a
    shell user cannot reach: the traceback is printed instead, on stderr like the error line,
    so that stdout holds only values."""
    trace = e.remote_traceback
    if not isinstance(e, Failed) or not trace.strip():
        return False
    print(inert(trace, multiline=True).rstrip(), file=sys.stderr)
    todo = "the traceback above shows where the body raised; fix the body or its input"
    err(f"{e.op}: {e.what} — {todo} and submit again")
    return True


def codec_plain(value: Any) -> Any:
    """A decoded value made JSON-friendly (tuples as lists, bytes as text when UTF-8)."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"bytes": len(value)}
    if isinstance(value, list | tuple):
        return [codec_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): codec_plain(v) for k, v in value.items()}
    return value


def _cmd_tail(args: argparse.Namespace) -> int:
    check_id(args.id)
    q = plane(args)
    try:
        for frame in q.stream(args.id, since=args.since, timeout=args.timeout):
            _print_frame(frame, args.json)
    except JobError as e:  # after the frames it streamed
        if not _told_with_traceback(e):
            raise
        return 1
    return 0


def _print_frame(frame: Any, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {"seq": frame.seq, "attempt": frame.attempt, "value": codec_plain(frame.value)},
                default=repr,
            ),
            flush=True,
        )
    else:
        print(f"{frame.seq}\t{json.dumps(codec_plain(frame.value), default=repr)}", flush=True)


def _cmd_logs(args: argparse.Namespace) -> int:
    check_id(args.id)
    q = plane(args)
    said = False
    if args.follow:
        for text in q.follow_logs(args.id, attempt=args.attempt, timeout=args.timeout):
            said = said or bool(text)
            sys.stdout.write(inert(text, multiline=True))
            sys.stdout.flush()
    else:
        text = q.logs(args.id, attempt=args.attempt)
        said = bool(text)
        sys.stdout.write(inert(text, multiline=True))
    if not said:  # an empty stdout alone reads like a failed command
        err(f"note: {_no_output(q, args.id, args.attempt)}")
    return 0


def _no_output(q: Any, inv: str, attempt: int | None) -> str:
    """What an empty ``logs`` means, on stderr (stdout stays the output: empty)."""
    rec = q.get(inv)
    if attempt is not None and attempt > rec.attempt:
        ran = "has not run yet" if rec.attempt == 0 else f"has run {rec.attempt} attempt(s)"
        return f"{inv} {ran} ({rec.state}): there is no attempt {attempt}"
    if attempt is not None:
        return f"no output captured for attempt {attempt} of {inv}"
    if rec.attempt == 0:
        return f"{inv} has not run yet ({rec.state}): no output to show"
    tried = "attempt 1" if rec.attempt == 1 else f"attempts 1 to {rec.attempt}"
    return f"no output captured for {tried} of {inv} (the body printed and logged nothing)"


def _cmd_cancel(args: argparse.Namespace) -> int:
    """Every id is tried, whatever happened to the ones before it, and each gets its line:
    a failure in the middle must not leave the rest queued with nothing said."""
    q = plane(args)
    out: dict[str, str] = {}
    for inv in args.ids:
        try:
            out[inv] = "cancelled" if q.cancel(inv) else "already finished"
        except NotFound as e:
            out[inv] = "not found"
            err(e)
        except InvalidArgument as e:
            out[inv] = "invalid id"
            err(e)
        except LakeshoreError as e:
            out[inv] = "error"
            err(e)
        if not args.json:
            print(f"{inert(inv)}  {out[inv]}", flush=True)
    if args.json:
        print_json(out)
    failed = any(what not in ("cancelled", "already finished") for what in out.values())
    return 2 if failed else 0


def _cmd_retry(args: argparse.Namespace) -> int:
    bulk_retry.refuse_mixed(args)
    if args.queue is not None:
        return bulk_retry.run(args)
    check_id(args.id)
    q = plane(args)
    attempt = q.retry(args.id)
    if args.json:
        print_json({"id": args.id, "attempt": attempt})
        return 0
    try:  # one GET more for the words `show` uses: "3 of 4, attempt 4 is next"
        rec = q.get(args.id)
        made = f"{rec.attempt} of {rec.max_attempts}, " if rec.attempt == attempt - 1 else ""
    except LakeshoreError:
        made = ""  # queued all the same: what is known is said
    print(f"{args.id} queued again: {made}attempt {attempt} is next")
    return 0


def _cmd_wait(args: argparse.Namespace) -> int:
    q = plane(args)
    states = {inv: q.status(inv) for inv in args.ids}  # every id checked before waiting
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    # redrawn with \r: on a terminal only, never into a log file or a pipe
    bar = not args.json and not args.quiet and sys.stderr.isatty()
    delay = 0.05
    while True:
        done = sum(1 for s in states.values() if s in TERMINAL)
        if bar:
            width = 30
            filled = width * done // len(states)
            print(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{len(states)} finished",
                end="",
                file=sys.stderr,
                flush=True,
            )
        if done == len(states) or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(delay)  # polling the store is the only way to learn
        delay = min(delay * 1.5, 1.0)
        for inv, s in states.items():
            if s not in TERMINAL:
                states[inv] = q.status(inv)
    if bar:
        print(file=sys.stderr)
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    if args.json:
        print_json({"states": states, "counts": counts})
    else:
        print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for inv, s in states.items():
            if s != "succeeded":
                print(f"  {inert(inv)}  {s}")
    if any(s not in TERMINAL for s in states.values()):
        return 3  # timed out waiting
    return 0 if all(s == "succeeded" for s in states.values()) else 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="enqueue a call of module:function; prints the id",
        description="Enqueue module:function with JSON arguments. Prints the "
        "invocation id (the whole handle). Use --key to make a retry of this "
        "command safe: the same key returns the same id.",
    )
    p.add_argument("function", help="module:function (importable here and by the workers)")
    p.add_argument("--kwargs", help="keyword arguments as a JSON object")
    p.add_argument("--args", help="positional arguments as a JSON array")
    p.add_argument("--key", help="idempotency key (unique per namespace and queue)")
    p.add_argument("--queue", help="queue (default: the function's @udf queue, else default)")
    p.add_argument("--priority", type=int, help="0 (lowest) to 9 (highest); default 5")
    p.add_argument(
        "--delay",
        type=duration,
        metavar="DURATION",
        help="run no sooner than this long from now, by the store's clock: seconds or "
        "30s, 10m, 2h, 1d",
    )
    p.add_argument(
        "--not-before",
        type=aware_time,
        metavar="TIME",
        help="run no sooner than this ISO 8601 time with a zone, e.g. 2026-12-24T18:00+01:00",
    )
    p.add_argument(
        "--after",
        action="append",
        metavar="ID",
        help="run only once this invocation succeeded (repeat for several parents)",
    )
    p.add_argument(
        "--after-failure",
        choices=("kill", "run"),
        default="kill",
        help="a parent that ends otherwise: kill this one (default), or run it all the same",
    )
    add_call_options(p)
    add_common(p)
    p.set_defaults(func=_cmd_submit)

    p = sub.add_parser(
        "show",
        help="an invocation's record, readable",
        description="Print the record of an invocation: state, attempts, "
        "times, worker, error (and where the body raised, its traceback). --json "
        "prints every field.",
    )
    p.add_argument("id")
    add_common(p)
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser(
        "result",
        help="wait for an invocation and print its value",
        description="Wait for the invocation to finish and print its result "
        "(JSON unless it is a string). Exit 1 if it failed, was killed or "
        "timed out; the remote error is the message, on stderr after the "
        "body's traceback when it raised.",
    )
    p.add_argument("id")
    p.add_argument("--timeout", type=finite, help="seconds to wait (default: for good)")
    add_common(p)
    p.set_defaults(func=_cmd_result)

    p = sub.add_parser(
        "tail",
        help="follow what a generator body yields",
        description="Print the frames an invocation streams, as they come, "
        "until it ends. One line per frame: seq, TAB, value as JSON.",
    )
    p.add_argument("id")
    p.add_argument("--since", type=int, default=0, help="first seq to print (default 0)")
    p.add_argument("--timeout", type=finite, help="stop after this many seconds")
    add_common(p)
    p.set_defaults(func=_cmd_tail)

    p = sub.add_parser(
        "logs",
        help="what an invocation's body printed and logged",
        description="Print the captured stdout, stderr and logging output of "
        "an invocation (every attempt, or --attempt N); --follow keeps "
        "printing until it finishes.",
    )
    p.add_argument("id")
    p.add_argument("--attempt", type=int, help="only this attempt")
    p.add_argument("--follow", "-f", action="store_true", help="keep following new output")
    p.add_argument("--timeout", type=finite, help="with --follow: stop after this many seconds")
    add_common(p, json_output=False)
    p.set_defaults(func=_cmd_logs)

    p = sub.add_parser(
        "cancel",
        help="cancel invocations (queued or running -> killed)",
        description="Cancel invocations. A running body is stopped by its "
        "worker within one heartbeat.",
    )
    p.add_argument("ids", nargs="+", metavar="ID")
    add_common(p)
    p.set_defaults(func=_cmd_cancel)

    p = sub.add_parser(
        "wait",
        help="wait for invocations, with a progress bar and summary",
        description="Wait until every id has finished. Exit 0 if all "
        "succeeded, 1 if any did not, 3 if --timeout passed first.",
    )
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--timeout", type=finite, help="seconds to wait (default: for good)")
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bar (there is none unless stderr is a terminal)",
    )
    add_common(p)
    p.set_defaults(func=_cmd_wait)

    p = sub.add_parser(
        "retry",
        help="run a finished invocation again as a new attempt (or every one a filter selects)",
        description="Queue a finished (succeeded, failed, killed or timed out) "
        "invocation again: same id, arguments and key; a new attempt. With --queue instead "
        "of an id: every finished invocation of the queue in --state (default failed) that "
        "--fn, --since and --until select; two runs at once rerun each once.",
    )
    p.add_argument("id", nargs="?")
    bulk_retry.add_arguments(p)
    add_common(p)
    p.set_defaults(func=_cmd_retry)
