"""What multiprocessing's fork server imports before it forks body processes.

Importing this module in the fork server loads lakeshore's body-process code once, for every
child, and makes the server ignore SIGTERM and SIGHUP. The server is a member of the worker's
process group: a SIGTERM for the whole group (scancel, a service manager's stop,
``kill -TERM -<pgid>``) would otherwise end it, and with it the only record of how its
children end — a body still running would look dead to the worker, which would run the
invocation again beside it. The server ends when its worker does (multiprocessing closes a
pipe it watches). Children inherit the dispositions; a body process sets its own in
:func:`lakeshore.running.child._serve`.

Imported anywhere else, this module does nothing but import :mod:`lakeshore.running.child`.
"""

from __future__ import annotations

import inspect
import signal

import lakeshore.running.child  # noqa: F401  (what the server preloads for every child)

__all__: list[str] = []


def _in_fork_server() -> bool:
    """Whether multiprocessing's fork server is importing this module (its ``main`` is on
    the stack): only that process may have its signal dispositions changed."""
    frame = inspect.currentframe()
    while frame is not None:
        if (
            frame.f_code.co_name == "main"
            and frame.f_globals.get("__name__") == "multiprocessing.forkserver"
        ):
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
