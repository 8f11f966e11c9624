"""``lakeshore submit`` and ``lakeshore schedule set`` take a call's attempts, timeout,
deadline and retry rule, over the @udf's own; a submit of a @udf keeps its retry rule."""

from __future__ import annotations

import json

import pytest

import lakeshore as dls
from tests.commands import run
from tests.e2e.test_cli_ops import one_line_error
from tests.waiting import poll


def test_a_udf_submitted_from_the_command_line_keeps_its_retry_rule(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "submit", "tests.retry_jobs:patient", "--args", "[1]")
    assert code == 0
    rec = dls.Dispatch(url).get(out.strip())
    assert rec.retry_for == ("TimeoutError",)
    assert (rec.max_attempts, rec.retry_backoff_cap_s) == (4, 7.0)


def test_the_commands_options_go_over_the_udfs(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "submit", "tests.retry_jobs:patient", "--args", "[1]",
        "--max-attempts", "2", "--retry-for", "KeyError", "--retry-for", "mypkg.errors.Busy",
        "--no-retry-for", "ValueError", "--retry-backoff", "3", "--retry-jitter", "0.5",
        "--timeout", "9", "--deadline", "600",
    )  # fmt: skip
    assert code == 0
    rec = dls.Dispatch(url).get(out.strip())
    assert rec.retry_for == ("KeyError", "mypkg.errors.Busy")
    assert rec.no_retry_for == ("ValueError",)
    assert (rec.max_attempts, rec.retry_backoff_s, rec.retry_jitter) == (2, 3.0, 0.5)
    assert rec.retry_backoff_cap_s == 7.0  # not given here: the udf's
    assert rec.timeout_s == 9.0
    now = dls.Dispatch(url).store.now()
    assert rec.deadline_at is not None and now + 500 < rec.deadline_at <= now + 600


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--retry-backoff-cap", "4000"], "retry_backoff_cap_s"),
        (["--retry-jitter", "2"], "retry_jitter"),
        (["--retry-for", "not a name!"], "retry_for"),
        (["--max-attempts", "0"], "max_attempts"),
    ],
)
def test_bad_call_options_are_one_line_and_submit_nothing(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], text: str
) -> None:
    code, _, err = run(capsys, "submit", "tests.jobs:add_one", "--args", "[1]", *argv)
    assert code != 0 and text in one_line_error(err)
    code, _, err = run(
        capsys, "schedule", "set", "s", "--fn", "tests.jobs:add_one", "--every", "60", *argv
    )
    assert code != 0 and text in one_line_error(err)
    assert dls.Dispatch(url).schedules() == []


def test_a_schedules_slots_carry_the_retry_rule_set_on_the_command_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "schedule", "set", "often", "--fn", "tests.jobs:add_one", "--every", "60",
        "--args", "[1]", "--retry-for", "TimeoutError", "--retry-jitter", "0.25",
        "--max-attempts", "3", "--json",
    )  # fmt: skip
    assert code == 0
    options = json.loads(out)["options"]
    assert options["retry_for"] == ["TimeoutError"] and options["retry_jitter"] == 0.25
    q = dls.Dispatch(url)
    # the first slot of an interval is when it was set: due within a second
    poll(lambda: q.store.now() >= json.loads(out)["next_slot"], 5, "the first slot")
    (inv,) = [f.id for f in q.tick_schedules() if f.action == "fired"]
    rec = q.get(inv)
    assert rec.retry_for == ("TimeoutError",)
    assert (rec.retry_jitter, rec.max_attempts) == (0.25, 3)


@pytest.mark.parametrize(
    "argv", [["--max-attempts", "2"], ["--key", "k"], ["--retry-jitter", "0.5"]]
)
def test_an_option_given_in_kwargs_and_as_a_flag_is_one_line_and_submits_nothing(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """``--kwargs '{"_max_attempts": 3}' --max-attempts 2`` named one option twice: a
    TypeError's traceback, not the command's one line."""
    name = "_" + argv[0].removeprefix("--").replace("-", "_")
    given = json.dumps({"x": 1, name: argv[1]})
    code, _, err = run(capsys, "submit", "tests.jobs:add_one", "--kwargs", given, *argv)
    assert code == 2 and name in one_line_error(err)
    q = dls.Dispatch(url)
    assert list(q.store.list(q.plane.ops("default").keys.ids_prefix)) == []  # no invocation
