"""A fault-injecting S3 proxy for tests: boto3 → proxy (127.0.0.1) → SeaweedFS.

Each request is classified by kind — ``get``, ``head``, ``list``, ``put`` (plain),
``put_create`` (If-None-Match), ``put_match`` (If-Match), ``delete`` — and, with the
probabilities of the plan for its kind, gets one of these faults:

``slowdown``  503 SlowDown, not forwarded.
``error``     500 InternalError, not forwarded.
``reset``     the connection is cut before anything is forwarded.
``delay``     forwarded after a pause (``delay_s``).
``drop``      forwarded, the response read — then the connection is cut, so the client
              never learns the outcome: a retried conditional write meets its own write
              (the ambiguous 412 that ``S3Store`` resolves by reading the object back).

Deterministic with a seed: the decision for a request is a hash of the seed, the request's
method, path, query and body, and how many times that same request was seen before — so a
retry is a new draw, and the same run of requests gets the same faults whatever the thread
timing. Counts of every kind and fault are kept for the figures.
"""

from __future__ import annotations

import hashlib
import http.client
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

FAULTS = ("slowdown", "error", "reset", "delay", "drop")
KINDS = ("get", "head", "list", "put", "put_create", "put_match", "delete")

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass
class Plan:
    """Fault probabilities per request kind: ``{"put_match": {"drop": 0.05}, ...}``.
    ``"*"`` applies to every kind without its own entry."""

    faults: dict[str, dict[str, float]] = field(default_factory=dict)
    delay_s: float = 0.2
    enabled: bool = True

    def for_kind(self, kind: str) -> dict[str, float]:
        return self.faults.get(kind, self.faults.get("*", {}))

    @classmethod
    def uniform(cls, rate: float, **kw: Any) -> Plan:
        """``rate`` of all requests faulted, spread evenly over the five faults."""
        return cls({"*": {f: rate / len(FAULTS) for f in FAULTS}}, **kw)


def classify(method: str, query: str, headers: Any) -> str:
    if method == "GET":
        return "list" if "list-type" in query or query.startswith("prefix") else "get"
    if method == "HEAD":
        return "head"
    if method == "DELETE":
        return "delete"
    if method == "PUT":
        if headers.get("If-None-Match"):
            return "put_create"
        if headers.get("If-Match"):
            return "put_match"
        return "put"
    return method.lower()


class FaultProxy:
    """The proxy. ``endpoint`` is what boto3 should use; ``stats`` counts what happened."""

    def __init__(self, upstream: str, plan: Plan | None = None, seed: int = 0) -> None:
        self.upstream = urlsplit(upstream)
        self.plan = plan or Plan()
        self.seed = seed
        self.stats: Counter[str] = Counter()
        self._seen: Counter[bytes] = Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *a: None  # type: ignore[method-assign]  # cut on purpose
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- deciding -------------------------------------------------------------------------

    def _decide(self, kind: str, ident: bytes) -> str | None:
        if not self.plan.enabled:
            return None
        with self._lock:
            self._seen[ident] += 1
            nth = self._seen[ident]
        digest = hashlib.sha256(struct.pack(">QQ", self.seed, nth) + ident).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for fault, p in self.plan.for_kind(kind).items():
            edge += p
            if draw < edge:
                return fault
        return None

    # -- serving --------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        query = h.path.partition("?")[2]
        kind = classify(h.command, query, h.headers)
        ident = f"{h.command} {h.path}\n".encode() + hashlib.sha256(body).digest()
        fault = self._decide(kind, ident)
        with self._lock:
            self.stats[f"{kind}"] += 1
            self.stats[f"{kind}:{fault or 'ok'}"] += 1
            if fault:
                self.stats[f"fault:{fault}"] += 1
        if fault == "slowdown":
            return self._reply(h, 503, _SLOWDOWN)
        if fault == "error":
            return self._reply(h, 500, _INTERNAL)
        if fault == "reset":
            return self._cut(h)
        if fault == "delay":
            time.sleep(self.plan.delay_s)
        status, headers, data = self._forward(h, body)
        if fault == "drop":
            return self._cut(h)
        h.send_response(status)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, Any, bytes]:
        conn = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=60
        )
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() != "connection"}
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _cut(h: BaseHTTPRequestHandler) -> None:
        """Reset the connection: the client sees it die with no response."""
        h.close_connection = True
        try:
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
        except OSError:
            pass
