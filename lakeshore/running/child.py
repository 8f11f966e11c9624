"""Process isolation: each worker slot keeps one child process that runs bodies, one at a time.

A child starts when its slot first needs it and serves attempt after attempt, so ``on_start``
runs once per child. It is forked from multiprocessing's fork server where there is one (in
milliseconds; a new interpreter cost 0.15 s of CPU a child), else spawned. The server holds
nothing of the worker's: a child imports the worker's script and the body's module itself, in
the worker's working directory, and its hooks and bodies see the worker's environment as of
the child's start (the script's import sees the server's). Stopping a body kills the child.

The child never touches the queue's store: yields, output and the outcome go to the parent
over a pipe, errors as text. Before each batch of file uploads it asks the parent to fence
them (:meth:`lakeshore.running.attempt.Attempt.fence`) and uploads only on ``ok``. Messages,
child to parent: ``ready``, ``start_failed``, ``frame``, ``log``, ``fence``, ``ok``,
``error``, ``final`` (no retry would mend it), ``stopped``; parent to child: ``call``,
``fence`` (``ok``, ``lost`` or ``error``), ``stop``. See docs/protocol.md#execution-and-isolation.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakeshore import codec, tracing
from lakeshore.errors import (
    HookFailed,
    InvalidArgument,
    LakeshoreError,
    Stopped,
    StoreUnavailable,
    UnknownFunction,
    Unsendable,
)
from lakeshore.files.root import discard_staging
from lakeshore.model.record import Record
from lakeshore.running.bodies import BodyKind, Declared, import_ref
from lakeshore.running.call import (
    POLL_S,
    Outcome,
    RunSpec,
    Verdict,
    body_error,
    call_body,
    error_of,
    unpickle,
    unsendable_error,
)
from lakeshore.running.logs import Sink, capture
from lakeshore.running.zygote import short_socket_dir

__all__ = [
    "BodyCall",
    "ChildProcess",
    "Hooks",
    "child_can_import",
    "refuse_script_rerun",
    "warm_up",
]

_PROCESS_NAME = "lakeshore-body"
# The exit code of a child that found its worker's script running again inside it: a script
# without a __main__ guard, re-imported by spawn, submitting or starting a worker at import.
_SCRIPT_RERAN = 78
_GUARD_FIX = (
    'guard the script\'s work with if __name__ == "__main__":, or run the worker with '
    'isolation="thread"'
)
# True once this process serves bodies for a worker: what it runs after that is a body's
# own doing, not its worker's script re-imported by spawn. One fact about the process.
_serving = False


def refuse_script_rerun(op: str) -> None:
    """Stop a body process that is re-importing its worker's script (spawn does, to start
    it) when that script submits or starts a worker at import: it would submit everything
    again and start workers inside workers. Says what to do on stderr, in one line, and ends
    the process with an exit code the worker recognises."""
    # spawn names the child before it re-imports the script (and before parent_process())
    if _serving or mp.current_process().name != _PROCESS_NAME:
        return
    print(
        f"lakeshore: {op} ran again in a worker's body process, which re-imports the script "
        f"that started the worker — {_GUARD_FIX}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(_SCRIPT_RERAN)


def _main_has_no_source() -> bool:
    """``__main__`` came from nowhere a child could import it from: ``python -c``, a REPL,
    a notebook (no file, no module spec)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__spec__", None) is None and not getattr(main, "__file__", None)


def child_can_import(ref: str, pickled: bytes | None) -> bool:
    """Whether a body process could load the function ``ref`` names: by unpickling it, or
    by importing its module, which a ``__main__`` without a source does not allow."""
    return pickled is not None or not (ref.startswith("__main__:") and _main_has_no_source())


