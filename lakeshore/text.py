"""Text from the store, made safe to show: on a terminal, in a log line, in JSON.

Anything read from the store may be hostile, and a worker's log or a command's output is
read on a terminal: a control character there is an instruction (move the cursor, rewrite
the title, hide what follows), a newline fakes a line of its own. Every place that shows
such text passes it through here.
"""

from __future__ import annotations

import re

__all__ = ["inert", "inert_json"]

# C0 controls, DEL, C1 controls (0x9b alone is a CSI on some terminals), and the Unicode
# format characters that reorder or split what is shown (bidi overrides, line separators)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_MULTILINE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# JSON escapes C0 itself; the rest can only occur inside strings, where a \u escape of
# the code point decodes to the same text
_UNSAFE_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def inert(text: object, multiline: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters shown as ``\\x1b``-style
    escapes. ``multiline`` keeps newlines and tabs (log output); a carriage return is always
    escaped, since it lets a line overwrite what came before it."""
    return (_UNSAFE_MULTILINE if multiline else _UNSAFE).sub(_escape, str(text))


def inert_json(text: str) -> str:
    """JSON text (which escapes C0 itself) with the remaining terminal controls escaped as
    ``\\uXXXX``, which decode to the same string."""
    return _UNSAFE_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
