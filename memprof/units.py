"""Parsing and formatting of sizes and durations. Sizes are bytes, durations seconds."""
from __future__ import annotations

import re

from memprof.errors import UsageError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'512MiB' → 536870912 bytes; '2GB' → 2_000_000_000. Raises UsageError."""
    number, unit = _split(text, "size")
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown size unit {unit!r} in {text!r}", "use B, KiB, MiB, GiB, KB, MB or GB")
    return int(number * factor)


def parse_duration(text: str) -> float:
    """'500ms' → 0.5 seconds; '60' → 60.0. Raises UsageError."""
    number, unit = _split(text, "duration")
    factor = _DURATION_UNITS.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown duration unit {unit!r} in {text!r}", "use ns, us, ms, s, m or h")
    return number * factor


def _split(text: str, what: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(str(text))
    if not match:
        raise UsageError(f"not a {what}: {text!r}", f"write a number with an optional unit, e.g. {'512MiB' if what == 'size' else '500ms'}")
    return float(match.group(1)), match.group(2)


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 → '1.5 KiB'. Negative values keep their sign."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_relative_ns(ns: int, start_ns: int) -> str:
    """A moment as a signed duration from `start_ns` (the recording's start): '+1.50s'."""
    delta = ns - start_ns
    return ("-" if delta < 0 else "+") + format_duration_ns(abs(delta))


def format_duration_ns(ns: int) -> str:
    """Nanoseconds as a short human duration: 1_500_000 → '1.5ms'."""
    s = ns / 1e9
    if s >= 60:
        return f"{s / 60:.1f}min"
    if s >= 1:
        return f"{s:.2f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f}ms"
    return f"{s * 1e6:.0f}us"
