"""``local``: worker processes on the scaler's own machine (a laptop, one big node).

Each worker is a child process in a session of its own, so it outlives a ``--once`` scaler
and a Ctrl-C meant for the scaler. What is alive is kept where the next scaler finds it: one
file per worker, ``<state_dir>/<store id>/<ns>/<queue>/<worker>.pid``, holding its pid (its
output goes beside it, to ``<worker>.log``, unless a log folder is given). A pid counts only
while the process there still carries the worker's name in its command line (on Linux), so a
recycled pid is never taken for a worker.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from lakeshore.errors import ProviderError
from lakeshore.providers.base import Launched, Provider, WorkerSpec, store_id

__all__ = ["LocalProvider", "default_state_dir"]


def _young(path: Path, seconds: float = 30.0) -> bool:
    """The pid file was written in the last ``seconds``: its worker may still be starting."""
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/lakeshore/local``, else ``~/.local/state/lakeshore/local``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return Path(base) / "lakeshore" / "local"


class LocalProvider(Provider):
    """Workers as processes here. ``log_dir`` (default: the state folder) gets one log per
    worker; ``env`` replaces the environment the workers get (default: the scaler's)."""

    kind = "local"

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.log_dir = Path(log_dir) if log_dir else None
        self.env = dict(env) if env is not None else None
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        folder = self.state_dir / store_id(spec.url) / spec.ns / spec.queue
        logs = self.log_dir or folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ProviderError(
                "local launch", f"cannot make {folder}: {e}", "check the --state-dir"
            ) from None
        ids = []
        for _ in range(n):
            name = f"local-{secrets.token_hex(4)}"
            try:
                with open(logs / f"{name}.log", "ab") as log:
                    child = subprocess.Popen(
                        [*spec.argv, "--worker-id", name],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=self.env,
                    )
            except OSError as e:
                raise ProviderError(
                    "local launch", f"cannot start {spec.argv[0]!r}: {e}", "check the command"
                ) from None
            try:
                (folder / f"{name}.pid").write_text(str(child.pid))
            except OSError as e:  # a worker no one can count must not run
                child.kill()
                child.wait()
                raise ProviderError(
                    "local launch", f"cannot write {folder}/{name}.pid: {e}", "check the disk"
                ) from None
            self._children[name] = child
            ids.append(name)
        return ids

    def list(self, tags: Collection[str]) -> list[Launched]:
        alive = []
        for path in self._files():
            store, ns, queue = path.parts[-4:-1]
            name, tag = path.stem, f"lakeshore:{ns}:{queue}:{store}"
            if tag not in tags:
                continue
            ours = name in self._children  # then its end is known, not guessed
            if self._alive(name, path):
                alive.append(Launched(name, tag, "running"))
            elif ours or not _young(path):  # a gone worker's file goes (once not starting)
                with contextlib.suppress(OSError):
                    path.unlink()
        return alive

    def cancel(self, ids: Sequence[str]) -> None:
        wanted = set(ids)
        for path in self._files():
            if path.stem in wanted and self._alive(path.stem, path):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(path.read_text()), signal.SIGTERM)

    def close(self) -> None:
        # reap the children that ended; the rest live on (their files say so)
        for child in self._children.values():
            child.poll()
        self._children.clear()

    def _files(self) -> builtins.list[Path]:
        if not self.state_dir.is_dir():
            return []
        return [p for p in self.state_dir.glob("*/*/*/local-*.pid") if p.is_file()]

    def _alive(self, name: str, path: Path) -> bool:
        child = self._children.get(name)
        if child is not None:
            if child.poll() is None:
                return True
            del self._children[name]  # reaped: the scaler keeps no dead worker's handle
            return False
        try:
            pid = int(path.read_text()[:20])
        except (OSError, ValueError):
            return False
        if pid <= 1:
            return False
        if sys.platform.startswith("linux"):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, IndexError):
                return False
            if stat[0] in ("Z", "X"):
                return False  # ended, not yet reaped
            if not cmdline:  # between fork and exec: a worker still starting
                return _young(path)
            return f"\0{name}\0".encode() in b"\0" + cmdline  # else: a recycled pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
