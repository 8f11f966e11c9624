"""A fork server that is a fork of the command line's worker, not a new interpreter.

multiprocessing's fork server is a fresh interpreter that imports lakeshore before it can fork
a body process: 0.2–0.4 s of CPU per worker process, paid again by each worker a scaler
starts. ``lakeshore worker`` holds lakeshore already, so :func:`fork_server` forks its server
from it, before the ``--import`` modules, the log and the store: the server, and every body
process it forks, holds lakeshore's modules and nothing else of the worker's. The server runs
the stdlib's ``forkserver.main`` and is registered where the stdlib looks for one, so body
processes come from it as before, and if it dies the stdlib starts its own.

It forks only while the process has one thread (counted in the kernel's thread list, which
sees a native library's threads too: a lock another thread held would stay held in the fork)
and only against the stdlib it was written for (the signature of ``forkserver.main``).
Elsewhere, and for ``run_worker`` called from Python, the stdlib starts its server as before.
See docs/protocol.md#execution-and-isolation.
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any

__all__ = [
    "fork_server",
    "short_socket_dir",
]

_KNOWN_MAIN = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]


# An AF_UNIX address holds 107 bytes. multiprocessing puts its fork server's socket at
# <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX, so a TMPDIR longer than about 75 bytes (a SLURM
# job's own, under a long scratch path) leaves no room, and no body process could start.
_SOCKET_ROOM = 107 - len("/pymp-xxxxxxxx/listener-xxxxxxxx")
_SHORT_TMP = "/tmp"


def short_socket_dir() -> None:
    """Give multiprocessing a temporary folder short enough for its sockets when the one
    ``TMPDIR`` names is too long: a private one (``mkdtemp``: mode 0700) in /tmp, removed at
    exit as multiprocessing removes its own. Nothing changes while the default fits, or once
    multiprocessing has chosen its folder."""
    from multiprocessing import process, util

    current: Any = process.current_process()
    config: dict[str, Any] = current._config  # where multiprocessing.util.get_temp_dir looks
    if config.get("tempdir") is not None:
        return
    if len(os.fsencode(tempfile.gettempdir())) <= _SOCKET_ROOM or not os.path.isdir(_SHORT_TMP):
        return
    tempdir = tempfile.mkdtemp(prefix="pymp-", dir=_SHORT_TMP)
    util.Finalize(None, shutil.rmtree, args=(tempdir, True), exitpriority=-100)
    config["tempdir"] = tempdir


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no procfs: no way to see native threads, so never fork
        return False


def fork_server() -> bool:
    """Make a fork of this process the fork server of its body processes, if it is safe here
    (best effort: False leaves it to the stdlib). Call it only where the process holds
    nothing a body process must not inherit."""
    try:
        return _fork_server()
    except Exception as e:  # the stdlib's own server is as good, only slower to start
        logging.getLogger("lakeshore.worker").debug("fork server not forked: %s", e)
        return False


def _fork_server() -> bool:
    import multiprocessing as mp
    from multiprocessing import connection, forkserver, resource_tracker, util

    if "forkserver" not in mp.get_all_start_methods():
        return False
    server: Any = forkserver._forkserver  # the stdlib's own, which its clients use
    if server._forkserver_pid is not None:
        return True  # one is running, forked or not: the stdlib checks it is alive
    if list(inspect.signature(forkserver.main).parameters) != _KNOWN_MAIN:
        return False
    if not _single_threaded():
        return False
    resource_tracker.ensure_running()  # a spawned process: children report to it
    short_socket_dir()
    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        # the worker holds the write end; the server ends at EOF, when the worker is gone
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # else each child would write the worker's unflushed text
                stream.flush()
        try:
            pid = os.fork()
        except OSError:
            os.close(alive_r)
            os.close(alive_w)
            if not util.is_abstract_socket_namespace(address):
                os.unlink(address)
            return False
        if pid == 0:
            _serve(listener.fileno(), alive_r, alive_w)
        os.close(alive_r)
    with server._lock:
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True


def _serve(listener_fd: int, alive_r: int, alive_w: int) -> None:
    """The forked server's whole life; it never returns to the worker's code."""
    from multiprocessing import forkserver

    code = 0
    try:
        os.close(alive_w)
        # as lakeshore.running.preload does for an exec'd server: a signal for the worker's
        # whole process group must not end the one process that sees how its children end
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        forkserver.main(listener_fd, alive_r, [])
    except SystemExit:
        pass  # the worker is gone
    except BaseException:
        code = 1
    finally:
        # never the worker's atexit handlers or buffered output: they are the worker's
        os._exit(code)
