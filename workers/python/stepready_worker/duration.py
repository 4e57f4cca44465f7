"""Durations written as Go writes them (``300ms``, ``2s``, ``1m30s``), the syntax of ``scheduler run``'s flags and
their STEPREADY_* environment variables, so that one environment configures both workers."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Returns the duration ``text`` names, in seconds. ``0`` alone is allowed without a unit.

    Raises ValueError naming the text for anything else (a negative duration included: no setting takes one).
    """
    s = text.strip()
    if s == "0":
        return 0.0
    if not s:
        raise ValueError("invalid duration \"\": want a number with a unit, such as 300ms, 2s or 1m30s")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}: want a number with a unit, such as 300ms, 2s or 1m30s")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return total
