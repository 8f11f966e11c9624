"""A small IAM policy simulator for the S3 requests lakeshore makes, so the policies in
docs/iam/ are checked with their conditions evaluated (moto ignores ``s3:prefix``).

What it models — only what the policies use, and it refuses the rest rather than guess:

* ``Allow`` and ``Deny`` statements; an explicit Deny wins, and nothing is allowed unless a
  statement allows it (the implicit deny);
* ``Action`` and ``Resource`` (strings or lists) with ``*`` and ``?`` wildcards (``*`` also
  matches ``/``, as in IAM); action names match whatever their case (``S3:getobject`` is
  ``s3:GetObject``), resources only in their own case, as in IAM;
* ``Condition`` operators ``StringLike``, ``StringEquals`` and ``Null`` on the keys
  ``s3:prefix`` (ListBucket) and ``s3:if-none-match`` / ``s3:if-match`` (PutObject). Key
  names match whatever their case (``s3:If-None-Match`` is ``s3:if-none-match``); values
  are compared case-sensitively, as these operators do. A condition on a key the request
  lacks is false for StringLike/StringEquals, as in IAM;
* ``DeleteObjects`` (a batch delete), which S3 authorizes key by key against
  ``s3:DeleteObject``: one :class:`Request` per key.

:class:`Enforcer` plugs the simulator into a boto3 S3 client: every request is recorded
(operation, action, resource, condition keys) and one the policy denies is answered with
``AccessDenied`` before it leaves the process, as AWS would; in a batch delete only the
denied keys fail, each with its own ``AccessDenied`` entry in the answer, as on AWS.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs" / "iam"
ROLES = ("producer", "worker", "janitor", "operator", "scaler")

# the S3 operations a boto3 S3 client sends -> the IAM action that authorises them
ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObjects": "s3:DeleteObject",  # authorized per key: see requests()
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
}
_OPERATORS = ("StringLike", "StringEquals", "Null")


@dataclass(frozen=True)
class Request:
    """One S3 request as IAM sees it."""

    operation: str
    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()  # condition keys present in the request

    @property
    def keys(self) -> dict[str, str]:
        """The condition keys, by their lower-case name (IAM compares names that way)."""
        return {k.lower(): v for k, v in self.context}

    def __str__(self) -> str:
        extra = "".join(f" {k}={v!r}" for k, v in self.context)
        return f"{self.operation} {self.resource}{extra}"


def requests(operation: str, params: dict[str, Any]) -> list[Request]:
    """What IAM authorizes for a boto3 call ``operation(**params)``: one request, or for a
    batch delete one per key (S3 checks ``s3:DeleteObject`` on each).

    Raises:
        ValueError: an operation lakeshore is not expected to send (add it here knowingly).
    """
    if operation == "DeleteObjects":
        bucket, objects = params["Bucket"], params["Delete"]["Objects"]
        return [
            Request(operation, ACTIONS[operation], f"arn:aws:s3:::{bucket}/{o['Key']}")
            for o in objects
        ]
    return [request(operation, params)]


def request(operation: str, params: dict[str, Any]) -> Request:
    """The request a boto3 call ``operation(**params)`` makes (one that names one key, or
    a listing).

    Raises:
        ValueError: an operation lakeshore is not expected to send, or a batch delete (use
            :func:`requests`).
    """
    if operation not in ACTIONS or operation == "DeleteObjects":
        raise ValueError(f"the simulator does not know S3 operation {operation} as one request")
    bucket = params["Bucket"]
    context: list[tuple[str, str]] = []
    if ACTIONS[operation] == "s3:ListBucket":
        resource = f"arn:aws:s3:::{bucket}"
        if params.get("Prefix") is not None:
            context.append(("s3:prefix", params["Prefix"]))
    else:
        resource = f"arn:aws:s3:::{bucket}/{params['Key']}"
        if operation == "PutObject":
            if params.get("IfNoneMatch") is not None:
                context.append(("s3:if-none-match", str(params["IfNoneMatch"])))
            if params.get("IfMatch") is not None:
                context.append(("s3:if-match", str(params["IfMatch"])))
    return Request(operation, ACTIONS[operation], resource, tuple(context))


def load(role: str, bucket: str, prefix: str, ns: str) -> dict[str, Any]:
    """The role's policy from docs/iam/ with its placeholders filled in."""
    text = (DOCS / f"{role}.json").read_text()
    doc = json.loads(
        text.replace("BUCKET", bucket).replace("PREFIX", prefix).replace("NAMESPACE", ns)
    )
    assert isinstance(doc, dict)
    return doc


def _list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _like(pattern: str, value: str) -> bool:
    """IAM wildcard match: ``*`` any run of characters (``/`` included), ``?`` one."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, value, flags=re.S) is not None


def _condition_holds(condition: dict[str, Any], keys: dict[str, str]) -> bool:
    """Every test of the block holds; ``keys`` are the request's, by lower-case name."""
    for op, tests in condition.items():
        if op not in _OPERATORS:
            raise ValueError(f"the simulator does not evaluate condition operator {op}")
        for name, wanted in tests.items():
            key, values = name.lower(), _list(wanted)
            if op == "Null":  # "true": the key must be absent; "false": present
                holds = all((v.lower() == "true") != (key in keys) for v in values)
            elif key not in keys:
                holds = False  # StringLike/StringEquals on a missing key: no match
            elif op == "StringEquals":
                holds = keys[key] in values
            else:
                holds = any(_like(v, keys[key]) for v in values)
            if not holds:
                return False
    return True


