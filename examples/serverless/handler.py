"""An AWS Lambda function that submits lakeshore calls, with nothing but bucket credentials.

Triggered by S3 notifications (directly, or through SQS), it submits one invocation per new
object and returns the ids. Lambda delivers events at least once: an asynchronous Lambda
invocation that fails is retried, and an SQS message comes back after its visibility
timeout. Every submit therefore carries an idempotency key derived from the event itself (the
object's key and etag, or the SQS message id), so a delivery seen twice returns the same ids
and queues nothing new: the handler may fail halfway and simply be run again.

    handler setting:  handler.handler
    environment:      LAKESHORE_URL=s3://bucket/prefix   (nothing else)

Try it locally, with a temporary store (see README.md)::

    LAKESHORE_URL=file:///tmp/lks python handler.py events/s3-put.json events/s3-put.json
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote_plus

import ingest

import lakeshore as dls

NS = "uploads"  # workers serve the same namespace and queue: `lakeshore worker --ns uploads`
QUEUE = "ingest"


def _plane() -> dls.Dispatch:
    url = os.environ.get("LAKESHORE_URL")
    if not url:
        # Dispatch() would fall back to file://~/.lakeshore, which on Lambda is a private,
        # short-lived disk that no worker ever sees: refuse instead.
        raise RuntimeError(
            "handler: LAKESHORE_URL is not set — set it to s3://bucket/prefix in the "
            "function's environment"
        )
    return dls.Dispatch(url, ns=NS)


# Module level: built once per execution environment (the cold start) and reused by every
# warm Lambda invocation, so boto3's client and its connections are not rebuilt per event.
PLANE = _plane()
DESCRIBE = PLANE.udf(queue=QUEUE)(ingest.describe_upload)
MESSAGE = PLANE.udf(queue=QUEUE)(ingest.handle_message)


def handler(event: Mapping[str, Any], context: object = None) -> dict[str, list[str]]:
    """Submit one invocation per record of an S3 or SQS event; return their ids, in order.

    Raises:
        LakeshoreError: the store failed; Lambda then retries the whole event, and the
            records submitted before the failure get their first ids back.
    """
    ids = []
    for record in event.get("Records", []):
        for key, udf, kwargs in _jobs(record):
            ids.append(udf.submit(**kwargs, _key=key))
    return {"ids": ids}


def _jobs(record: Mapping[str, Any]) -> Iterator[tuple[str, dls.Udf[Any, Any], dict[str, Any]]]:
    """``(idempotency key, function, arguments)`` for one event record."""
    source = record.get("eventSource")
    if source == "aws:s3":
        yield _upload(record["s3"])
    elif source == "aws:sqs":
        body = record.get("body", "")
        notification = _json(body)
        if isinstance(notification, dict) and "Records" in notification:
            # An S3 notification relayed by SQS: key it by the object, not the message, so
            # that the same upload reached by two routes still makes one invocation.
            for inner in notification["Records"]:
                if inner.get("eventSource") == "aws:s3":
                    yield _upload(inner["s3"])
        else:
            message_id = record["messageId"]
            yield f"sqs/{message_id}", MESSAGE, {"message_id": message_id, "body": body}
    else:
        raise ValueError(f"handler: unexpected event source {source!r} — wire S3 or SQS only")


def _upload(s3: Mapping[str, Any]) -> tuple[str, dls.Udf[Any, Any], dict[str, Any]]:
    bucket = s3["bucket"]["name"]
    key = unquote_plus(s3["object"]["key"])  # S3 events carry the key form-encoded
    etag = s3["object"].get("eTag", "")
    size = int(s3["object"].get("size", 0))
    # The same object version always gives the same key; a new upload of other bytes does not.
    idem = f"s3/{bucket}/{key}@{etag}"
    return idem, DESCRIBE, {"bucket": bucket, "key": key, "etag": etag, "size": size}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


if __name__ == "__main__":
    # Local stand-in for Lambda: one handler call per event file, each result as a JSON line.
    for path in sys.argv[1:]:
        with open(path) as f:
            print(json.dumps(handler(json.load(f), None)), flush=True)
