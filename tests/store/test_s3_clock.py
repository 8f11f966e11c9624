"""The S3 store clock against wrong ``Date`` headers (issue 31, finding 6): samples are fed
to the response hook with an injected monotonic clock, so every scenario is exact and
instant. A minority of responses from a node whose clock is off, ahead or behind, must not
move ``now()``; a step of the server's own clock (every later response) is still followed
within the sample window."""

from __future__ import annotations

from email.utils import formatdate
from typing import Any

import boto3
import pytest
from botocore.config import Config

from lakeshore.store.s3 import _CLOCK_WINDOW_S, S3Store

START = 100.0  # monotonic ticks when the scenario begins
SERVER = 1_800_000_000.3  # the server's true time then (mid-second: Date truncates it)
EVERY = 0.25  # seconds between responses


class _Response:
    def __init__(self, server_time: float) -> None:
        self.headers = {"Date": formatdate(server_time, usegmt=True)}  # truncated to the second


class _Server:
    """A server whose responses reach the store's Date hook; ``step`` moves its own clock."""

    def __init__(self) -> None:
        self.ticks = START
        self.step = 0.0
        client: Any = boto3.client(
            "s3",
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="y",
            config=Config(retries={"total_max_attempts": 1}),
        )
        self.store = S3Store("bkt", "pre", client=client, ticks=lambda: self.ticks)

    def truth(self) -> float:
        return SERVER + self.ticks - START + self.step

    def respond(self, wrong_by: float = 0.0, latency: float = 0.05) -> None:
        """One response, its Date written ``latency`` before the hook saw it, by a node whose
        clock is ``wrong_by`` off the server's."""
        self.store._sample_clock(http_response=_Response(self.truth() - latency + wrong_by))

    def run(self, seconds: float, wrong: list[float] | None = None) -> list[float]:
        """Respond every EVERY seconds, node after node (``wrong``: each node's error), and
        return how far ``now()`` was from the server's true time after each response."""
        nodes = wrong or [0.0]
        errors = []
        for i in range(round(seconds / EVERY)):
            self.ticks += EVERY
            self.respond(wrong_by=nodes[i % len(nodes)])
            errors.append(self.store.now() - self.truth())
        return errors


def test_one_response_from_a_node_40_s_ahead_does_not_move_the_clock() -> None:
    server = _Server()
    server.run(5.0)
    server.ticks += EVERY
    server.respond(wrong_by=40.0)  # one node's clock is 40 s ahead
    assert server.store.now() - server.truth() < 1.0
    # and for as long as that sample counts, newer honest ones arriving beside it
    errors = server.run(_CLOCK_WINDOW_S + 1.0)
    assert max(errors) < 1.0
    assert min(errors) > -1.5  # honest samples only ever err late, by a second at most


@pytest.mark.parametrize("nodes", [[0.0, 40.0, 0.0], [0.0, 0.0, 40.0, 0.0, -40.0]])
def test_a_minority_of_nodes_with_wrong_clocks_does_not_move_the_clock(
    nodes: list[float],
) -> None:
    server = _Server()
    errors = server.run(3 * _CLOCK_WINDOW_S, wrong=nodes)
    assert max(errors) < 1.0
    assert min(errors[8:]) > -1.5  # once a few honest samples came in


@pytest.mark.parametrize("step", [40.0, -40.0], ids=["forward", "back"])
def test_a_step_of_the_servers_own_clock_is_followed_within_the_window(step: float) -> None:
    server = _Server()
    server.run(5.0)
    server.step = step  # every later response shows it
    errors = server.run(_CLOCK_WINDOW_S + 2 * EVERY)
    followed = [i for i, e in enumerate(errors) if abs(e) < 1.5]
    assert followed, f"not followed: now() still {errors[-1]:+.1f} s off"
    first = followed[0]
    assert errors[first:] == pytest.approx([0.0] * len(errors[first:]), abs=1.5)  # for good
    # by the first response after the last sample from before the step aged out, at the latest
    assert (first + 1) * EVERY <= _CLOCK_WINDOW_S + EVERY
