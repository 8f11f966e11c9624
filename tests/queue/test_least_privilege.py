"""The IAM policies in docs/iam/ against the requests lakeshore really makes.

moto ignores ``s3:prefix`` conditions, so every S3 request of a role's store is checked by
our own policy simulator (tests/iam_sim.py) with conditions evaluated, and refused with
``AccessDenied`` when the policy denies it — as AWS would. Full plane scenarios run per role
(producer, worker, janitor, operator); afterwards every recorded request must have been
allowed (a denial some code path swallowed fails too), and no policy may reach beyond its
namespace. The scenarios of issue 22 (a stranded ``max_depth`` queue, producers rewriting
settings or worker status) have their own regression tests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.cli import main
from lakeshore.keys import worker_key
from lakeshore.model import lifecycle
from lakeshore.protocol import gc
from lakeshore.protocol.admission import SLOT_REPAIR_AGE_S, repair_slots
from lakeshore.protocol.census import newest_ids, queue_status
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.gc import collect, prune_workers
from lakeshore.store.base import CREATE
from tests import iam_sim, jobs
from tests.roles import BASE, BUCKET, NS, PREFIX, Principal, policy
from tests.tiers import make_plane


def _limited(admin: Principal, queue: str, **settings: Any) -> None:
    admin.plane().configure(queue, **settings)


def _assert_all_allowed(p: Principal) -> None:
    assert p.enforcer.requests, f"{p.role} made no request: the scenario did not run"
    denied = [f"{verdict}: {req}" for req, verdict in p.enforcer.denied]
    assert not denied, f"{p.role}'s policy denies requests its code makes:\n" + "\n".join(denied)


# -- the full plane, role by role -------------------------------------------------------------


def test_every_request_of_every_role_is_allowed_by_its_policy(
    principals: dict[str, Principal], monkeypatch: pytest.MonkeyPatch, report: list[str]
) -> None:
    operator, producer = principals["operator"], principals["producer"]
    worker, janitor = principals["worker"], principals["janitor"]

    # operator: queue set / show
    op = operator.plane()
    op.configure("limited", max_depth=1, on_full="block", rate_limit="100/s")
    op.configure("paced", rate_limit="1/h")
    assert op.queue_config("limited").max_depth == 1

    # producer: submits of every kind, admission that blocks and refuses, cancel, topics
    q = producer.plane()
    add = q.udf(jobs.add_one)
    gen = q.udf(jobs.squares)
    other = q.udf(jobs.add_one, queue="other")  # a first submit to a queue nobody configured
    lim = q.udf(jobs.add_one, queue="limited")
    paced = q.udf(jobs.add_one, queue="paced")
    inv = add.submit(41)
    keyed = add.submit(1, _key="nightly")
    assert add.submit(1, _key="nightly") == keyed
    streamed = gen.submit(3)
    elsewhere = other.submit(1)
    first = lim.submit(1)
    with pytest.raises(dls.QueueFull):  # blocks, then refuses: never PermissionDenied
        lim.submit(2, _submit_timeout=0.2)
    assert q.cancel(first)
    second = lim.submit(3)  # the cancel freed the slot
    paced.submit(1)
    with pytest.raises(dls.QueueFull):
        paced.submit(2)
    q.topic("news").post({"n": 1})

    # worker: runs them all (a generator among them), reaps, says it is alive
    w = worker.plane()
    for fn in (jobs.add_one, jobs.squares):
        w.udf(fn)
        w.udf(fn, queue="other")
        w.udf(fn, queue="limited")
    ran = dls.run_worker(
        w, queues=["default", "other", "limited"], max_jobs=5, idle_exit=0.5, isolation="thread"
    )
    assert ran == 5
    for name in ("default", "other", "limited"):
        Claimer(w.plane.ops(name), "").reap(w.store.now())

    # producer: results, states, streams, topics
    assert q.result(inv, timeout=30) == 42
    assert q.result(elsewhere, timeout=30) == 2
    assert q.result(second, timeout=30) == 4
    assert q.status(keyed) == "succeeded"
    assert [f.value for f in q.stream(streamed, timeout=30)] == [(0, 0), (1, 1), (2, 4)]
    assert [f.value for f in q.topic("news").stream()] == [{"n": 1}]
    assert q.logs(inv) == ""
    with pytest.raises(dls.PermissionDenied):  # a rerun rewrites a ticket: not a producer's
        q.retry(keyed)
    assert [v for _, v in producer.enforcer.denied] == ["explicit deny"]
    producer.enforcer.denied.clear()  # the one refusal this scenario asked for
    assert op.retry(keyed) == 2 and q.status(keyed) == "queued"

    # operator: `lakeshore status` and `ls`
    from lakeshore.cli import watch

    monkeypatch.setattr(watch, "plane", lambda args: op)
    assert main(["status", "--url", "s3://x/y", "limited", "default"]) == 0
    assert main(["ls", "--url", "s3://x/y", "default"]) == 0

    # janitor: gc of every queue, slots and signs of life included
    jan = janitor.plane()
    later = jan.store.now() + 3600
    for name in ("default", "other", "limited", "paced"):
        collect(jan.plane.ops(name), jan.plane.settings, 0.0, later)
    assert prune_workers(jan.store, NS, 60.0, later, dry_run=False) == 1

    for p in (operator, producer, worker, janitor):
        _assert_all_allowed(p)
    counts = ", ".join(
        f"{p.role} {len(p.enforcer.requests)}" for p in (producer, worker, janitor, operator)
    )
    report.append(
        f"IAM replay: every request checked against its role's policy ({counts}): 0 denied"
    )


@pytest.mark.parametrize("role", iam_sim.ROLES)
def test_no_policy_reaches_beyond_its_namespace(role: str) -> None:
    pol = policy(role)
    assert iam_sim.grants_outside(pol, BUCKET, BASE) == []
    # and, simulated: the whole bucket, the store prefix, another namespace, another tenant
    for prefix in (None, "", f"{PREFIX}/", f"{PREFIX}/lakeshore/", f"{PREFIX}/lakeshore/other/"):
        params = {"Bucket": BUCKET} | ({} if prefix is None else {"Prefix": prefix})
        assert not iam_sim.allowed(pol, iam_sim.request("ListObjectsV2", params)), prefix
    for key in ("tenant-b/secret", f"{PREFIX}/lakeshore/other/q/x/record", f"{PREFIX}/data/x"):
        for operation in ("GetObject", "PutObject", "DeleteObject"):
            req = iam_sim.request(operation, {"Bucket": BUCKET, "Key": key})
            assert not iam_sim.allowed(pol, req), (role, operation, key)


def test_producers_list_only_what_submitting_and_reading_results_need() -> None:
    pol = policy("producer")

    def lists(prefix: str) -> bool:
        req = iam_sim.request("ListObjectsV2", {"Bucket": BUCKET, "Prefix": prefix})
        return iam_sim.allowed(pol, req)

    assert lists(f"{BASE}jobs/_slots/")
    assert lists(f"{BASE}jobs/01JD2K7Q000000000000000000/journal/0001/")
    assert not lists(f"{BASE}jobs/_tickets/")  # a producer cannot claim
    assert not lists(f"{BASE}jobs/")  # nor enumerate other producers' invocations
    assert not lists(BASE)

    def reads(key: str) -> bool:
        return iam_sim.allowed(pol, iam_sim.request("GetObject", {"Bucket": BUCKET, "Key": key}))

    # the admission objects it lists it may not read: a slot names its holder
    assert not reads(f"{BASE}jobs/_slots/0000000")
    assert not reads(f"{BASE}jobs/_rate/000000000001/0000000")
    assert reads(f"{BASE}jobs/01JD2K7Q000000000000000000/record")


def test_a_producer_learns_no_invocation_id_of_another_from_what_it_may_list(
    principals: dict[str, Principal],
) -> None:
    """Another producer of the namespace submits to a ``max_depth`` and a ``rate_limit``
    queue and posts to a topic; a producer held to the same policy lists every folder its
    policy lets it list and reads every listed object it may read. No key and no body it
    gets names one of the other's invocations (the ids are what it would need to read
    their arguments, cancel them or race their claims)."""
    from lakeshore.store.s3 import S3Store

    admin = principals["admin"].plane()
    admin.configure("depth", max_depth=5)
    admin.configure("paced", rate_limit="100/h")
    admin.configure("both", max_depth=5, rate_limit="100/h")
    victim = principals["producer"].plane()
    ids = [
        victim.udf(jobs.add_one, queue=name).submit(i)
        for name in ("depth", "paced", "both")
        for i in range(2)
    ]
    victim.topic("news").post({"n": 1})
    for inv in ids:
        assert victim.status(inv) == "queued"

    store = S3Store(BUCKET, PREFIX, region="us-east-1")
    snoop = iam_sim.Enforcer(policy("producer")).attach(store.client)
    ns = f"lakeshore/{NS}/"
    prefixes = [f"{ns}_clock/", f"{ns}_topics/", f"{ns}_topics/news/"]
    for queue in ("depth", "paced", "both", "default"):
        prefixes += [f"{ns}{queue}/{folder}/" for folder in ("_slots", "_rate", "journal", "logs")]
    listed: list[str] = []
    for prefix in prefixes:
        try:
            listed += [i.key for i in store.list(prefix)]
        except dls.PermissionDenied:
            continue
    bodies: list[bytes] = []
    for key in listed:
        try:
            bodies.append(store.get(key)[0])
        except dls.PermissionDenied:
            continue
    assert sum("/_slots/" in k for k in listed) == 4  # the scenario ran: four slots held
    assert sum("/_rate/" in k for k in listed) == 4  # and four rate tokens taken
    leaks = [
        (where, inv)
        for inv in ids
        for where in listed + [b.decode("latin-1") for b in bodies]
        if inv in where
    ]
    assert leaks == [], f"a producer learned another's invocation ids: {leaks}"
    tried = {r.resource for r in snoop.requests if r.action == "s3:GetObject"}
    assert any("/_slots/" in r for r in tried) and any("/_rate/" in r for r in tried)


def test_policies_are_valid_json_with_placeholders() -> None:
    for role in iam_sim.ROLES:
        doc = json.loads((iam_sim.DOCS / f"{role}.json").read_text())
        assert doc["Version"] == "2012-10-17" and doc["Statement"]
        assert "BUCKET" in json.dumps(doc) and "NAMESPACE" in json.dumps(doc)


def test_the_simulator_evaluates_conditions_and_explicit_denies() -> None:
    pol = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::b",
                "Condition": {"StringLike": {"s3:prefix": ["p/*/x/*"]}},
            },
            {"Effect": "Allow", "Action": "s3:*Object", "Resource": "arn:aws:s3:::b/p/*"},
            {
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": "arn:aws:s3:::b/c/*",
                "Condition": {"Null": {"s3:if-none-match": "false"}},
            },
            {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/p/*/_queue"},
        ]
    }

    def ok(op: str, **params: Any) -> bool:
        return iam_sim.allowed(pol, iam_sim.request(op, {"Bucket": "b", **params}))

    assert ok("ListObjectsV2", Prefix="p/q/x/")
    assert not ok("ListObjectsV2", Prefix="p/q/")
    assert not ok("ListObjectsV2")
    assert ok("PutObject", Key="p/q/record") and not ok("PutObject", Key="p/q/_queue")
    assert ok("HeadObject", Key="p/q/record") and not ok("GetObject", Key="other")
    assert ok("PutObject", Key="c/1", IfNoneMatch="*") and not ok("PutObject", Key="c/1")


def test_the_simulator_matches_action_names_whatever_their_case() -> None:
    pol = {
        "Statement": [
            {"Effect": "Allow", "Action": "S3:getobject", "Resource": "arn:aws:s3:::b/*"},
            {"Effect": "Allow", "Action": ["s3:PUTOBJECT"], "Resource": "arn:aws:s3:::b/*"},
            {"Effect": "Deny", "Action": "S3:Put*", "Resource": "arn:aws:s3:::b/locked"},
        ]
    }

    def ok(op: str, key: str) -> bool:
        return iam_sim.allowed(pol, iam_sim.request(op, {"Bucket": "b", "Key": key}))

    assert ok("GetObject", "x") and ok("HeadObject", "x") and ok("PutObject", "x")
    assert not ok("PutObject", "locked")  # the Deny matches in any case too
    assert not iam_sim.allowed(
        pol, iam_sim.request("GetObject", {"Bucket": "B", "Key": "x"})
    )  # the bucket's name is not matched in another case


def test_the_simulator_matches_condition_key_names_whatever_their_case() -> None:
    pol = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::b",
                "Condition": {"StringLike": {"S3:Prefix": ["p/*"]}},
            },
            {
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": "arn:aws:s3:::b/c/*",
                "Condition": {"Null": {"s3:If-None-Match": "false"}},
            },
            {
                "Effect": "Deny",
                "Action": "s3:PutObject",
                "Resource": "arn:aws:s3:::b/c/sealed",
                "Condition": {"Null": {"S3:IF-NONE-MATCH": "true"}},
            },
        ]
    }

    def ok(op: str, **params: Any) -> bool:
        return iam_sim.allowed(pol, iam_sim.request(op, {"Bucket": "b", **params}))

    assert ok("ListObjectsV2", Prefix="p/q/")
    assert not ok("ListObjectsV2", Prefix="P/q/")  # values keep their case (StringLike)
    assert ok("PutObject", Key="c/1", IfNoneMatch="*")
    assert not ok("PutObject", Key="c/1")
    assert not ok("PutObject", Key="c/sealed")  # the Deny's key is found in any case
    assert iam_sim.grants_outside(pol, "b", "p/") == ["None: reaches arn:aws:s3:::b/c/*"]


def test_the_simulator_authorizes_a_batch_delete_key_by_key() -> None:
    pol = {
        "Statement": [
            {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/p/*"},
            {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/p/keep"},
        ]
    }
    params = {"Bucket": "b", "Delete": {"Objects": [{"Key": k} for k in ("p/1", "p/keep", "q/1")]}}
    reqs = iam_sim.requests("DeleteObjects", params)
    assert [r.resource for r in reqs] == [
        "arn:aws:s3:::b/p/1",
        "arn:aws:s3:::b/p/keep",
        "arn:aws:s3:::b/q/1",
    ]
    assert {r.action for r in reqs} == {"s3:DeleteObject"}
    assert [iam_sim.decide(pol, r) for r in reqs] == ["allow", "explicit deny", "implicit deny"]


def test_a_batch_delete_fails_only_on_the_keys_the_policy_denies(
    principals: dict[str, Principal],
) -> None:
    admin, producer = principals["admin"].store, principals["producer"]
    slot, ticket = f"lakeshore/{NS}/jobs/_slots/0000000", f"lakeshore/{NS}/jobs/_tickets/5/x"
    for key in (slot, ticket):
        admin.put(key, b"x")
    with pytest.raises(dls.PermissionDenied, match="refused 1 of 2 keys"):
        producer.store.delete_many([slot, ticket])
    assert [r.resource for r, _ in producer.enforcer.denied] == [
        f"arn:aws:s3:::{BUCKET}/{PREFIX}/{ticket}"
    ]
    assert sorted(i.key for i in admin.list(f"lakeshore/{NS}/jobs/")) == [
        ticket
    ]  # only the slot went
    producer.enforcer.denied.clear()
    with pytest.raises(dls.PermissionDenied, match="refused 1 of 1 keys"):
        producer.store.delete_many([ticket])  # every key refused: nothing to send at all
    assert [i.key for i in admin.list(f"lakeshore/{NS}/jobs/")] == [ticket]


# -- issue 22, item 1: a max_depth queue is never stranded under the producer policy ----------


def test_producer_blocking_on_a_full_queue_waits_instead_of_permission_denied(
    principals: dict[str, Principal],
) -> None:
    _limited(principals["admin"], "jobs", max_depth=1, on_full="block", rate_limit="100/s")
    f = principals["producer"].plane().udf(jobs.add_one, queue="jobs")
    f.submit(1)
    # the rate token taken before the slot turned out missing is given back (a DELETE)
    with pytest.raises(dls.QueueFull) as err:
        f.submit(2, _submit_timeout=0.3)
    assert err.value.details["reason"] == "max_depth"
    _assert_all_allowed(principals["producer"])


def test_producer_cancel_frees_the_slot_of_a_max_depth_queue(
    principals: dict[str, Principal],
) -> None:
    _limited(principals["admin"], "jobs", max_depth=1)
    q = principals["producer"].plane()
    f = q.udf(jobs.add_one, queue="jobs")
    first = f.submit(1)
    assert q.cancel(first)
    assert q.status(first) == "killed"
    second = f.submit(2)  # admitted: the slot is free again
    assert q.status(second) == "queued"
    _assert_all_allowed(principals["producer"])


def _leak_a_slot(admin: Principal) -> tuple[Any, str]:
    """A worker that died between its terminal write and its slot delete: the record is
    terminal, the slot still held."""
    _limited(admin, "jobs", max_depth=1)
    plane = admin.plane()
    inv = plane.udf(jobs.add_one, queue="jobs").submit(1)
    ops = plane.plane.ops("jobs")
    rec, etag = ops.read(inv)
    ops.cas(lifecycle.cancel(rec, plane.store.now(), "the worker ended it"), etag)  # no free_slot
    assert ops.read(inv)[0].terminal and list(ops.store.list(ops.keys.slots_prefix))
    return plane, inv


def test_slot_leaked_by_a_worker_crash_is_freed_by_a_worker_never_read_by_producers(
    principals: dict[str, Principal],
) -> None:
    _leak_a_slot(principals["admin"])
    prod = principals["producer"].plane()
    f = prod.udf(jobs.add_one, queue="jobs")
    with pytest.raises(dls.QueueFull):  # full as far as anyone can tell without reading it
        f.submit(2)
    slot_reads = [
        r
        for r in principals["producer"].enforcer.requests
        if r.action == "s3:GetObject" and "/_slots/" in r.resource
    ]
    assert slot_reads == []
    w = principals["worker"].plane()
    later = w.store.now() + SLOT_REPAIR_AGE_S + 1
    assert repair_slots(w.plane.ops("jobs"), later) == [w.plane.ops("jobs").keys.slot(0)]
    assert prod.status(f.submit(3)) == "queued"
    _assert_all_allowed(principals["producer"])
    _assert_all_allowed(principals["worker"])


def test_slot_leaked_by_a_worker_crash_is_freed_by_the_janitors_gc(
    principals: dict[str, Principal],
) -> None:
    _leak_a_slot(principals["admin"])
    jan = principals["janitor"].plane()
    ops = jan.plane.ops("jobs")
    later = jan.store.now() + SLOT_REPAIR_AGE_S + 1
    rep = collect(ops, jan.plane.settings, 7 * 86400.0, later)  # nothing old enough to expire
    assert rep.expired == [] and rep.objects == [ops.keys.slot(0)]
    assert list(ops.store.list(ops.keys.slots_prefix)) == []
    assert gc.free_leaked_slots(ops, later) == []
    _assert_all_allowed(principals["janitor"])


def test_producer_cancel_of_an_invocation_whose_slot_changed_hands_is_no_permission_error(
    principals: dict[str, Principal],
) -> None:
    """The slot a cancel frees was freed and taken again meanwhile: its conditional delete
    is refused (412), and the producer may not look at the slot to tell a changed one from a
    missing one. Nothing was deleted either way: the cancel succeeds, the new holder keeps
    its slot."""
    _limited(principals["admin"], "jobs", max_depth=1)
    q = principals["producer"].plane()
    inv = q.udf(jobs.add_one, queue="jobs").submit(1)
    admin = principals["admin"].store
    slot = q.plane.ops("jobs").keys.slot(0)
    admin.delete(slot)
    admin.put(slot, b"01JD2K7Q000000000000000000 abcd", CREATE)  # another holder's now
    assert q.cancel(inv) and q.status(inv) == "killed"
    assert admin.get(slot)[0].startswith(b"01JD2K7Q000000000000000000")
    assert [v for _, v in principals["producer"].enforcer.denied] == ["explicit deny"]  # its HEAD


def test_producer_whose_slot_create_was_answered_late_is_not_refused(
    principals: dict[str, Principal],
) -> None:
    """A slot's create lands but its answer is lost; the retry meets 412, and the producer
    may not read the slot back to see whether it was its own. It takes another slot (the
    first one is a leak, repaired like any other) instead of failing the submit."""
    import botocore.exceptions

    _limited(principals["admin"], "jobs", max_depth=3)
    producer = principals["producer"]
    lost: list[str] = []

    def note_key(params: Any, context: Any, **_: Any) -> None:
        context["test_key"] = params["Key"]

    def answer_lost(context: Any, **_: Any) -> None:  # after the create landed
        if "/_slots/" in context.get("test_key", "") and not lost:
            lost.append(context["test_key"])
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="moto")

    events = producer.store.client.meta.events
    events.register("before-parameter-build.s3.PutObject", note_key)
    events.register("after-call.s3.PutObject", answer_lost)
    q = producer.plane()
    inv = q.udf(jobs.add_one, queue="jobs").submit(1)
    assert lost and q.status(inv) == "queued"
    slots = list(principals["admin"].store.list(q.plane.ops("jobs").keys.slots_prefix))
    assert len(slots) == 2  # its own, and the one whose answer was lost (a leak)
    denied = [(r.operation, r.resource) for r, _ in producer.enforcer.denied]
    assert denied == [("GetObject", f"arn:aws:s3:::{BUCKET}/{lost[0]}")]  # the read-back


def test_janitor_fences_a_slot_whose_submit_never_wrote_its_record(
    principals: dict[str, Principal],
) -> None:
    admin = principals["admin"].plane()
    ops = admin.plane.ops("jobs")
    ghost = "01JD2K7Q000000000000000000"
    admin.store.put(ops.keys.slot(0), f"{ghost} abcd".encode(), CREATE)
    jan = principals["janitor"].plane()
    later = jan.store.now() + SLOT_REPAIR_AGE_S + 1
    assert gc.free_leaked_slots(jan.plane.ops("jobs"), later) == [ops.keys.slot(0)]
    assert ops.read(ghost)[0].state == "failed"  # the tombstone: a late submit cannot land
    _assert_all_allowed(principals["janitor"])


# -- issue 22, item 2: producers cannot rewrite queue settings or worker status --------------


def test_producer_cannot_lift_the_limits_of_its_queue(principals: dict[str, Principal]) -> None:
    _limited(principals["admin"], "jobs", max_depth=1, rate_limit="1/s")
    q = principals["producer"].plane()
    for change in ({"max_depth": None}, {"rate_limit": None}, {"result_retention_s": 1e9}):
        with pytest.raises(dls.PermissionDenied):
            q.configure("jobs", **change)
    conf = principals["admin"].plane().queue_config("jobs")
    assert conf.max_depth == 1 and conf.rate is not None


def test_producer_cannot_write_a_fake_worker(principals: dict[str, Principal]) -> None:
    q = principals["producer"].plane()
    with pytest.raises(dls.PermissionDenied):
        q.store.put(worker_key(NS, "fake"), b"{}")
    with pytest.raises(dls.PermissionDenied):
        q.store.delete(worker_key(NS, "w-1"))


def test_first_submit_to_a_new_queue_writes_no_settings(principals: dict[str, Principal]) -> None:
    q = principals["producer"].plane()
    inv = q.udf(jobs.add_one, queue="fresh").submit(1)
    assert q.status(inv) == "queued"
    puts = [r.resource for r in principals["producer"].enforcer.requests if "Put" in r.operation]
    assert not any(r.endswith("/_queue") for r in puts)
    _assert_all_allowed(principals["producer"])


def test_worker_cannot_rewrite_queue_settings(principals: dict[str, Principal]) -> None:
    with pytest.raises(dls.PermissionDenied):
        principals["worker"].plane().configure("jobs", max_depth=5)


def test_status_is_an_operator_command(principals: dict[str, Principal]) -> None:
    """``lakeshore status`` lists the tickets: an operator's (or a worker's) view, which
    the producer policy keeps from producers (docs/s3.md says so)."""
    principals["producer"].plane().udf(jobs.add_one).submit(1)
    op = principals["operator"].plane()
    now = op.store.now()
    assert queue_status(op.plane.ops("default"), now).queued == 1
    assert len(list(newest_ids(op.store, op.plane.ops("default").keys, None, now))) == 1
    prod = principals["producer"].plane()
    with pytest.raises(dls.PermissionDenied):
        queue_status(prod.plane.ops("default"), now)


# -- gc's sweep of leaked admission slots, on every store ------------------------------------


def _full_queue(store: Any) -> tuple[Any, Any, str]:
    plane = make_plane(store)
    plane.configure("jobs", max_depth=2)
    f = plane.udf(jobs.add_one, queue="jobs")
    ended, live = f.submit(1), f.submit(2)
    ops = plane.plane.ops("jobs")
    rec, etag = ops.read(ended)
    ops.cas(lifecycle.cancel(rec, store.now(), "its worker died"), etag)  # slot not freed
    return plane, ops, live


def test_gc_frees_the_slot_a_dead_worker_leaked_and_keeps_the_live_ones(store: Any) -> None:
    plane, ops, live = _full_queue(store)
    ghost = "01JD2K7Q000000000000000000"  # a submit that took a slot and never came back
    plane.configure("other", max_depth=1)
    other = plane.plane.ops("other")
    store.put(other.keys.slot(0), f"{ghost} abcd".encode(), CREATE)
    now = store.now()
    assert gc.free_leaked_slots(ops, now) == []  # younger than SLOT_REPAIR_AGE_S: left alone
    assert gc.free_leaked_slots(other, now) == []
    later = now + SLOT_REPAIR_AGE_S + 1
    held = sorted(i.key for i in store.list(ops.keys.slots_prefix))
    assert gc.free_leaked_slots(ops, later, dry_run=True) != []
    assert sorted(i.key for i in store.list(ops.keys.slots_prefix)) == held  # dry run
    freed = gc.free_leaked_slots(ops, later)
    assert len(freed) == 1
    left = [store.get(i.key)[0].split(b" ")[0].decode() for i in store.list(ops.keys.slots_prefix)]
    assert left == [live]  # the live invocation keeps its slot
    assert gc.free_leaked_slots(other, later) == [other.keys.slot(0)]
    assert other.read(ghost)[0].state == "failed"  # fenced: the late submit cannot land
    assert plane.status(plane.udf(jobs.add_one, queue="jobs").submit(3)) == "queued"


def test_gc_never_frees_a_slot_taken_again_after_it_looked(
    atomic_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leaked slot is freed and taken by a new submit between gc's listing and its
    delete: the delete is conditional on the listed etag, so the new holder keeps it."""
    from lakeshore.protocol import admission

    plane, ops, live = _full_queue(atomic_store)
    real = admission._ended
    taken: list[str] = []

    def freed_and_retaken_meanwhile(ops_: Any, holder: str, now: float, dry: bool = False) -> bool:
        ended = real(ops_, holder, now, dry)
        if ended and not taken:
            for info in list(atomic_store.list(ops.keys.slots_prefix)):
                if atomic_store.get(info.key)[0].startswith(holder.encode()):
                    atomic_store.delete(info.key)  # its worker's late tidy
                    taken.append(plane.udf(jobs.add_one, queue="jobs").submit(9))
        return ended

    monkeypatch.setattr(admission, "_ended", freed_and_retaken_meanwhile)
    later = atomic_store.now() + SLOT_REPAIR_AGE_S + 1
    assert gc.free_leaked_slots(ops, later) == []
    holders = {
        atomic_store.get(i.key)[0].split(b" ")[0].decode()
        for i in atomic_store.list(ops.keys.slots_prefix)
    }
    assert taken and holders == {live, taken[0]}


