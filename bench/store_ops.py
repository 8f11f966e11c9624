"""Store-layer overhead, as ratios against raw baselines measured in the same run.

    bash scripts/bench            # or: .venv/bin/python -m bench.store_ops [--ops N]

For each verb the benchmark times lakeshore's store against the cheapest raw equivalent on
the same backend, interleaving rounds so that a noisy neighbour hits both alike:

* ``LocalStore`` vs plain files in the same directory: write a temp file + ``os.rename``
  (overwrite), ``os.link`` (create), open + read (get);
* ``S3Store`` vs raw boto3 calls on the same SeaweedFS server (started here, on loopback):
  ``put_object``, ``put_object(IfNoneMatch="*")``, ``put_object(IfMatch=…)``, ``get_object``.

A ratio of 1.0 means no overhead; the report also prints absolute ops/s for context only.
Results are written to ``bench/results/store_ops.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lakeshore.store import CREATE, LocalStore, if_match

ROUNDS = 5


def _rate(fn: Callable[[int], object], n: int, offset: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(offset + i)
    return n / (time.perf_counter() - t0)


def compare(
    name: str, ours: Callable[[int], object], raw: Callable[[int], object], n: int
) -> dict[str, Any]:
    """Alternate rounds of ours and raw; report medians and their ratio."""
    a, b = [], []
    for r in range(ROUNDS):
        a.append(_rate(ours, n, r * n * 2))
        b.append(_rate(raw, n, r * n * 2 + n))
    ours_rate, raw_rate = statistics.median(a), statistics.median(b)
    return {
        "op": name,
        "lakeshore_ops_s": ours_rate,
        "raw_ops_s": raw_rate,
        "ratio": ours_rate / raw_rate,
    }


def bench_local(n: int) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="lakeshore-bench-"))
    store = LocalStore(root / "store")
    raw = root / "raw"
    raw.mkdir()
    payload = b"x" * 512
    etag = [store.put("cas/k", payload)]

    def raw_overwrite(i: int) -> None:
        tmp = raw / f".tmp{i}"
        tmp.write_bytes(payload)
        os.rename(tmp, raw / "k")

    def raw_create(i: int) -> None:
        tmp = raw / f".tmp{i}"
        tmp.write_bytes(payload)
        os.link(tmp, raw / f"c{i}")
        tmp.unlink()

    def cas(i: int) -> None:
        etag[0] = store.put("cas/k", payload, if_match(etag[0]))

    store.put("g/k", payload)
    (raw / "g").write_bytes(payload)
    return [
        {
            "backend": "local",
            **compare("put overwrite", lambda i: store.put("o/k", payload), raw_overwrite, n),
        },
        {
            "backend": "local",
            **compare("put create", lambda i: store.put(f"c/{i}", payload, CREATE), raw_create, n),
        },
        {"backend": "local", **compare("put if_match", cas, raw_overwrite, n)},
        {
            "backend": "local",
            **compare("get", lambda i: store.get("g/k"), lambda i: (raw / "g").read_bytes(), n),
        },
    ]


def bench_s3(n: int) -> list[dict[str, Any]]:
    import boto3

    from bench.seaweed_env import BUCKET, seaweed_server
    from lakeshore.store.s3 import S3Store
    from tests.tiers import FAKE_CREDS

    with seaweed_server() as server:
        if server is None:
            return []
        client = boto3.client(
            "s3", endpoint_url=server.endpoint, region_name="us-east-1", **FAKE_CREDS
        )
        store = S3Store(BUCKET, "ls", endpoint_url=server.endpoint, **FAKE_CREDS)
        payload = b"x" * 512
        etags = {
            "ours": store.put("cas", payload),
            "raw": client.put_object(Bucket=BUCKET, Key="raw/cas", Body=payload)["ETag"],
        }

        def ours_cas(i: int) -> None:
            etags["ours"] = store.put("cas", payload + str(i).encode(), if_match(etags["ours"]))

        def raw_cas(i: int) -> None:
            r = client.put_object(
                Bucket=BUCKET, Key="raw/cas", Body=payload + str(i).encode(), IfMatch=etags["raw"]
            )
            etags["raw"] = r["ETag"]

        def raw_get(i: int) -> None:
            client.get_object(Bucket=BUCKET, Key="raw/cas")["Body"].read()

        rows = [
            compare(
                "put overwrite",
                lambda i: store.put("o", payload),
                lambda i: client.put_object(Bucket=BUCKET, Key="raw/o", Body=payload),
                n,
            ),
            compare(
                "put create",
                lambda i: store.put(f"c/{i}", payload, CREATE),
                lambda i: client.put_object(
                    Bucket=BUCKET, Key=f"raw/c/{i}", Body=payload, IfNoneMatch="*"
                ),
                n,
            ),
            compare("put if_match", ours_cas, raw_cas, n),
            compare("get", lambda i: store.get("cas"), raw_get, n),
        ]
        return [{"backend": "seaweedfs", **r} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ops", type=int, default=200, help="operations per round per side (S3); local x10"
    )
    args = parser.parse_args()
    rows = bench_local(args.ops * 10) + bench_s3(args.ops)
    print(f"{'backend':<10} {'op':<14} {'lakeshore/s':>12} {'raw/s':>10} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['backend']:<10} {r['op']:<14} {r['lakeshore_ops_s']:>12.0f} "
            f"{r['raw_ops_s']:>10.0f} {r['ratio']:>7.2f}"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "store_ops.json").write_text(json.dumps(rows, indent=2))
    print(
        f"(medians of {ROUNDS} interleaved rounds; "
        "ratio = lakeshore / raw on the same backend, same run)"
    )


if __name__ == "__main__":
    main()
