"""The ``lakeshore`` command line.

Human-readable tables by default, ``--json`` for scripts. Errors are one clear line on
stderr and a non-zero exit. Exit codes: 0 ok; 1 the answer is "no" (a failed invocation, an unsafe
store, a wait with failures); 2 bad usage or an error; 3 still not finished when a
``--timeout`` ran out; 130 Ctrl-C; 141 the reader of stdout went away (``| head``), as a
shell reports a process that SIGPIPE ended. Whatever came from the store is printed inert (see
``lakeshore.text.inert``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from lakeshore import __version__
from lakeshore.cli import admin, jobs, metrics, scale, schedule, ui, watch, work
from lakeshore.cli.common import add_global, err, merge_global
from lakeshore.errors import JobError, LakeshoreError, NotFinished

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="lakeshore",
        description="A task queue whose only server is object storage.",
    )
    parser.add_argument("--version", action="version", version=f"lakeshore {__version__}")
    add_global(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (jobs, watch, metrics, work, schedule, scale, ui, admin):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    try:
        try:
            code = _run(argv)
        except SystemExit:  # argparse's --help and usage errors: what they printed, too
            _flush()
            raise
        _flush()
        return code
    except BrokenPipeError:
        # the reader left (`| head -1`): nothing is left to say, and no one to say it to
        _silence_stdout()
        return 141


def _flush() -> None:
    """Flush stdout here, where a closed pipe can be caught: what is still buffered would
    otherwise meet it in the interpreter's last flush, after main returned."""
    if sys.stdout is not None:  # None when started with stdout closed (>&-)
        sys.stdout.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it once more on the way out, and
    that flush must not meet the closed pipe again."""
    if sys.stdout is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is no file (a test's capture): there is no last flush to spoil


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    merge_global(args, parser)
    try:
        code: int = args.func(args)
    except JobError as e:
        err(e)
        return 1
    except NotFinished as e:
        err(e)
        return 3
    except LakeshoreError as e:
        err(e)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
