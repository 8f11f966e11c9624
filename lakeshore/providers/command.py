"""``command``: workers launched, listed and cancelled by shell templates the scaler is given.

Enough for any platform with a command line: Kubernetes Jobs (``kubectl``), AWS Batch
(``aws batch``), a pool of VMs (``ssh``). The templates are the scaler operator's, from its
command line, never read from the store. Every value is shell-quoted (``{worker}`` word by
word), so no value can become shell syntax, and a template that names a field it may not use
is refused when the scaler starts. ``launch`` runs once per worker and may print the worker's
id (else ``{name}`` is its id); ``list`` prints one ``<id> [pending|running]`` line per live
worker and nothing else (a header line would count as a worker); ``cancel`` takes ``{id}``.

Each template's fields, the rules the scaler relies on and a Kubernetes example:
docs/providers.md#command-your-own-templates.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
import shlex
import string
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from lakeshore.errors import InvalidArgument
from lakeshore.providers.base import (
    STATES,
    Launched,
    Provider,
    WorkerSpec,
    parse_tag,
    run_tool,
    valid_id,
)

__all__ = ["CommandProvider"]

_FIELDS = {
    "launch": {"worker", "name", "ns", "queue", "tag", "label"},
    "list": {"ns", "queue", "tag", "label"},
    "cancel": {"id"},
}


def _check(op: str, template: str) -> str:
    if not isinstance(template, str) or not template.strip():
        raise InvalidArgument(
            f"command provider --{op}", "the template is empty", f"give a shell command to {op}"
        )
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise InvalidArgument(
            f"command provider --{op}",
            f"{template!r} is not a template: {e}",
            "write a literal { as {{ and } as }}",
        ) from None
    unknown = used - _FIELDS[op]
    if unknown:
        raise InvalidArgument(
            f"command provider --{op}",
            f"unknown field(s) {sorted(unknown)} in {template!r}",
            f"it may use {sorted('{' + f + '}' for f in _FIELDS[op])}",
        )
    try:  # format specs and conversions fail here, not at the first launch
        template.format(**dict.fromkeys(_FIELDS[op], "x"))
    except (ValueError, KeyError, IndexError, AttributeError) as e:
        raise InvalidArgument(
            f"command provider --{op}",
            f"{template!r} cannot be filled in: {e}",
            "use plain fields such as {name}, with no format spec or index",
        ) from None
    return template


def _label(tag: str) -> str:
    """``lakeshore-<12 hex>``, a digest of the tag: one per queue and store, in the characters
    (and the 63 of them) a Kubernetes label value allows."""
    return f"lakeshore-{hashlib.sha256(tag.encode()).hexdigest()[:12]}"


class CommandProvider(Provider):
    """Shell templates for launch, list and cancel (see the module docstring)."""

    kind = "command"

    def __init__(
        self,
        launch: str,
        list: str,
        cancel: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.templates = {
            "launch": _check("launch", launch),
            "list": _check("list", list),
            "cancel": _check("cancel", cancel),
        }
        self.env = env
        self.timeout = timeout

    def _run(
        self, op: str, worker: tuple[str, ...] = (), timeout: float | None = None, **fields: str
    ) -> str:
        quoted: dict[str, Any] = {k: shlex.quote(v) for k, v in fields.items()}
        if worker:
            quoted["worker"] = shlex.join(worker)  # its words stay words, each one quoted
        command = self.templates[op].format(**quoted)
        limit = self.timeout if timeout is None else timeout
        return run_tool(command, f"command {op}", env=self.env, timeout=limit, shell=True)

    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        ids: builtins.list[str] = []
        deadline = time.monotonic() + min(timeout, self.timeout)
        for _ in range(n):
            left = deadline - time.monotonic()
            if left <= 0:
                break  # the rest next round, once the lease is renewed
            name = f"lakeshore-{secrets.token_hex(4)}"
            out = self._run(
                "launch",
                (*spec.argv, "--worker-id", name),
                left,
                name=name,
                ns=spec.ns,
                queue=spec.queue,
                tag=spec.tag,
                label=_label(spec.tag),
            )
            words = out.split()
            ids.append(valid_id(words[0]) or name if words else name)
        return ids

    def list(self, tags: Collection[str]) -> list[Launched]:
        alive = []
        for tag in sorted(tags):
            ns, queue, _ = parse_tag(tag)
            out = self._run("list", ns=ns, queue=queue, tag=tag, label=_label(tag))
            for line in out.splitlines():
                words = line.split()
                if not words or valid_id(words[0]) is None:
                    continue  # a header, a blank line, or not an id
                state = words[1].lower() if len(words) > 1 else "running"
                alive.append(Launched(words[0], tag, state if state in STATES else "running"))
        return alive

    def cancel(self, ids: Sequence[str]) -> None:
        for worker in ids:
            if valid_id(worker) is not None:
                self._run("cancel", id=worker)
