"""Providers: adapters that launch, list and cancel workers on tools that already schedule
things. ``local`` (processes here), ``slurm`` (array jobs) and ``command`` (shell templates:
Kubernetes, AWS Batch, a VM pool). The scaler (``lakeshore.scaler``) decides how many."""

from lakeshore.providers.base import Launched, Provider, WorkerSpec, tag_of
from lakeshore.providers.command import CommandProvider
from lakeshore.providers.local import LocalProvider
from lakeshore.providers.slurm import SlurmProvider

__all__ = [
    "CommandProvider",
    "Launched",
    "LocalProvider",
    "Provider",
    "SlurmProvider",
    "WorkerSpec",
    "tag_of",
]