def _applies(stmt: dict[str, Any], req: Request) -> bool:
    if not any(_like(a.lower(), req.action.lower()) for a in _list(stmt["Action"])):
        return False
    if not any(_like(r, req.resource) for r in _list(stmt["Resource"])):
        return False
    return _condition_holds(stmt.get("Condition", {}), req.keys)


def decide(policy: dict[str, Any], req: Request) -> str:
    """``"allow"``, ``"explicit deny"`` or ``"implicit deny"``."""
    for stmt in policy["Statement"]:
        if stmt.get("NotAction") or stmt.get("NotResource"):
            raise ValueError("the simulator does not evaluate NotAction/NotResource")
    statements = [s for s in policy["Statement"] if _applies(s, req)]
    if any(s["Effect"] == "Deny" for s in statements):
        return "explicit deny"
    if any(s["Effect"] == "Allow" for s in statements):
        return "allow"
    return "implicit deny"


def allowed(policy: dict[str, Any], req: Request) -> bool:
    return decide(policy, req) == "allow"


def grants_outside(policy: dict[str, Any], bucket: str, base: str) -> list[str]:
    """Every Allow of the policy that reaches beyond ``base`` (``PREFIX/lakeshore/NS/``):
    an object resource not under it, or a ListBucket whose ``s3:prefix`` values are not all
    under it (or that has no such condition at all)."""
    wrong = []
    for stmt in policy["Statement"]:
        if stmt["Effect"] != "Allow":
            continue
        for resource in _list(stmt["Resource"]):
            if resource == f"arn:aws:s3:::{bucket}":
                condition = stmt.get("Condition", {})
                prefixes = [
                    p
                    for op in ("StringLike", "StringEquals")
                    for name, wanted in condition.get(op, {}).items()
                    if name.lower() == "s3:prefix"
                    for p in _list(wanted)
                ]
                if not prefixes:
                    wrong.append(f"{stmt.get('Sid')}: lists {resource} under any prefix")
                wrong += [
                    f"{stmt.get('Sid')}: lists under {p!r}"
                    for p in prefixes
                    if not p.startswith(base)
                ]
            elif not resource.startswith(f"arn:aws:s3:::{bucket}/{base}"):
                wrong.append(f"{stmt.get('Sid')}: reaches {resource}")
    return wrong


@dataclass
class Enforcer:
    """Records every request of one boto3 S3 client and refuses what ``policy`` denies."""

    policy: dict[str, Any]
    requests: list[Request] = field(default_factory=list)
    denied: list[tuple[Request, str]] = field(default_factory=list)

    def attach(self, client: Any) -> Enforcer:
        client.meta.events.register("before-parameter-build.s3", self._check)
        client.meta.events.register("before-call.s3.DeleteObjects", self._answer_refused_batch)
        client.meta.events.register("after-call.s3.DeleteObjects", self._add_refused_keys)
        return self

    def _check(self, params: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        import botocore.exceptions

        refused: list[tuple[str, str]] = []  # a batch delete's denied keys, and why
        for req in requests(model.name, params):
            self.requests.append(req)
            verdict = decide(self.policy, req)
            if verdict == "allow":
                continue
            self.denied.append((req, verdict))
            if model.name == "DeleteObjects":
                refused.append((req.resource.split("/", 1)[1], f"{verdict}: {req}"))
                continue
            raise botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "AccessDenied", "Message": f"{verdict}: {req}"},
                    "ResponseMetadata": {"HTTPStatusCode": 403},
                },
                model.name,
            )
        if refused:
            # S3 deletes the keys it may and answers an error entry for each of the others
            gone = {key for key, _ in refused}
            objects = [o for o in params["Delete"]["Objects"] if o["Key"] not in gone]
            params["Delete"] = {**params["Delete"], "Objects": objects}
            context[_REFUSED], context[_NOTHING_LEFT] = refused, not objects

    @staticmethod
    def _answer_refused_batch(context: Any, **_: Any) -> Any:
        """Answer, without sending it, a batch whose every key was refused (S3 answers it
        with an error entry per key; an empty batch is not even well-formed)."""
        if not context.get(_NOTHING_LEFT):
            return None
        return _Answered(), {"ResponseMetadata": {"HTTPStatusCode": 200}}

    @staticmethod
    def _add_refused_keys(parsed: dict[str, Any], context: Any, **_: Any) -> None:
        for key, message in context.get(_REFUSED, []):
            parsed.setdefault("Errors", []).append(
                {"Key": key, "Code": "AccessDenied", "Message": message}
            )


_REFUSED, _NOTHING_LEFT = "iam_sim_refused_keys", "iam_sim_nothing_left"


@dataclass(frozen=True)
class _Answered:
    """The HTTP side of an answer the simulator gives in place of the server."""

    status_code: int = 200
    headers: dict[str, str] = field(default_factory=dict)
