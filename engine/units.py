"""Human-readable quantities shared by the CLI and the window."""

from __future__ import annotations


def format_bytes(n: int | float) -> str:
    """Binary size: 1536 -> '1.5 KiB', 0 -> '0 B'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"
