"""``lakeshore schedule set|ls|rm|tick``, and ticks from several processes at once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.keys import QueueKeys
from lakeshore.model.schedule import slot_key
from tests.commands import env_for, lakeshore_cmd, run
from tests.waiting import poll


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lakeshore: "), err
    assert " — " in lines[0]
    return lines[0]


def test_set_ls_tick_rm(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "schedule", "set", "nightly", "--fn", "tests.jobs:add_one", "--cron", "0 3 * * *",
        "--tz", "Europe/Berlin", "--args", "[1]", "--priority", "7", "--overlap", "skip",
    )  # fmt: skip
    assert code == 0 and "schedule nightly on default: cron 0 3 * * * Europe/Berlin" in out
    code, out, _ = run(
        capsys, "schedule", "set", "often", "--fn", "tests.jobs:add_one", "--every", "60",
        "--kwargs", '{"x": 2}', "--json",
    )  # fmt: skip
    often = json.loads(out)
    assert code == 0 and often["every"] == 60 and often["args"] == [[], {"x": 2}]
    code, out, _ = run(capsys, "schedule", "ls")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["QUEUE", "NAME", "WHEN", "FUNCTION"]
    assert any("nightly" in line and "skip" in line for line in lines)
    # the first slot of 'often' is when it was set: due within a second
    poll(lambda: dls.Dispatch(url).store.now() >= often["next_slot"], 5, "the first slot")
    code, out, _ = run(capsys, "schedule", "tick", "--queue", "default")
    assert code == 0
    (fired,) = out.splitlines()
    slot_text = slot_key("often", often["next_slot"]).rsplit("/", 1)[1]
    assert fired.startswith(f"fired default/often slot {slot_text} -> ")
    inv = fired.rsplit(" ", 1)[1]
    assert dls.Dispatch(url).get(inv).key == slot_key("often", often["next_slot"])
    code, out, _ = run(capsys, "schedule", "tick")  # every queue; nothing due now
    assert code == 0 and out == ""
    code, out, _ = run(capsys, "schedule", "ls", "--json")
    listed = {s["name"]: s for s in json.loads(out)["schedules"]}
    assert listed["often"]["last_id"] == inv and listed["often"]["fired"] == 1
    assert listed["nightly"]["options"] == {"priority": 7}
    code, out, _ = run(capsys, "schedule", "rm", "often")
    assert code == 0 and "removed schedule often" in out
    code, _, err = run(capsys, "schedule", "rm", "often")
    assert code == 1 and "no schedule 'often'" in err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--every", "5"], "from 10 to"),
        (["--cron", "61 * * * *"], "is not 0-59"),
        (["--every", "60", "--tz", "Nowhere/Land"], "not a time zone"),
        (["--every", "60", "--args", "{"], "not valid JSON"),
        (["--every", "60", "--start", "2030-01-01T00:00:00"], "not a time with a zone"),
        (["--every", "60", "--priority", "11"], "out of range"),
    ],
)
def test_bad_set_input_is_one_line_and_writes_nothing(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], text: str
) -> None:
    code, _, err = run(capsys, "schedule", "set", "x", "--fn", "tests.jobs:add_one", *argv)
    assert code == 2 and text in one_line_error(err)
    q = dls.Dispatch(url)
    assert list(q.store.list(QueueKeys(q.ns, "default").schedules_prefix)) == []


def test_tick_reports_an_unreadable_schedule_and_fires_the_others(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    s = q.schedule("good", "tests.jobs:add_one", every=60, args=[1])
    q.store.put(QueueKeys(q.ns, "default").schedules_prefix + "bad", b"\xc1\x1b[2J")
    poll(lambda: q.store.now() >= s.start, 5, "the first slot")
    code, out, err = run(capsys, "schedule", "tick", "-q", "default")
    assert code == 1
    assert out.startswith("fired default/good")
    assert "unreadable default/bad" in err and "\x1b" not in err
    code, out, _ = run(capsys, "schedule", "ls")
    assert code == 0 and "unreadable" in out


def test_ticks_from_many_processes_at_once_fire_one_invocation(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    q = dls.Dispatch(url)
    s = q.schedule("cron-job", "tests.jobs:add_one", every=3600, args=[1])
    poll(lambda: q.store.now() >= s.start, 5, "the first slot")
    env = env_for(url)
    procs = [
        subprocess.Popen(
            lakeshore_cmd("schedule", "tick", "--queue", "default", "--json"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        answers.append(json.loads(out)["schedules"][0])
    ids = {a["id"] for a in answers if a["action"] == "fired"}
    assert len(ids) == 1
    assert {a["action"] for a in answers} <= {"fired", "idle"}
    tickets = list(q.plane.ops("default").tickets())
    assert len(tickets) == 1 and tickets[0].key.endswith(ids.pop())
    assert q.schedules()[0].fired == 1
