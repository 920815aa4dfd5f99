"""Where an installation lives. Everything the installer and the first start create sits under one
prefix folder, so uninstalling is removing that folder plus the few files listed in its manifest.

    <prefix>/install.json        manifest: version, the Python that runs the launcher, files outside the prefix
    <prefix>/lib/launch.py       entry script; lib/halaman_launcher/ is this package
    <prefix>/payload/            release.json, the Halaman wheel, the pip wheel, icon, sample document
    <prefix>/bin/halaman         the command the desktop entry runs (halaman.cmd on Windows)
    <prefix>/env/                the virtual environment, made on first start
    <prefix>/env/halaman-ready.json  marker: what was prepared; later starts only read this file
    <prefix>/logs/prepare.log    the first start's log

Default prefix: `$XDG_DATA_HOME/halaman/program` on Linux (`~/.local/share/halaman/program`), next to
but apart from the app's own data in `$XDG_DATA_HOME/halaman`; `%LOCALAPPDATA%\\Programs\\Halaman` on
Windows.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "halaman"


def is_windows() -> bool:
    return sys.platform == "win32"


def xdg_data_home() -> Path:
    """`$XDG_DATA_HOME`, or `~/.local/share` (XDG Base Directory spec; relative values are ignored)."""
    value = os.environ.get("XDG_DATA_HOME", "")
    return Path(value) if os.path.isabs(value) else Path.home() / ".local" / "share"


def default_prefix() -> Path:
    if is_windows():
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "Programs" / "Halaman"
    return xdg_data_home() / APP_NAME / "program"


def default_bin_dir() -> Path | None:
    """Where a `halaman` command link goes so a terminal finds it: `~/.local/bin` (XDG); none on Windows."""
    return None if is_windows() else Path.home() / ".local" / "bin"


def user_data_dirs() -> dict[str, Path]:
    """The folders Halaman itself writes (settings, caches, library and chat history), as
    engine/paths.py computes them with platformdirs; mirrored here because the uninstaller runs
    without the environment. tests/test_installer.py checks the two agree."""
    home = os.environ.get("HALAMAN_HOME")
    if home:
        root = Path(home).expanduser()
        return {"settings": root / "config", "caches": root / "cache", "library and chat history": root / "data"}
    if is_windows():
        local = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / APP_NAME
        return {"settings, library and chat history": local, "caches": local / "Cache"}

    def xdg(variable: str, fallback: str) -> Path:
        value = os.environ.get(variable, "")
        return Path(value) if os.path.isabs(value) else Path.home() / fallback

    return {
        "settings": xdg("XDG_CONFIG_HOME", ".config") / APP_NAME,
        "caches": xdg("XDG_CACHE_HOME", ".cache") / APP_NAME,
        "library and chat history": xdg("XDG_DATA_HOME", ".local/share") / APP_NAME,
    }


@dataclass(frozen=True)
class Layout:
    """The paths of one installation under `prefix`."""

    prefix: Path

    @property
    def manifest(self) -> Path:
        return self.prefix / "install.json"

    @property
    def lib(self) -> Path:
        return self.prefix / "lib"

    @property
    def payload(self) -> Path:
        return self.prefix / "payload"

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def env(self) -> Path:
        return self.prefix / "env"

    @property
    def marker(self) -> Path:
        return self.env / "halaman-ready.json"

    @property
    def logs(self) -> Path:
        return self.prefix / "logs"

    @property
    def tmp(self) -> Path:
        """pip's TMPDIR: on the same disk as the environment, not a small tmpfs /tmp."""
        return self.prefix / "tmp"

    @property
    def lock(self) -> Path:
        return self.prefix / "prepare.lock"

    @property
    def launcher_command(self) -> Path:
        return self.bin / ("halaman.cmd" if is_windows() else "halaman")

    @property
    def uninstall_command(self) -> Path:
        return self.bin / ("halaman-uninstall.cmd" if is_windows() else "halaman-uninstall")

    def env_python(self, windowed: bool = False) -> Path:
        if is_windows():
            return self.env / "Scripts" / ("pythonw.exe" if windowed else "python.exe")
        return self.env / "bin" / "python"

    def env_script(self, name: str) -> Path:
        return self.env / "Scripts" / f"{name}.exe" if is_windows() else self.env / "bin" / name

    def env_share(self) -> Path:
        """`sys.prefix/share/halaman` of the environment: engine/cli.py looks for the sample here."""
        return self.env / "share" / APP_NAME

    def release(self) -> dict:
        """payload/release.json, written by installer/build.py."""
        return read_json(self.payload / "release.json")


def read_json(path: Path) -> dict:
    """The JSON object in `path`, or {} when it is missing or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict) -> None:
    """Write through a temporary file and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def format_size(n: float) -> str:
    """1536 -> '1.5 KiB'; 3.2e9 -> '3.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
