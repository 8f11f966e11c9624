"""Upstream's control-plane names: placement, remote planes, storage, ``.dreamrc``.

They only mean something with upstream's control plane. A run declaration (``RunConfig``)
is accepted and has no effect, so decorated functions keep working; everything that would
talk to the control plane or decide placement is refused with a one-line reason.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "DockerOptions",
    "DreamRc",
    "HttpDispatch",
    "KubeOptions",
    "Provider",
    "RunConfig",
    "Storage",
    "TemporaryCredentials",
    "host_key",
    "load_config",
    "placement_subset",
    "resolve",
]

_PLACEMENT = "placement by host key is decided by upstream's control plane; lakeshore workers "
_PLACEMENT += "serve the queues they are started on"


class KubeOptions(TypedDict, total=False):
    namespace: str
    context: str
    cpu: str
    memory: str
    gpu: int
    poll_interval_s: float


class DockerOptions(TypedDict, total=False):
    network: str


class RunConfig:
    """A run declaration, kept as given (``to_dict``) and otherwise inert here."""

    def __init__(self, **fields: Any) -> None:
        self._fields = dict(fields)

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"RunConfig has no field {name!r} (only the ones given are kept)")

    def to_dict(self) -> dict[str, Any]:
        """The fields as given (upstream's defaults are not filled in)."""
        return dict(self._fields)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """A run declaration from a dict of its fields."""
        return cls(**data)

    def host_key(self) -> str:
        raise NotImplementedError(f"RunConfig.host_key: {_PLACEMENT}")

    def placement_subset(self) -> dict[str, Any]:
        raise NotImplementedError(f"RunConfig.placement_subset: {_PLACEMENT}")

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def _refused(name: str, reason: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"dls.{name}: {reason}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused here: {reason}."
    return refuse


host_key = _refused("host_key", _PLACEMENT)
placement_subset = _refused("placement_subset", _PLACEMENT)
HttpDispatch = _refused(
    "HttpDispatch",
    "lakeshore has no control plane to talk to; use dls.Dispatch with a bucket URL "
    "(s3://bucket/prefix), a directory or :memory:",
)
Storage = _refused(
    "Storage", "storage handles are the control plane's; lakeshore moves files through dls.run"
)
TemporaryCredentials = _refused(
    "TemporaryCredentials", "give the bucket's credentials to lakeshore the way boto3 reads them"
)
DreamRc = _refused("DreamRc", ".dreamrc modes and providers are the control plane's")
Provider = _refused("Provider", ".dreamrc providers are the control plane's")
load_config = _refused("load_config", ".dreamrc is read by the control plane's tools")
resolve = _refused("resolve", ".dreamrc modes are resolved by the control plane's tools")
