"""``lakeshore submit --after`` and what ``lakeshore show`` says of a child's parents."""

from __future__ import annotations

import json

import pytest

import lakeshore as dls
from tests.commands import run


def test_submit_after_and_show_the_parents(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "submit", "tests.jobs:add_one", "--args", "[1]")
    assert code == 0
    parent = out.strip()
    code, out, _ = run(
        capsys,
        "submit",
        "tests.jobs:add_one",
        "--args",
        "[2]",
        "--after",
        parent,
        "--after",
        parent.lower(),  # the same parent twice, in another case: one parent
    )
    assert code == 0
    child = out.strip()
    code, out, _ = run(capsys, "show", child)
    assert code == 0 and "parents    waiting for 1 of 1 parents" in out
    code, out, _ = run(capsys, "show", child, "--json")
    assert json.loads(out)["after"] == [parent]
    q = dls.Dispatch(url)
    assert (
        dls.run_worker(
            q, isolation="thread", idle_exit=0.5, max_poll_s=0.05, allow=["tests.jobs:*"]
        )
        == 2
    )
    code, out, _ = run(capsys, "show", child)
    assert "succeeded" in out and "parents    1 of 1 parents done" in out


def test_submit_after_refuses_a_bad_id_in_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "submit", "tests.jobs:add_one", "--args", "[2]", "--after", "x")
    assert code != 0 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith("lakeshore: submit tests.jobs:add_one: _after holds 'x'")
