"""A module that ``lakeshore worker --import`` loads in tests/queue/test_body_processes.py:
it notes which process imported it and holds a file open, and its body reports what a body
process sees of the worker and of its fork server."""

from __future__ import annotations

import json
import os
from pathlib import Path

HELD = "LAKESHORE_TEST_HELD"  # the file this module holds open from its import on

IMPORT_PID = os.getpid()
if HELD in os.environ:
    _held = os.open(os.environ[HELD], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _fds(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return out


def where() -> str:
    """The body process, the process that imported this module in it, its fork server, what
    the server holds open, the worker (the server's parent), and whether the server is a
    fork of the worker."""
    server = os.getppid()
    worker = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    cmdline = Path(f"/proc/{server}/cmdline").read_bytes()
    return json.dumps(
        {
            "body": os.getpid(),
            "imported_in": IMPORT_PID,
            "server": server,
            "server_parent": worker,
            "worker": worker,
            "server_fds": _fds(server),
            "forked": cmdline == Path(f"/proc/{worker}/cmdline").read_bytes(),
        }
    )
