"""The dashboard's HTTP server: the standard library's, a static page and a JSON API.

**Security.** A connection holds one of the server's places only once a request on it has
shown the token (``lakeshore.ui.gate``): until then it waits in a small pool, a few per
client address, and is closed when its first request has not come whole within a few
seconds, or when a newer connection needs its place. The page is read-only unless the
server was started with ``allow_actions``. Without a token the server answers only
requests whose ``Host`` is the loopback address it is bound to (a web page elsewhere
cannot reach it through a name that resolves to 127.0.0.1); with a token (required for
any other address) every request must carry it: the printed URL holds it once, the server
turns it into an ``HttpOnly``, ``SameSite=Strict`` cookie; a script sends it as
``Authorization: Bearer <token>`` instead, which a browser never adds to a cross-site request
by itself (docs/ui.md#the-json-api). Actions are POSTs with a CSRF
token that only the page can read (``/api/session`` answers same-origin JSON; no CORS),
and a foreign ``Origin`` is refused. The page builds everything from the store as text
nodes, and a content security policy allows only its own script: a value holding markup
stays text. Credentials never reach the page: the store is named by its scheme, bucket
and prefix only.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lakeshore import __version__
from lakeshore.dispatch import Dispatch
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    StoreError,
)
from lakeshore.keys import check_id, check_name
from lakeshore.ui.board import BUSY, Board
from lakeshore.ui.gate import Gate

__all__ = ["UiServer", "public_url"]

log = logging.getLogger("lakeshore.ui")

_HEADER = "X-Lakeshore-UI"  # on every API call of the page: a plain cross-site request has none
MAX_CONNECTIONS = 256  # connections let in (their requests showed the token) at once
MAX_WAITING = 64  # connections not let in yet, at once
MAX_WAITING_PER_CLIENT = 16  # of those, from one address
HEADER_DEADLINE_S = 5.0  # from a connection's arrival to its first request, whole, checked
IDLE_TIMEOUT_S = 30.0  # a connection let in that sends nothing this long is closed
MAX_HEAD_BYTES = 64 * 1024  # what a connection may send before it is let in
DOWNLOADS_AT_ONCE = 2  # values held in memory while they are sent
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{8,256}\Z")  # as it goes in a URL and a cookie, unquoted
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_MAX_BODY = 4096
_TOKEN_IN_QUERY = re.compile(r"token=[^&\s\"]*")


def public_url(url: str) -> str:
    """The store URL as the page may show it: scheme, host and path, without a user, a
    password or a query (where options and keys could be)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a bare path, or C:\\...
        return url.split("?", 1)[0]
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class UiServer:
    """Serve the dashboard of ``board`` on ``host:port`` (port 0: any free one).

    ``max_connections`` connections whose requests showed the token are served at once;
    before that, a connection waits among at most ``max_waiting`` (``max_waiting_per_client``
    per address), each closed when its first request has not come whole and been checked
    within ``header_deadline_s`` of its arrival (by ``monotonic``), and the oldest closed
    when a newcomer needs its place. A connection let in is closed after
    ``idle_timeout_s`` of silence.

    Raises:
        InvalidArgument: a non-loopback ``host`` without a token; a bad token or limit.
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        board: Board,
        url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8321,
        token: str | None = None,
        allow_actions: bool = False,
        max_connections: int = MAX_CONNECTIONS,
        max_waiting: int = MAX_WAITING,
        max_waiting_per_client: int = MAX_WAITING_PER_CLIENT,
        header_deadline_s: float = HEADER_DEADLINE_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not is_loopback(host) and not token:
            raise InvalidArgument(
                "ui",
                f"binding to {host} without a token would show the store to anyone on the network",
                "pass --token (or keep the default host 127.0.0.1)",
            )
        if token is not None and not _TOKEN.match(token):
            raise InvalidArgument(
                "ui",
                "the token must be 8 to 256 letters, digits or . _ ~ -",
                "pick another (it goes into a URL and a cookie as it is)",
            )
        self.board = board
        self.store_url = public_url(url)
        self.token = token
        self.allow_actions = allow_actions
        self.csrf = secrets.token_urlsafe(32)
        self._planes: dict[str, Dispatch] = {}
        self._planes_lock = threading.Lock()
        if not idle_timeout_s > 0:
            raise InvalidArgument("ui", "the idle timeout must be positive", "e.g. 30")
        gate = Gate(
            max_connections=max_connections,
            max_waiting=max_waiting,
            max_waiting_per_client=max_waiting_per_client,
            deadline_s=header_deadline_s,
            monotonic=monotonic,
        )
        handler = type("Handler", (_Handler,), {"ui": self, "timeout": idle_timeout_s})
        self.httpd = _Server((host, port), handler, gate, ipv6=":" in host)
        self.downloads = threading.BoundedSemaphore(DOWNLOADS_AT_ONCE)
        self.host = host
        self.port = self.httpd.server_address[1]
        # per port: dashboards of other stores on this host keep their own cookies
        self.cookie = f"lakeshore_ui_{self.port}"
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where to open the page (with the token, when there is one; its characters need
        no quoting)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        base = f"http://{host}:{self.port}/"
        return f"{base}?token={self.token}" if self.token else base

    def start(self) -> None:
        """Serve in a background thread (and start the board's poller)."""
        self.board.start()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="lakeshore-ui-http", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        self.board.start()
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.board.close()
        with self._planes_lock:
            planes, self._planes = list(self._planes.values()), {}
        del planes  # the planes share the board's store, which its owner closes

    def plane(self, ns: str) -> Dispatch:
        with self._planes_lock:
            found = self._planes.get(ns)
            if found is None:
                found = Dispatch(self.store_url, ns, store=self.board.store)
                self._planes[ns] = found
            return found

    def act(self, action: str, ns: str, inv: str) -> dict[str, Any]:
        """Cancel or retry an invocation.

        Raises:
            InvalidArgument: a bad action, name or id. NotFound: no such invocation.
            Conflict: retry of a live invocation.
        """
        check_name(ns, "namespace")
        inv = check_id(inv)
        q = self.plane(ns)
        if action == "cancel":
            done = q.cancel(inv, "cancelled from the dashboard")
            out = {"ok": done, "message": "cancelled" if done else "it had already finished"}
        elif action == "retry":
            attempt = q.retry(inv)
            out = {"ok": True, "message": f"queued again as attempt {attempt}"}
        else:
            raise InvalidArgument("ui", f"no action {action[:40]!r}", "cancel or retry")
        self.board.forget(ns, inv)
        return out


class _Server(ThreadingHTTPServer):
    """A thread per connection, its place kept by a :class:`Gate`: a connection beyond what
    the gate holds is closed at once (a flood of idle connections cannot hold the machine's
    threads), and the waiting ones past their deadline are closed between two accepts."""

    daemon_threads = True
    request_queue_size = 128  # a burst of connections is accepted, not dropped by the kernel

    def __init__(self, address: tuple[str, int], handler: Any, gate: Gate, ipv6: bool) -> None:
        self.gate = gate
        if ipv6:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.gate.arrive(request, str(client_address[0])):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.gate.leave(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.gate.leave(request)  # before the socket is closed: see Gate.leave
            self.shutdown_request(request)

    def service_actions(self) -> None:
        self.gate.sweep()  # serve_forever calls this at least every half second

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that went away mid-answer, or a request too broken to parse: not ours
        log.debug("ui: a connection from %s failed", client_address, exc_info=True)


class _Capped(io.RawIOBase):
    """The socket as the handler reads it: until the connection is let in, at most
    ``limit`` bytes, then the end (a waiting connection's request is never held whole
    when it is larger than any a browser sends)."""

    def __init__(self, raw: Any, limit: int) -> None:
        super().__init__()
        self.raw, self.limit, self.read_so_far = raw, limit, 0
        self.capped = True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        view = memoryview(buffer)
        if self.capped:
            room = self.limit - self.read_so_far
            if room <= 0:
                return 0
            view = view[:room]
        n: int | None = self.raw.readinto(view)
        self.read_so_far += n or 0
        return n

    def exhausted(self) -> bool:
        return self.capped and self.read_so_far >= self.limit

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()


class _Handler(BaseHTTPRequestHandler):
    ui: UiServer
    server_version = "lakeshore-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S  # a connection that sends nothing this long is closed
    server: _Server
    head_limit = MAX_HEAD_BYTES
    _bearer = False  # this request showed the token in an Authorization header

    def setup(self) -> None:
        super().setup()
        self._capped = _Capped(self.rfile.detach(), self.head_limit)
        self.rfile = io.BufferedReader(self._capped)

    def log_message(self, format: str, *args: Any) -> None:
        line = _TOKEN_IN_QUERY.sub("token=…", format % args)  # the log is no place for it
        log.debug("ui: %s %s", self.address_string(), line)

    # -- checks ----------------------------------------------------------------------------

    def _host_ok(self) -> bool:
        if self.ui.token:
            return True  # the token decides; the cookie is bound to the name anyway
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name.strip("[]") if name else "")

    def _token_ok(self, query: dict[str, list[str]]) -> bool | str:
        token = self.ui.token
        if not token:
            return True
        scheme, _, bearer = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(bearer.encode(), token.encode()):
            return "bearer"
        given = query.get("token", [""])[0]
        if given and hmac.compare_digest(given.encode(), token.encode()):
            return "set"
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.ui.cookie and hmac.compare_digest(value.encode(), token.encode()):
                return True
        return False

    # -- answers ---------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        extra: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        """Answer ``body`` (to a HEAD, its headers only: ``length`` stands for a body that
        was not read)."""
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.send_header("Content-Security-Policy", _POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        if isinstance(data, dict) and data.get("busy"):
            status = HTTPStatus.TOO_MANY_REQUESTS
        body = json.dumps(data, ensure_ascii=True, allow_nan=False, default=str).encode()
        self._send(status, body, "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _guard(self) -> dict[str, list[str]] | None:
        """The query, or None when the request was refused (and answered). A request that
        passes lets its connection in (see :class:`Gate`); a refused one closes it."""
        asked = self.close_connection
        self.close_connection = True  # a refusal closes: no waiting place is kept for a retry
        query = self._checked()
        if query is None:
            return None
        if not self.server.gate.let_in(self.request):
            self._error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"ui: {self.server.gate.max_connections} connections are open — close some tabs",
            )
            return None
        self._capped.capped = False
        self.close_connection = asked
        return query

    def _checked(self) -> dict[str, list[str]] | None:
        if self._capped.exhausted():
            self._error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "ui: the request is too large")
            return None
        if not self._host_ok():
            self._error(HTTPStatus.MISDIRECTED_REQUEST, "ui: unexpected Host — use 127.0.0.1")
            return None
        try:
            query = parse_qs(urlsplit(self.path).query, max_num_fields=16)
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, "ui: too many query fields")
            return None
        ok = self._token_ok(query)
        if ok == "set":
            cookie = f"{self.ui.cookie}={self.ui.token}; HttpOnly; SameSite=Strict; Path=/"
            self._send(
                HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie}
            )
            return None
        if not ok:
            self._error(
                HTTPStatus.UNAUTHORIZED,
                "ui: this dashboard needs its token — open the URL `lakeshore ui` printed, "
                "or send it as `Authorization: Bearer <token>`",
            )
            return None
        self._bearer = ok == "bearer"
        return query

    def _download(self, ns: str, inv: str, what: str) -> None:
        """Send a value, at most ``DOWNLOADS_AT_ONCE`` at a time: each is held in memory
        until the client has taken it. A HEAD reads the record, never the value."""
        if self.command == "HEAD":
            about = self.ui.board.download_size(ns, inv, what)
            if about is None:
                self._json(HTTPStatus.TOO_MANY_REQUESTS, BUSY)
                return
            size, name = about
            self._send(HTTPStatus.OK, b"", "application/octet-stream", _attachment(name), size)
            return
        if not self.ui.downloads.acquire(blocking=False):
            self._json(HTTPStatus.TOO_MANY_REQUESTS, {**BUSY, "error": "ui: downloads busy"})
            return
        try:
            got = self.ui.board.download(ns, inv, what)
            if got is None:
                self._json(HTTPStatus.TOO_MANY_REQUESTS, BUSY)
                return
            data, name = got
            self._send(HTTPStatus.OK, data, "application/octet-stream", _attachment(name))
        finally:
            self.ui.downloads.release()

    def _from_the_page(self, path: str) -> bool:
        """An API call made by the page: it sends ``X-Lakeshore-UI`` (a header a plain
        cross-site request cannot carry, and a cross-site fetch could only send after a
        preflight this server never grants); a download link, which cannot, must be
        followed from the same origin (browsers say so in ``Sec-Fetch-Site``)."""
        if self._bearer:
            # a script's request: a browser adds no Authorization header to a cross-site
            # request of its own, and a page's fetch could only after a preflight
            return True
        if path == "/api/download":
            return self.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
        return self.headers.get(_HEADER) == "1"

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        query = self._guard()
        if query is None:
            return
        path = urlsplit(self.path).path
        if path in _STATIC:
            name, ctype = _STATIC[path]
            body = resources.files("lakeshore.ui").joinpath("static", name).read_bytes()
            self._send(HTTPStatus.OK, body, ctype)
            return

        def arg(name: str, default: str = "") -> str:
            return query.get(name, [default])[0]

        if path.startswith("/api/") and not self._from_the_page(path):
            self._error(HTTPStatus.FORBIDDEN, "ui: not a request of the dashboard's page")
            return

        board = self.ui.board
        try:
            if path == "/api/session":
                self._json(
                    HTTPStatus.OK,
                    {
                        "csrf": self.ui.csrf,
                        "actions": self.ui.allow_actions,
                        "store": self.ui.store_url,
                        "version": __version__,
                        "interval_s": board.interval_s,
                        "live_s": board.live_s,
                    },
                )
            elif path == "/api/overview":
                self._json(HTTPStatus.OK, board.overview())
            elif path == "/api/queue":
                data = board.queue_page(
                    arg("ns", "default"),
                    arg("queue", "default"),
                    state=arg("state") or None,
                    fn=arg("fn") or None,
                    before=arg("before") or None,
                    limit=_int(arg("limit", "25")),
                )
                self._json(HTTPStatus.OK, data)
            elif path == "/api/invocation":
                self._json(HTTPStatus.OK, board.invocation(arg("ns", "default"), arg("id")))
            elif path == "/api/frames":
                data = board.frames(arg("ns", "default"), arg("id"), _int(arg("after", "-1")))
                self._json(HTTPStatus.OK, data)
            elif path == "/api/download":
                self._download(arg("ns", "default"), arg("id"), arg("what"))
            else:
                self._error(HTTPStatus.NOT_FOUND, "ui: no such page")
        except LakeshoreError as e:
            self._error(_status(e), str(e))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: nobody to answer
        except Exception:  # one bad request never stops the server
            log.exception("ui: GET %s failed", path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "ui: internal error — see the log")

    def do_POST(self) -> None:
        # read the body before anything can refuse the request: on a kept-alive connection,
        # bytes left unread would be taken for the next request
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "ui: the request body is too large")
            return
        raw = self.rfile.read(length)
        query = self._guard()
        if query is None:
            return
        path = urlsplit(self.path).path
        origin = self.headers.get("Origin")
        host = self.headers.get("Host", "")
        if origin is not None and urlsplit(origin).netloc != host:
            self._error(HTTPStatus.FORBIDDEN, "ui: a request from another site — refused")
            return
        given = self.headers.get("X-CSRF-Token", "")
        if not given or not hmac.compare_digest(given.encode(), self.ui.csrf.encode()):
            self._error(HTTPStatus.FORBIDDEN, "ui: missing or wrong CSRF token — reload the page")
            return
        if not self.ui.allow_actions:
            self._error(
                HTTPStatus.FORBIDDEN,
                "ui: actions are off — restart `lakeshore ui` with --allow-actions to allow them",
            )
            return
        if path not in ("/api/cancel", "/api/retry"):
            self._error(HTTPStatus.NOT_FOUND, "ui: no such action")
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise InvalidArgument("ui", "the request body is no JSON object", "send {ns, id}")
            action = path.rsplit("/", 1)[1]
            self._json(HTTPStatus.OK, self.ui.act(action, str(body.get("ns")), str(body.get("id"))))
        except (ValueError, UnicodeDecodeError) as e:
            if isinstance(e, LakeshoreError):
                self._error(_status(e), str(e))
            else:
                self._error(HTTPStatus.BAD_REQUEST, "ui: the request body is no JSON")
        except LakeshoreError as e:
            self._error(_status(e), str(e))
        except Exception:
            log.exception("ui: POST %s failed", path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "ui: internal error — see the log")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument("ui", f"{text[:20]!r} is not a number", "") from None


def _status(e: LakeshoreError) -> int:
    if isinstance(e, NotFound):
        return HTTPStatus.NOT_FOUND
    if isinstance(e, InvalidArgument):
        return HTTPStatus.BAD_REQUEST
    if isinstance(e, Conflict):
        return HTTPStatus.CONFLICT
    if isinstance(e, StoreError):
        return HTTPStatus.BAD_GATEWAY
    return HTTPStatus.INTERNAL_SERVER_ERROR


def _attachment(name: str) -> dict[str, str]:
    """The header that makes a browser save a download as ``name``."""
    return {"Content-Disposition": f'attachment; filename="{name}"'}
