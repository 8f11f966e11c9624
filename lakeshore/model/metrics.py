"""Prometheus text exposition (format 0.0.4), pure: families of samples in, text out.

Label values come from the store (queue names, namespaces, worker names in signs of life),
so they are treated as hostile text: backslash, double quote and line feed are escaped as
the format says, other text is kept as UTF-8 (a lone surrogate is written as its escape,
so the output always encodes), and a value is cut to ``MAX_LABEL_CHARS``. A sample whose
labels, as written, repeat an earlier one of its family is dropped: two signs of life that
claim the same worker name (or names cut or escaped alike) must not make a scrape fail as
a duplicate series. Names and label names
are lakeshore's own and are checked against the format's grammar.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from lakeshore.errors import InvalidArgument

__all__ = ["CONTENT_TYPE", "MAX_LABEL_CHARS", "Family", "escape_label", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_LABEL_CHARS = 256
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_TYPES = ("counter", "gauge", "untyped")


def escape_label(value: str) -> str:
    """``value`` as it goes between the quotes of a label (cut to ``MAX_LABEL_CHARS``)."""
    if len(value) > MAX_LABEL_CHARS:
        value = value[: MAX_LABEL_CHARS - 1] + "…"
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class Family:
    """One metric: its name, ``# HELP`` text, ``# TYPE`` and samples (label sets and values).

    Raises:
        InvalidArgument: a name, label name or type the format does not allow.
    """

    name: str
    help: str
    type: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    _seen: set[tuple[tuple[str, str], ...]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.type not in _TYPES:
            raise InvalidArgument(
                "metrics", f"bad metric {self.name!r} of type {self.type!r}", "a lakeshore bug"
            )

    def add(self, value: float, **labels: str) -> None:
        """One sample; a label set the family has already is dropped (the first stays)."""
        for name in labels:
            if not _LABEL.match(name) or name.startswith("__"):
                raise InvalidArgument("metrics", f"bad label name {name!r}", "a lakeshore bug")
        # as written: two values cut or escaped alike would be one series written twice
        key = tuple(sorted((k, escape_label(v)) for k, v in labels.items()))
        if key in self._seen:
            return
        self._seen.add(key)
        self.samples.append((dict(labels), value))


def exposition(families: list[Family]) -> str:
    """The text a Prometheus scrape (or node_exporter's textfile collector) reads; each
    family once, with its ``# HELP`` and ``# TYPE`` lines, in the order given."""
    lines: list[str] = []
    for fam in families:
        lines.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(
                f"{fam.name}{{{inner}}} {_number(value)}"
                if inner
                else f"{fam.name} {_number(value)}"
            )
    return "\n".join(lines) + "\n" if lines else ""
