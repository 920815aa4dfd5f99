"""Human-readable quantities shared by the CLI and the window."""

from __future__ import annotations


def format_bytes(n: int | float) -> str:
    """Binary size: 1536 -> '1.5 KiB', 0 -> '0 B'; a size that rounds to 1,024 of a unit is one of
    the next ('1.0 GiB', not '1,024.0 MiB')."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        digits = 0 if unit == "B" else 1
        if abs(round(value, digits)) < 1024 or unit == "TiB":
            return f"{value:,.{digits}f} {unit}"
        value /= 1024
    return f"{n} B"


def size_ratio(full_bytes: int | float, held_bytes: int | float) -> str:
    """How the held KV cache compares with a full one: '6.5× smaller', or '1.1× larger' for a short
    document, where the 16-bit residual and whole blocks outweigh what INT4 saves."""
    if held_bytes <= 0 or full_bytes <= 0:
        return "—"
    if full_bytes >= held_bytes:
        return f"{full_bytes / held_bytes:.1f}× smaller"
    return f"{held_bytes / full_bytes:.1f}× larger"


def format_duration(seconds: float) -> str:
    """'45 s', '3 min 50 s', '1 h 02 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"