def _main_script_missing() -> str | None:
    """The script spawn would re-import in a child, when that cannot work (read from stdin:
    there is no file to import it from)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and path and not os.path.isfile(path):
        return str(path)
    return None


@dataclass(frozen=True)
class Hooks:
    """Worker lifecycle hooks: ``on_start()`` once per process that runs bodies, before its
    first attempt; ``before_job(record)`` before every attempt, in the process and context of the
    body; ``on_stop()`` when that process shuts down in order (best effort: not after a
    kill). Hooks are module-level functions (a child process imports them by reference)."""

    on_start: Callable[[], Any] | None = None
    before_job: Callable[[Record], Any] | None = None
    on_stop: Callable[[], Any] | None = None

    @classmethod
    def of(cls, on_start: Any = None, before_job: Any = None, on_stop: Any = None) -> Hooks:
        """Hooks from callables or ``"module:function"`` references.

        Raises:
            InvalidArgument: a reference cannot be imported, or a hook is not callable.
        """

        def load(hook: Any, name: str) -> Any:
            if hook is None or callable(hook):
                return hook
            if isinstance(hook, str):
                try:
                    return import_ref(hook)  # the operator's own: may import anything
                except UnknownFunction as e:
                    raise InvalidArgument(f"worker hook {name}", e.what, e.todo) from None
            raise InvalidArgument(
                f"worker hook {name}", f"{hook!r} is not callable", "pass 'module:function'"
            )

        return cls(
            load(on_start, "on_start"), load(before_job, "before_job"), load(on_stop, "on_stop")
        )


@dataclass(frozen=True)
class BodyCall:
    """One attempt, as sent to a child (picklable). ``approved``: the worker process
    declared ``ref`` a body (or accepts pickles); a child never decides that on its own."""

    ref: str
    fn_pickle: bytes | None
    kind: BodyKind
    payload: bytes
    spec: RunSpec | None
    record: Record
    approved: bool = False
    trace: tuple[str, str] = ("", "")  # the worker's run span, which the body's spans join


def _serve(conn: Any, hooks: Hooks, env: dict[str, str] | None = None) -> None:
    """The child's main loop; ``env``: the worker's environment, for hooks and bodies."""
    global _serving
    _serving = True
    if env is not None and env != os.environ:
        os.environ.clear()
        os.environ.update(env)
    # Ctrl-C and a cluster's SIGTERM reach the whole process group; stopping a body is the
    # worker's decision (finish within the grace, else release), so the child ignores them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):  # the fork server ignores it; a body gets the default
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    logging.getLogger().setLevel(logging.INFO)  # a body's INFO records are captured too
    lock = threading.Lock()  # the body's thread and a logging thread may both send

    def send(msg: tuple[Any, ...]) -> None:
        with lock:
            conn.send(msg)

    def fence() -> bool:
        """Ask the worker whether the attempt still holds its lease; wait for the answer
        (only this thread reads the pipe while a body runs)."""
        send(("fence",))
        try:
            answer = conn.recv()
        except (EOFError, OSError):
            return False  # the worker is gone: its lease will expire, publish nothing
        if answer[:2] == ("fence", "ok"):
            return True
        if answer[:2] == ("fence", "error"):
            raise StoreUnavailable(*answer[2:5])
        return False

    try:
        if hooks.on_start is not None:
            hooks.on_start()
    except BaseException as e:
        send(("start_failed", error_of(e)))
        return
    send(("ready",))
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] != "call":
                return
            call: BodyCall = msg[1]
            with capture(lambda text: send(("log", text))):
                try:
                    if hooks.before_job is not None:
                        hooks.before_job(call.record)
                    if not call.approved:
                        raise UnknownFunction(
                            f"load {call.ref[:120]!r}",
                            "the worker process did not approve this body; nothing was "
                            "imported or called",
                            "send bodies to a child only after lakeshore.running.attempt._load",
                        )
                    target = (
                        unpickle(call.fn_pickle)
                        if call.fn_pickle is not None
                        else import_ref(call.ref)  # approved by the worker process
                    )
                    fn = target.fn if isinstance(target, Declared) else target
                    args, kwargs = codec.decode_call(call.payload, "arguments")

                    def emit(data: bytes) -> None:
                        send(("frame", data))

                    with tracing.continued(*call.trace):
                        data = call_body(
                            fn,
                            call.kind,
                            tuple(args),
                            kwargs,
                            threading.Event(),
                            emit,
                            call.spec,
                            True,
                            fence,
                        )
                    send(("ok", data))
                except Stopped:
                    send(("stopped",))
                except Unsendable as e:
                    send(("final", unsendable_error(e)))
                except BaseException as e:
                    # the class names travel with the error: the retry rule is the parent's
                    failed = body_error(e)
                    send(("final" if failed.final else "error", failed.error, failed.kinds))
    finally:
        if hooks.on_stop is not None:
            with contextlib.suppress(BaseException):  # best effort: the process is ending
                hooks.on_stop()
        conn.close()


def _context() -> Any:
    """Where body processes come from: the fork server, preloaded with this module (and so
    lakeshore), where the platform has one; else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    short_socket_dir()  # before the stdlib's server makes its socket
    ctx = mp.get_context("forkserver")
    # only what a server that is not running yet will import; the worker's __main__ is not
    # among them (the stdlib's default): each child imports it, as a spawned one would
    ctx.set_forkserver_preload(["lakeshore.running.preload"])
    return ctx


