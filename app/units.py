"""Human-readable durations and counts for the window (bytes: engine.units.format_bytes)."""

from __future__ import annotations

from engine.units import format_duration


def fmt_duration(seconds: float | None) -> str:
    """'45 s', '3 min 50 s', '1 h 02 min'; '—' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "—"
    return format_duration(seconds)


def fmt_count(n: int | None, unit: str) -> str:
    """'1 page', '18 pages', '5,231 tokens'."""
    if n is None:
        return ""
    return f"{n:,} {unit if n == 1 else unit + 's'}"
