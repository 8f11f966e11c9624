"""Prometheus text served on ``http://127.0.0.1:PORT/metrics``: by ``lakeshore metrics
--serve`` (a census, shared by the scrapes of an interval) and by a worker's
``--metrics-port`` (its own counters, made anew at each scrape: they cost no request).

Only loopback is bound, and only requests addressed to a loopback name are answered, so
nothing here is reachable from another machine or from a web page that points its own host
name at 127.0.0.1 (DNS rebinding). A scraper elsewhere reads it through node_exporter, an
SSH tunnel, or the textfile route instead.
"""

from __future__ import annotations

import hmac
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lakeshore.errors import InvalidArgument, LakeshoreError
from lakeshore.model.metrics import CONTENT_TYPE
from lakeshore.text import inert

__all__ = ["DEFAULT_PORT", "MetricsServer"]

DEFAULT_PORT = 9321
_LOOPBACK_NAMES = ("127.0.0.1", "localhost")
IDLE_TIMEOUT_S = 30.0


class MetricsServer:
    """Serve ``collect()``'s text on ``http://127.0.0.1:port/metrics``; a scrape within
    ``interval_s`` (by ``monotonic``) of the last census gets its copy, and scrapes that
    come while a census runs wait for it, so the store sees one census per interval at
    most. A census that fails answers 503 for the interval, too. ``interval_s=0``: every
    scrape collects (text that costs no request, as a worker's counters).

    Only requests addressed to a loopback name are answered: a web page elsewhere whose
    host name points at 127.0.0.1 gets nothing (DNS rebinding).

    Raises:
        InvalidArgument: a bad interval, or the port cannot be bound (taken, or not a
            port); ``op`` names the command in the message.
    """

    def __init__(
        self,
        collect: Callable[[], str],
        *,
        port: int = DEFAULT_PORT,
        interval_s: float = 10.0,
        op: str = "metrics",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s >= 0:
            raise InvalidArgument(op, "the interval must be >= 0", "e.g. 10 (seconds)")
        self.collect, self.interval_s, self.monotonic = collect, interval_s, monotonic
        self.censuses = 0  # how many were made (the tests count them)
        self._lock = threading.Lock()
        self._copy: tuple[float, int, str] | None = None  # when, status, text
        handler = type("Handler", (_Handler,), {"metrics": self})
        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        except (OSError, OverflowError) as e:  # taken, or not a port at all
            raise InvalidArgument(
                op,
                f"cannot serve on 127.0.0.1:{port}: {e}",
                "pick another port (0: any free one)",
            ) from e
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None
        self._served = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self) -> tuple[int, str]:
        """The status and text of a scrape: the copy, or a new census when it is older
        than the interval."""
        with self._lock:
            copy = self._copy
            if copy is None or self.monotonic() - copy[0] >= self.interval_s:
                self.censuses += 1
                try:
                    copy = (self.monotonic(), HTTPStatus.OK, self.collect())
                except LakeshoreError as e:
                    print(f"lakeshore metrics: {inert(str(e))}", file=sys.stderr, flush=True)
                    copy = (self.monotonic(), HTTPStatus.SERVICE_UNAVAILABLE, f"{e}\n")
                except Exception:  # a defect: kept like a failure, so the interval still holds
                    traceback.print_exc(file=sys.stderr)
                    text = "metrics: the census failed unexpectedly — see the server's stderr\n"
                    copy = (self.monotonic(), HTTPStatus.INTERNAL_SERVER_ERROR, text)
                self._copy = copy
            return copy[1], copy[2]

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="lakeshore-metrics", daemon=True
        )
        self._served = True
        self._thread.start()

    def serve_forever(self) -> None:
        self._served = True
        self.httpd.serve_forever()

    def close(self) -> None:
        """Stop serving and free the port (also when it never served: shutdown() would
        wait forever for a loop that never ran)."""
        if self._served:
            self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    metrics: MetricsServer
    server_version = "lakeshore-metrics"
    sys_version = ""
    # a connection that says nothing for this long is closed: each holds a thread
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is no news

    def _answer(self, status: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        body = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
        if not any(hmac.compare_digest(name, n) for n in (*_LOOPBACK_NAMES, "::1")):
            self._answer(HTTPStatus.MISDIRECTED_REQUEST, "use 127.0.0.1 or localhost\n")
            return
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(HTTPStatus.NOT_FOUND, "lakeshore metrics: see /metrics\n")
            return
        status, text = self.metrics.scrape()
        self._answer(status, text, CONTENT_TYPE if status == HTTPStatus.OK else "text/plain")