def warm_up() -> None:
    """Start the fork server in the background, so that the first attempts of a worker's
    slots do not wait for it (best effort: the first child starts it otherwise)."""
    if "forkserver" not in mp.get_all_start_methods():
        return

    def start() -> None:
        try:
            _context()
            from multiprocessing import forkserver

            forkserver.ensure_running()
        except Exception as e:  # the first child will try again, and say what is wrong
            logging.getLogger("lakeshore.worker").debug("fork server not started: %s", e)

    threading.Thread(target=start, name="lakeshore-forkserver", daemon=True).start()


class ChildProcess:
    """The child of one worker slot."""

    def __init__(self, hooks: Hooks, signalled: Callable[[], bool] = lambda: False) -> None:
        self.hooks = hooks
        # a SIGTERM/SIGINT reached the worker too: a child ended by one was interrupted by a
        # signal for the whole process group, not failed (else it died like any other way)
        self.signalled = signalled
        self.proc: Any = None
        self.conn: Any = None
        self.starts = 0
        self.last_exit: int | None = None
        self.lost_server = False  # the last start failed because the fork server died

    def _start(self, stop: threading.Event) -> bool:
        missing = _main_script_missing()
        if missing is not None:
            raise HookFailed(
                "worker body process",
                f"a body's process would re-import the script {missing}, which is no file "
                "(a script read from stdin)",
                'save the script as a file and run that, or run the worker with isolation="thread"',
            )
        ctx = _context()
        self.lost_server = False
        parent, child = ctx.Pipe(duplex=True)
        # the environment as the worker has it now: a forked child would otherwise have
        # the fork server's, from when it started (the working directory travels anyway)
        self.proc = ctx.Process(
            target=_serve,
            args=(child, self.hooks, dict(os.environ)),
            name=_PROCESS_NAME,
            daemon=True,
        )
        try:
            self.proc.start()
        except BaseException:  # no process (no fork server): nothing to stop or wait for
            self.proc = None
            parent.close()
            raise
        finally:
            child.close()
        self.conn = parent
        self.starts += 1
        while not parent.poll(POLL_S):  # on_start may take long: loading a model, say
            if stop.is_set() or not self.proc.is_alive():
                self.last_exit = self.proc.exitcode
                self.lost_server = self._orphaned()
                self.kill()
                return self._check_script_reran()
        try:
            msg = parent.recv()
        except EOFError:
            self.proc.join(5)
            self.last_exit = self.proc.exitcode
            self.kill()
            return self._check_script_reran()
        if msg[0] == "start_failed":
            self.kill()
            err = msg[1]
            raise HookFailed(
                "worker on_start",
                f"{err['type']}: {err['message']}",
                "fix the hook; the worker stopped without running an attempt",
                traceback=err.get("traceback", ""),
            )
        return True

    def _check_script_reran(self) -> bool:
        """False (the child did not start), unless it ended because the worker's script ran
        again inside it: that would happen to every child, so the worker must stop.

        Raises:
            HookFailed: the child found the worker's script submitting or starting a worker.
        """
        # 78 means a rerun only where spawn re-imports a script; elsewhere (an on_start hook's
        # library, say) it is just how that child ended
        if self.last_exit == _SCRIPT_RERAN and not _main_has_no_source():
            raise HookFailed(
                "worker body process",
                "the script that started this worker ran again in the body's process (spawn "
                "re-imports it) and submitted or started a worker there",
                _GUARD_FIX,
            ) from None
        return False

    def run(
        self,
        call: BodyCall,
        stop: threading.Event,
        emit_encoded: Callable[[bytes], None],
        log: Sink | None,
        started: Callable[[], None] | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> Outcome:
        """Run one attempt's body in the child; kill the child when ``stop`` fires. ``started`` is
        called once the child is ready and the body is handed over (the body's clock).
        ``fence`` answers the child's requests to publish files (none: always yes).

        Raises:
            HookFailed: a fresh child's ``on_start`` raised.
        """
        if (self.proc is None or not self.proc.is_alive()) and not self._start(stop):
            if stop.is_set() or self._interrupted(self.last_exit):
                return Outcome(Verdict.STOPPED)
            if self.lost_server:
                return Outcome(Verdict.RELEASE)
            return _died(self.last_exit)
        try:
            self.conn.send(("call", call))
            if started is not None:
                started()
            # A child told not to publish (lease lost) ends the body by itself at once: give it
            # a moment to say so, and keep it for the next attempt rather than start a new one.
            refused_at: float | None = None
            while True:
                if self.conn.poll(POLL_S):
                    tag, *rest = self.conn.recv()
                    if tag == "fence":
                        answer = self._fence(fence)
                        if answer[1] == "lost":
                            refused_at = time.monotonic()
                        self.conn.send(answer)
                    elif tag == "frame":
                        try:
                            emit_encoded(rest[0])
                        except BaseException as e:
                            self._kill_during(call)
                            # as in a thread, where the body meets this error at its yield
                            return body_error(e)
                    elif tag == "log":
                        if log is not None:
                            with contextlib.suppress(Exception):  # output is best effort
                                log(rest[0])
                    elif tag == "ok":
                        return Outcome(Verdict.OK, value=rest[0])
                    elif tag == "stopped":
                        return Outcome(Verdict.STOPPED)
                    else:  # "error", or "final": an error no retry would mend
                        kinds = tuple(rest[1]) if len(rest) > 1 else ()
                        return Outcome(
                            Verdict.ERROR, error=rest[0], final=tag == "final", kinds=kinds
                        )
                elif stop.is_set() and (
                    refused_at is None or time.monotonic() - refused_at > _WIND_UP_S
                ):
                    self._kill_during(call)
                    return Outcome(Verdict.STOPPED)
                elif not self.proc.is_alive() and not self.conn.poll():
                    return self._died_during(call)
        except (EOFError, OSError):
            return self._died_during(call)

    @staticmethod
    def _fence(fence: Callable[[], bool] | None) -> tuple[str, ...]:
        if fence is None:
            return ("fence", "ok")
        try:
            return ("fence", "ok" if fence() else "lost")
        except LakeshoreError as e:  # the store failed or refused: whether it holds is unknown
            return ("fence", "error", e.op, e.what, e.todo)

    def _died_during(self, call: BodyCall) -> Outcome:
        """The child ended without answering. Killed by SIGTERM/SIGINT — a signal for the
        whole process group (Ctrl-C, scancel) that reached it before it could ignore it —
        the attempt was interrupted, not failed: the worker hands it back. So it is when
        the fork server was lost (killed) while the child still ran: the child is killed
        (it would run on unseen) and the attempt handed back."""
        self.proc.join(5)
        code = self.proc.exitcode
        orphaned = self._orphaned()
        self._kill_during(call)
        if orphaned:
            return Outcome(Verdict.RELEASE)
        return Outcome(Verdict.STOPPED) if self._interrupted(code) else _died(code)

    def _orphaned(self) -> bool:
        """The child's process looks ended, yet it still holds its end of the pipe: its fork
        server died (multiprocessing then reports exit code 255) and the child runs on."""
        if self.proc is None or self.conn is None or self.proc.exitcode != _SERVER_LOST:
            return False
        try:
            while self.conn.poll(0):  # what it sent before: it is being killed anyway
                self.conn.recv()
        except (EOFError, OSError):
            return False  # it closed its end: it did end
        return True

    def _interrupted(self, code: int | None) -> bool:
        return code in _GROUP_SIGNALS and self.signalled()

    def _kill_during(self, call: BodyCall) -> None:
        """Kill the child mid-attempt, and remove what it staged (it cannot clean up now)."""
        self.kill()
        if call.spec is not None:
            discard_staging(call.spec.root, call.spec.staging_name)

    def kill_now(self) -> None:
        """Kill the child without waiting (from a signal handler, before the worker exits)."""
        proc = self.proc
        if proc is not None and proc.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            elif self._orphaned():  # by pid: the pipe it holds shows it still runs
                with contextlib.suppress(OSError):
                    os.kill(self.proc.pid, signal.SIGKILL)
            if self.proc.pid is not None:  # started: it has an end to wait for
                self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child in order (its ``on_stop`` runs), or kill it after ``timeout``."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(("stop",))
                self.proc.join(timeout)
            except (OSError, EOFError):
                pass
        self.kill()


_GROUP_SIGNALS = (-signal.SIGTERM, -signal.SIGINT)
_SERVER_LOST = 255  # multiprocessing's exit code for a forked child whose server is gone
_WIND_UP_S = 5.0  # how long a child refused a publish may take to report it stopped


def _died(code: int | None) -> Outcome:
    return Outcome(
        Verdict.ERROR,
        error={
            "type": "WorkerChildDied",
            "message": f"the body's process exited with code {code} before answering",
            "traceback": "",
        },
    )
