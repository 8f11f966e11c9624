"""Dependencies between invocations, as pure rules: which parents a submit may name, and
what a parent's state means for its child. No I/O.

A child names its parents by id (``_after=[ids]``). It may be claimed only once every parent
is *done*: succeeded, or, with ``after_failure="run"``, ended in any way. A parent that ended
otherwise (failed, killed, timed out), or that cannot be found, *breaks* the child: the
child is killed, naming the parent. A parent still live (queued or running) keeps it
*waiting*. The record keeps how many parents, in order, were seen done (``after_done``), so
a later look starts at the first one not seen done yet. docs/dependencies.md has the rules.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from lakeshore.errors import InvalidArgument
from lakeshore.keys import check_id

__all__ = [
    "AFTER_FAILURES",
    "AFTER_PASSES",
    "MAX_AFTER",
    "Standing",
    "check_after",
    "parent_standing",
    "parents_line",
]

# Parents one child may name. Every write of the child's record (a claim, each heartbeat)
# carries its parents' ids, 27 bytes each: a thousand keep a record under 32 KiB. A wider
# fan-in is a tree of reduces.
MAX_AFTER = 1000
# what a parent that ended badly does to its child: end it ("kill"), or count as done ("run")
AFTER_FAILURES = ("kill", "run")
# what a fan-in hands its body first: nothing, the parents' ids, or their results
AFTER_PASSES = ("", "ids", "results")


class Standing(enum.StrEnum):
    """What one parent's state means for its child."""

    DONE = "done"  # counts: succeeded (or, with after_failure="run", ended in any way)
    WAITING = "waiting"  # still live: the child waits
    BROKEN = "broken"  # ended badly (or is missing) and the child must end too


def parent_standing(state: str | None, after_failure: str) -> Standing:
    """What a parent in ``state`` (None: not found, collected or never submitted) means for
    a child whose ``after_failure`` is ``after_failure``."""
    if state in ("queued", "running"):
        return Standing.WAITING
    if state == "succeeded" or after_failure == "run":
        return Standing.DONE
    return Standing.BROKEN


def check_after(
    after: Iterable[str] | None, after_failure: object, op: str
) -> tuple[tuple[str, ...], str]:
    """A submit's ``_after`` and ``_after_failure``, checked: the parents' ids in canonical
    form, in the order given, each once; and the failure rule (``"kill"`` when there are no
    parents, as it then means nothing).

    Raises:
        InvalidArgument: ``after`` is not an iterable of ids, holds more than
            :data:`MAX_AFTER` of them, or ``after_failure`` is not ``"kill"`` or ``"run"``.
    """
    if after_failure not in AFTER_FAILURES:
        raise InvalidArgument(
            op,
            f"_after_failure={after_failure!r:.40}",
            'pass "kill" (a parent that fails ends the child, the default) or "run" (the '
            "child runs once every parent ended, however)",
        )
    if after is None:
        return (), "kill"
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise InvalidArgument(
            op,
            f"_after must be a list of invocation ids, got a {type(after).__name__}",
            "pass a list of the ids submit() returned, e.g. _after=[a, b] (one id: _after=[a])",
        )
    ids: dict[str, None] = {}
    for inv in after:
        if not isinstance(inv, str):
            raise InvalidArgument(
                op,
                f"_after holds a {type(inv).__name__}, not an invocation id",
                "pass the ids submit() returned",
            )
        try:
            ids[check_id(inv)] = None
        except InvalidArgument:
            raise InvalidArgument(
                op,
                f"_after holds {inv!r:.40}, which is not an invocation id",
                "pass the ids submit() returned",
            ) from None
        if len(ids) > MAX_AFTER:
            raise InvalidArgument(
                op,
                f"_after names more than {MAX_AFTER} parents",
                f"reduce in a tree: fan in groups of at most {MAX_AFTER}, then fan in their "
                "results (see docs/dependencies.md)",
                limit=MAX_AFTER,
            )
    parents = tuple(ids)
    return parents, (str(after_failure) if parents else "kill")


def parents_line(total: int, done: int, queued: bool, after_failure: str, after_pass: str) -> str:
    """One line about a child's parents, for people (``lakeshore show``, the dashboard): how
    many it still waits for (as the last look counted them), and its rules."""
    if queued and done < total:
        line = f"waiting for {total - done} of {total} parents"
    else:
        line = f"{done} of {total} parents done"
    if after_failure == "run":
        line += "; runs however they end"
    if after_pass:
        line += f"; hands their {after_pass} to the body"
    return line
