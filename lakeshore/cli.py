"""The ``lakeshore`` command line.

Errors are one clear line on stderr and a non-zero exit; ``--json`` gives scripts the data.
Exit codes: 0 ok, 1 the check found a problem, 2 bad usage or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from lakeshore import __version__
from lakeshore.doctor import Check
from lakeshore.errors import LakeshoreError

__all__ = ["DEFAULT_URL", "main"]

DEFAULT_URL = "file://~/.lakeshore"


def _default_url() -> str:
    return os.environ.get("LAKESHORE_URL") or DEFAULT_URL


def _cmd_doctor(args: argparse.Namespace) -> int:
    from lakeshore.doctor import diagnose
    from lakeshore.store import open_store

    if args.threads < 2 or args.rounds < 1:
        print("lakeshore: doctor: --threads must be >= 2 and --rounds >= 1", file=sys.stderr)
        return 2
    url = args.url or _default_url()
    progress = None if args.json else _progress
    if progress:
        print(f"lakeshore doctor: {url}\n", flush=True)
    with open_store(url) as store:
        report = diagnose(store, threads=args.threads, rounds=args.rounds, on_check=progress)
    if args.json:
        print(
            json.dumps(
                {
                    "url": report.url,
                    "safe": report.safe,
                    "checks": [vars(c) for c in report.checks],
                },
                indent=2,
                ensure_ascii=False,
            )
        )
    else:
        print("\n" + report.render().splitlines()[-1])
    return 0 if report.safe else 1


def _progress(check: Check) -> None:
    print(check.line(), flush=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    from lakeshore.demo import main as demo

    return demo(args.url)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="lakeshore",
        description="A task queue whose only server is object storage.",
    )
    parser.add_argument("--version", action="version", version=f"lakeshore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
        help=f"store URL (':memory:', 'file:///dir', 's3://bucket/prefix'); "
        f"default: $LAKESHORE_URL, else {DEFAULT_URL}",
    )
    doctor.add_argument("--threads", type=int, default=8, help="threads per race round (default 8)")
    doctor.add_argument("--rounds", type=int, default=20, help="race rounds (default 20)")
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
        "url", nargs="?", help=f"store URL; default: $LAKESHORE_URL, else {DEFAULT_URL}"
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
    except LakeshoreError as e:
        print(f"lakeshore: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