@pytest.mark.parametrize(
    ("submits", "launched", "live", "more"),
    [(1, 1, 1, False), (3, 2, 2, True)],
    ids=["reads-the-ticket", "count-stops-before-reading"],
)
def test_a_scaler_needs_only_its_lease_the_settings_and_a_listing(
    principals: dict[str, Principal], submits: int, launched: int, live: int, more: bool
) -> None:
    """With few live invocations the scaler reads their tickets (a tombstone, a work
    queue's payload or an invocation not due for long is no work): that read must be
    allowed too, or a small queue never gets a worker."""
    from lakeshore.scaler import Scaler
    from lakeshore.store.base import OVERWRITE
    from tests.fleet import UNUSED_URL, Fleet

    admin = principals["admin"].plane()
    block = {"kind": "local", "max_workers": 2, "jobs_per_worker": 1, "cooldown_s": 0}
    admin.configure("hpc", provider=block)
    f = principals["producer"].plane().udf(jobs.add_one, queue="hpc")
    for i in range(submits):
        f.submit(i)
    fleet = Fleet()
    scaler = Scaler(principals["scaler"].plane(), ["hpc"], fleet, url=UNUSED_URL)
    (report,) = scaler.tick()
    assert report.error is None, report.error
    assert report.acting and report.wanted >= 1
    assert len(report.launched) == launched and (report.live, report.more) == (live, more)
    ticket_reads = [
        r
        for r in principals["scaler"].enforcer.requests
        if r.action == "s3:GetObject" and "/_tickets/" in r.resource
    ]
    assert len(ticket_reads) == (0 if more else submits)
    scaler.close()  # gives the lease back: one more write of it
    _assert_all_allowed(principals["scaler"])
    key = f"lakeshore/{NS}/hpc/_scaler"
    for role in ("producer", "worker", "janitor"):  # a forged lease could hold scaling off
        with pytest.raises(dls.PermissionDenied):
            principals[role].store.put(key, b"forged", OVERWRITE)
    for change in ({"max_depth": 1}, {"provider": None}):  # and it changes no setting
        with pytest.raises(dls.PermissionDenied):
            principals["scaler"].plane().configure("hpc", **change)
    sc = principals["scaler"].store
    for denied in (f"lakeshore/{NS}/hpc/_slots/0000000", f"lakeshore/{NS}/hpc/x/record"):
        with pytest.raises(dls.PermissionDenied):  # tickets only: no record, no result
            sc.get(denied)


def test_a_producer_cannot_trim_a_topic_and_a_worker_can(request: pytest.FixtureRequest) -> None:
    """docs/s3.md: producers post and read topics; trimming deletes posts, a worker's grant."""
    roles = request.getfixturevalue("principals")
    t = roles["producer"].plane().topic("news")
    t.post(1)
    t.post(2)
    with pytest.raises(dls.PermissionDenied):
        t.trim(keep_last=1)
    assert roles["worker"].plane().topic("news").trim(keep_last=1) == 1


def test_the_doctor_runs_with_a_workers_credentials_inside_its_namespace(
    request: pytest.FixtureRequest,
) -> None:
    from lakeshore.doctor import diagnose

    worker = request.getfixturevalue("principals")["worker"]
    # one thread: this is about what the role may do, and moto's conditional writes are not
    # atomic under races (two threads can both win one, whatever the policy)
    assert diagnose(worker.store, threads=1, rounds=1, ns=NS).safe
    assert worker.enforcer.requests and not worker.enforcer.denied
