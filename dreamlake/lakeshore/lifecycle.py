"""Upstream's lifecycle hooks: lists of functions the author runs at its own moments.

Upstream's worker calls none of them, and neither does this one; lakeshore's worker has its
own hooks (``run_worker(on_start=, before_job=, on_stop=)``). The state is this module's,
per process, as upstream's is.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "DRAINING",
    "HOST_KEY_ENV",
    "READY",
    "SETUP",
    "host_key",
    "on_host_setup",
    "on_run_setup",
    "on_shutdown",
    "phase",
    "reset",
    "run_host_setup_hooks",
    "run_run_setup_hooks",
    "run_shutdown_hooks",
    "set_host_key",
]

F = TypeVar("F", bound=Callable[..., Any])
SETUP, READY, DRAINING = "setup", "ready", "draining"
HOST_KEY_ENV = "LAKESHORE_HOST_KEY"
log = logging.getLogger("dreamlake.lakeshore.lifecycle")


class _Hooks:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.host: list[Callable[[], Any]] = []
        self.run: list[Callable[[], Any]] = []
        self.shutdown: list[Callable[[], Any]] = []
        self.phase = SETUP
        self.host_done = False
        self.shutdown_done = False
        self.key: str | None = None


_hooks = _Hooks()


def on_host_setup(fn: F) -> F:
    """Register ``fn`` to run once per process (``run_host_setup_hooks``)."""
    _hooks.host.append(fn)
    return fn


def on_run_setup(fn: F) -> F:
    """Register ``fn`` to run at every ``run_run_setup_hooks``."""
    _hooks.run.append(fn)
    return fn


def on_shutdown(fn: F) -> F:
    """Register ``fn`` for ``run_shutdown_hooks`` (best effort)."""
    _hooks.shutdown.append(fn)
    return fn


def phase() -> str:
    """``setup``, ``ready`` or ``draining``."""
    return _hooks.phase


def host_key() -> str | None:
    """The key set by ``set_host_key``, else ``$LAKESHORE_HOST_KEY``, else None."""
    return _hooks.key if _hooks.key is not None else os.environ.get(HOST_KEY_ENV)


def set_host_key(key: str | None) -> None:
    """Set the host key this process reports (None: back to ``$LAKESHORE_HOST_KEY``)."""
    _hooks.key = key


def run_host_setup_hooks(*, force: bool = False) -> None:
    """Run the host-setup hooks once (again with ``force``); the phase becomes ``ready``."""
    with _hooks.lock:
        if _hooks.host_done and not force:
            return
        for fn in list(_hooks.host):
            fn()
        _hooks.host_done, _hooks.phase = True, READY


def run_run_setup_hooks() -> None:
    """Run the run-setup hooks (every call); a hook that raises stops the rest."""
    for fn in list(_hooks.run):
        fn()


def run_shutdown_hooks(*, force: bool = False) -> None:
    """Run the shutdown hooks once; a hook that raises is logged and the others still run."""
    with _hooks.lock:
        if _hooks.shutdown_done and not force:
            return
        _hooks.phase = DRAINING
        for fn in list(_hooks.shutdown):
            try:
                fn()
            except Exception:
                log.exception("shutdown hook %r raised", fn)
        _hooks.shutdown_done = True


def reset() -> None:
    """Forget every hook and the host key; back to ``setup`` (for tests)."""
    global _hooks
    _hooks = _Hooks()
