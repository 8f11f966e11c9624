"""The table of ``bench/queue.py``: issue 16's targets, then the figures that must not regress.

Each row: what is measured, the measured value, a ratio and what it is a ratio of (the
baseline of the same run: the S3 floor, upstream, one worker; the target itself where a target
is an absolute number), the target, and ok / missed. A row whose figure could not be measured
in this run says why, and counts as missed.
"""

from __future__ import annotations

import math
from typing import Any

# the keys of the request counts in the results (kept as older results wrote them), and how
# the targets name them
_NOOP, _NOOP_KEYED = "no-op job", "no-op job with _key"
_LABEL = {_NOOP: "no-op invocation", _NOOP_KEYED: "no-op invocation with _key"}

Row = dict[str, Any]


def _row(
    target: str, measured: str, ratio: float | None, of: str, bound: str, met: bool | None
) -> Row:
    return {
        "target": target,
        "measured": measured,
        "ratio": ratio,
        "of": of,
        "bound": bound,
        "met": met,
    }


def _missing(target: str, why: str, bound: str) -> Row:
    return _row(target, f"n/a ({why})", None, "", bound, False)


def _ratio_row(target: str, a: float, b: float, fmt: str, of: str, op: str, bound: float) -> Row:
    r = a / b if b else math.nan
    met = r >= bound if op == ">=" else r <= bound
    return _row(target, f"{a:{fmt}} vs {b:{fmt}}", r, of, f"{op} {bound:g}x", met)


