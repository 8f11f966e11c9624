"""The work behind the serverless producer. Workers import this module by name
(``ingest:describe_upload``), so it must be on their ``PYTHONPATH`` and allowed on their
command line (``--allow 'ingest:*'``: these are plain functions); the Lambda package carries
it too, because ``handler.py`` submits these functions by reference."""

from __future__ import annotations


def describe_upload(bucket: str, key: str, etag: str, size: int) -> dict[str, object]:
    """Stand-in for real work on a new object (a thumbnail, an index entry, a checksum)."""
    suffix = key.rsplit(".", 1)[-1].lower() if "." in key.rsplit("/", 1)[-1] else ""
    return {"object": f"s3://{bucket}/{key}", "etag": etag, "size": size, "type": suffix or "?"}


def handle_message(message_id: str, body: str) -> dict[str, object]:
    """Stand-in for real work on a queue message that is not an S3 notification."""
    return {"message": message_id, "words": len(body.split())}
