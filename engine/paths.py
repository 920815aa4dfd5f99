"""Where Halaman keeps its files (platformdirs), with one override for tests and portable installs.

Set `HALAMAN_HOME=/some/dir` to put config, cache and data under that directory instead of the
user's platform directories.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import platformdirs

APP_NAME = "halaman"


def _home() -> Path | None:
    value = os.environ.get("HALAMAN_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """Directory for settings.toml (created on demand)."""
    home = _home()
    path = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_location() -> Path:
    """Where `cache_dir` is, without creating it."""
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Directory for re-computable files: converted models, prefix caches (created on demand)."""
    path = cache_location()
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Directory for user data that must survive: library, chat history (created on demand)."""
    home = _home()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a temp file beside it (unique to this process, so two
    Halaman processes never share one), then `os.replace`. Raises OSError, with the temp file gone."""
    temp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        temp.write_bytes(data)
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """`write_bytes_atomic` of `text` in UTF-8. Raises OSError, with the temp file gone."""
    write_bytes_atomic(path, text.encode("utf-8"))