def issue16(res: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    tp = res["throughput"]
    s3 = "floor_serial" in res
    fl = res.get("floor_serial", {})
    no_s3 = "no SeaweedFS in this run"

    # requests per no-op invocation on S3: submit, run, one result read by a fresh plane
    for name, bound in ((_NOOP, 6.0), (_NOOP_KEYED, 7.0)):
        target = f"S3 requests per {_LABEL[name]} (incl. a read by another process)"
        got = res.get("requests_s3", {}).get(name)
        if not got:
            rows.append(_missing(target, no_s3, f"<= {bound:g}"))
            continue
        ops = got["by_operation"]
        detail = ", ".join(
            f"{ops[op]:.2f} {short}"
            for op, short in (
                ("PutObject", "PUT"),
                ("GetObject", "GET"),
                ("DeleteObject", "DELETE"),
                ("DeleteObjects", "batch DELETE"),
                ("ListObjectsV2", "LIST"),
                ("HeadObject", "HEAD"),
            )
            if ops.get(op)
        )
        rows.append(
            _row(
                target,
                f"{got['total']:.2f} ({detail})",
                got["total"] / fl["requests_per_job"] if fl else None,
                f"floor's {fl['requests_per_job']:.3f}" if fl else "",
                f"<= {bound:g}",
                got["total"] <= bound,
            )
        )
    for key, slots in (
        ("idle_requests_per_min", "1 slot"),
        ("idle_requests_per_min_8_slots", "8 slots"),
    ):
        v = res[key]
        rows.append(
            _row(f"idle worker, {slots}, req/min", f"{v:.0f}", v / 60, "target", "<= 60", v <= 60)
        )
    req = res["requests"]
    flat = req["claim, 10000 finished"]["class_a"] + req["claim, 10000 finished"]["class_b"]
    base = req["claim, 0 finished"]["class_a"] + req["claim, 0 finished"]["class_b"]
    rows.append(
        _row(
            "claim requests with 10,000 finished invocations",
            f"{flat:.2f} vs {base:.2f}",
            flat / base,
            "0 finished",
            "flat (1 +- 0.05)",
            abs(flat / base - 1) < 0.05,
        )
    )

    if s3:
        one = tp["seaweedfs, 1 process"]
        two = tp["seaweedfs, 2 processes"]
        many = tp["seaweedfs, 2 processes x 8"]
        rt, frt = res["latency_seaweedfs"]["p50_ms"], res["floor_round_trip"]["p50_ms"]
        rows += [
            _ratio_row(
                "S3 1 worker, end to end invocations/s",
                one["end_to_end_per_s"],
                fl["end_to_end_per_s"],
                ".1f",
                "serial floor",
                ">=",
                1.0,
            ),
            _ratio_row("S3 round trip p50, ms", rt, frt, ".1f", "floor's round trip", "<=", 1.3),
            _ratio_row(
                "S3 2 workers, drain invocations/s",
                two["drain_per_s"],
                one["drain_per_s"],
                ".1f",
                "1 worker",
                ">=",
                1.6,
            ),
            _ratio_row(
                "S3 2 workers x 8 slots, end to end invocations/s",
                many["end_to_end_per_s"],
                res["floor_concurrent"]["end_to_end_per_s"],
                ".1f",
                "concurrent floor",
                ">=",
                1.0,
            ),
            _ratio_row(
                "S3 sequential submit, invocations/s",
                one["submit_per_s"],
                fl["submit_per_s"],
                ".1f",
                "floor's submit",
                ">=",
                0.8,
            ),
        ]
    else:
        for t in (
            "S3 1 worker, end to end",
            "S3 round trip p50",
            "S3 2 workers, drain",
            "S3 2 workers x 8 slots",
            "S3 sequential submit",
        ):
            rows.append(_missing(t, no_s3, ""))
    batch = res.get("batch_submit")
    if batch is None:
        rows.append(_missing("S3 batch submit (f.map), invocations/s", no_s3, ">= 1000"))
    else:
        rate = batch["submit_per_s"]
        rows.append(
            _row(
                f"S3 batch submit (f.map, {batch['concurrency']} threads), invocations/s",
                f"{rate:.0f} ({batch['producer_cpu_ms_per_job']:.2f} ms CPU/invocation)",
                rate / 1000,
                "target",
                ">= 1000",
                rate >= 1000,
            )
        )
    if s3:
        one = tp["seaweedfs, 1 process"]
        cpu = one["client_cpu_ms_per_job"]
        rows.append(
            _row(
                "S3 client CPU per invocation (producer + worker), ms",
                f"{cpu:.2f} ({one['producer_cpu_ms_per_job']:.2f} + "
                f"{one['worker_cpu_ms_per_job']:.2f})",
                cpu / fl["cpu_ms_per_job"],
                f"floor's {fl['cpu_ms_per_job']:.2f} ms (boto3)",
                "<= 3 ms",
                cpu <= 3.0,
            )
        )
    else:
        rows.append(_missing("S3 client CPU per invocation", no_s3, "<= 3 ms"))

    rows += local(res)
    return rows


def local(res: dict[str, Any]) -> list[Row]:
    """Issue 16's targets for the embedded planes (``file://`` and ``:memory:``). Where the
    run made several rounds (``res["local_rounds"]``, each plane and upstream in turn), each
    row is the round with the median ratio, the range of all of them beside it: on a shared
    machine one round can land in a burst of someone else's load."""
    rounds = res.get("local_rounds") or [
        {"throughput": res["throughput"], "upstream": res.get("upstream")}
    ]
    per_round = [_local_rows(r) for r in rounds]
    if len(per_round) == 1:
        return per_round[0]
    rows: list[Row] = []
    for i, row in enumerate(per_round[0]):
        ratios = [r[i]["ratio"] for r in per_round if r[i]["ratio"] is not None]
        if not ratios:
            rows.append(row)
            continue
        median = sorted(ratios)[len(ratios) // 2]  # an odd count: one of them
        mid = next(r[i] for r in per_round if r[i]["ratio"] == median)
        span = f" (range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)})"
        rows.append({**mid, "measured": mid["measured"] + span})
    return rows


def _local_rows(res: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    tp = res["throughput"]
    up = res.get("upstream")
    why = "upstream SDK not installable here"
    if up:
        rows.append(
            _ratio_row(
                "file:// 1 worker, end to end invocations/s",
                tp["file, 1 process"]["end_to_end_per_s"],
                up["file_1"]["end_to_end_per_s"],
                ".0f",
                "upstream sqlite file",
                ">=",
                1.5,
            )
        )
    else:
        rows.append(_missing("file:// 1 worker vs upstream sqlite file", why, ">= 1.5x"))
    rows.append(
        _ratio_row(
            "file:// 2 workers, drain invocations/s",
            tp["file, 2 processes"]["drain_per_s"],
            tp["file, 1 process"]["drain_per_s"],
            ".0f",
            "1 worker",
            ">=",
            1.6,
        )
    )
    if up:
        rows.append(
            _ratio_row(
                ":memory: end to end invocations/s",
                tp["memory, in-process"]["end_to_end_per_s"],
                up["memory"]["end_to_end_per_s"],
                ".0f",
                "upstream :memory:",
                ">=",
                2.0,
            )
        )
    else:
        rows.append(_missing(":memory: vs upstream :memory:", why, ">= 2x"))
    return rows


def held(res: dict[str, Any]) -> list[Row]:
    """Targets met before issue 16 (they must not regress) and figures without a target."""
    rows: list[Row] = []
    up = res.get("upstream")
    if up:
        rows.append(
            _ratio_row(
                "round trip p50 :memory:, ms (upstream's vs ours)",
                up["latency_memory"]["p50_ms"],
                res["latency_memory"]["p50_ms"],
                ".2f",
                "ours",
                ">=",
                4.0,
            )
        )
    for backend in ("file", "seaweedfs"):
        key = f"contention_{backend}"
        if key in res:
            v = res[key]
            rows.append(
                _row(
                    f"lost CAS per claimed invocation, 8 workers, {backend}",
                    f"{v:.2f}",
                    None,
                    "",
                    "<= 0.5",
                    v <= 0.5,
                )
            )
    if "stream_seaweedfs" in res:
        st = res["stream_seaweedfs"]
        rows.append(
            _row(
                "frames per PUT, SeaweedFS",
                f"{st['frames_per_put']:.0f}",
                None,
                "",
                ">= 100",
                st["frames_per_put"] >= 100,
            )
        )
        live = st["live_frames_per_s"]
        rows.append(
            _row(
                "frames/s read live, SeaweedFS", f"{live:.0f}", None, "", ">= 20000", live >= 20_000
            )
        )
        rows.append(
            _row(
                "frames/s replayed by a fresh reader, SeaweedFS",
                f"{st['replay_frames_per_s']:.0f}",
                None,
                "",
                "-",
                None,
            )
        )
    if "payload_seaweedfs" in res:
        pl = res["payload_seaweedfs"]
        rows.append(
            _row(
                "5 MiB payload invocations, SeaweedFS, MB/s",
                f"{pl['mb_per_s']:.1f} vs {pl['raw_mb_per_s']:.1f}",
                pl["ratio"],
                "raw boto3 PUT + GET",
                "-",
                None,
            )
        )
    tp = res["throughput"]
    for name in ("seaweedfs, 1 process", "seaweedfs, 2 processes", "seaweedfs, 2 processes x 8"):
        busy = tp.get(name, {}).get("busy")
        if busy is not None and not math.isnan(busy):
            rows.append(
                _row(
                    f"cores busy during the drain, {name}",
                    f"{100 * busy:.0f}% (workers, server and benchmark)",
                    None,
                    "",
                    "-",
                    None,
                )
            )
    req = res["requests"]
    for name in (_NOOP, _NOOP_KEYED):
        r = req[name]
        rows.append(
            _row(
                f"memory store, class A / B / DELETE per {_LABEL[name]}",
                f"{r['class_a']:.2f} / {r['class_b']:.2f} / {r['delete']:.2f} "
                f"(USD {r['usd_per_million']:.2f} per million)",
                None,
                "",
                "-",
                None,
            )
        )
    for backend in ("memory", "file", "seaweedfs"):
        key = f"latency_{backend}"
        if key in res:
            lat = res[key]
            rows.append(
                _row(
                    f"round trip p50 / p99, {backend}, ms",
                    f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f}",
                    None,
                    "",
                    "-",
                    None,
                )
            )
    return rows


def show(title: str, rows: list[Row]) -> None:
    print(f"\n{title}\n")
    print(f"  {'target':<58} {'measured':<40} {'ratio':>6}  {'of':<30} {'bound':<16} result")
    for r in rows:
        mark = {True: "ok", False: "MISSED", None: "-"}[r["met"]]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(
            f"  {r['target']:<58} {r['measured']:<40} {ratio:>6}  {r['of']:<30} "
            f"{r['bound']:<16} {mark}"
        )
