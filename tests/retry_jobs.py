"""Bodies and exceptions of the retry-rule tests, importable by a body process."""

from __future__ import annotations

import lakeshore as dls


class BaseProblem(Exception):
    """A base class a rule names; :class:`SubProblem` must match it."""


class SubProblem(BaseProblem):
    pass


class BadInput(ValueError, dls.Permanent):
    """An exception of the user's that is permanent wherever it is raised."""


def raise_kind(kind: str) -> None:
    """Raise the exception ``kind`` names."""
    if kind == "permanent":
        try:
            int("x")
        except ValueError as e:
            raise dls.Permanent("bad input") from e
    raise {
        "key": KeyError("k"),
        "value": ValueError("v"),
        "sub": SubProblem("s"),
        "bad_input": BadInput("b"),
    }[kind]


def fail_n_times(path: str, times: int) -> str:
    """Raise ValueError on the first ``times`` attempts (counted in a file: the attempts may
    run in other processes), then succeed."""
    with open(path, "a+") as f:
        f.seek(0)
        seen = len(f.read())
        f.write("x")
    if seen < times:
        raise ValueError(f"attempt {seen + 1}")
    return "ok"


@dls.udf(max_attempts=4, retry_for="TimeoutError", retry_backoff_cap_s=7)
def patient(x: int) -> int:
    """Declared with its own rule: ``lakeshore submit`` must keep it
    (tests/e2e/test_cli_call_options.py)."""
    return x
