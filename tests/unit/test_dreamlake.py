"""``dreamlake.lakeshore``: upstream's names that have no meaning here are refused with a
one-line reason or accepted and inert; lakeshore's own names stay reachable (issue 19)."""

from __future__ import annotations

import pytest

import dreamlake.lakeshore as dls
import lakeshore
from dreamlake.lakeshore.context import KeyError_
from dreamlake.lakeshore.dispatch import DispatchError
from dreamlake.lakeshore.transport import TransportError
from dreamlake.lakeshore.worker import WorkerError


@pytest.mark.parametrize(
    "call",
    [
        lambda: dls.HttpDispatch("http://127.0.0.1:9"),
        lambda: dls.Storage("s"),
        lambda: dls.TemporaryCredentials(),
        lambda: dls.DreamRc(),
        lambda: dls.Provider("SSH"),
        lambda: dls.load_config(),
        lambda: dls.resolve(None),
        lambda: dls.host_key({}),
        lambda: dls.placement_subset({}),
        lambda: dls.RunConfig(runner="process").host_key(),
        lambda: dls.RunContext(),
        lambda: dls.run.publish("x"),
    ],
)
def test_control_plane_names_are_refused_with_one_line_reasons(call: object) -> None:
    with pytest.raises(NotImplementedError) as e:
        call()  # type: ignore[operator]
    text = str(e.value)
    assert "\n" not in text and len(text) > 40


def test_a_run_config_is_kept_and_has_no_effect() -> None:
    cfg = dls.RunConfig(runner="process", host_setup=["pip install torch"])
    assert cfg.to_dict() == {"runner": "process", "host_setup": ["pip install torch"]}
    f = dls.udf(queue="gpu", config=cfg)(lambda x: x)
    assert f.config is cfg and f.local(3) == 3


def test_queue_orders_and_envelopes_lakeshore_has_not_are_refused() -> None:
    dp = dls.Dispatch(":memory:")
    with pytest.raises(DispatchError, match="filo"):
        dls.SyncQueue("q", dispatch=dp, kind="filo")
    q = dls.SyncQueue("q", dispatch=dp)
    with pytest.raises(DispatchError, match="envelope"):
        q.submit(envelope=b"\x00")
    with pytest.raises(TypeError, match="object"):
        q.submit(object())
    with pytest.raises(DispatchError, match="not running under worker"):
        q.post("01M8TS9CRD8771D9G3ETP3VSS4", "v")
    with pytest.raises(TransportError):
        dls.udf(queue="q", transport="ref")(lambda: 1).submit(_dispatch=dp)
    with pytest.raises(TransportError):
        dls.udf(queue="q", transport="pickle")(lambda: 1).submit(_dispatch=dp)
    with pytest.raises(TransportError):
        dls.run_worker(q, allow_pickled=True)


def test_lakeshore_names_stay_reachable_and_upstream_errors_have_their_homes() -> None:
    for name in lakeshore.__all__:
        assert hasattr(dls, name), name
    assert dls.Failed is lakeshore.Failed and dls.WorkQueue is lakeshore.WorkQueue
    assert dls.Job is lakeshore.Job
    assert issubclass(DispatchError, RuntimeError) and issubclass(WorkerError, RuntimeError)
    assert issubclass(KeyError_, ValueError)
    with pytest.raises(AttributeError):
        dls.no_such_name  # noqa: B018
    assert set(dls.UPSTREAM) <= set(dls.__all__)


def test_run_worker_takes_a_lakeshore_plane_too() -> None:
    q = dls.Dispatch(":memory:")
    f = q.udf(lambda x: x + 1)
    inv = f.submit(1)
    assert dls.run_worker(q, once=True) == 1
    assert q.result(inv) == 2
