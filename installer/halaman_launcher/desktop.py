"""The XDG desktop entry and icon (Linux): what makes Halaman appear in the applications menu and in
a file manager's "Open with" for the document types it reads (the entry's MimeType).

Files (freedesktop.org Desktop Entry and Icon Theme specifications, per user):
    $XDG_DATA_HOME/applications/halaman.desktop                  from resources/halaman.desktop, with
                                                                 Exec / TryExec set to the launcher
    $XDG_DATA_HOME/icons/hicolor/scalable/apps/halaman.svg       resources/halaman.svg
    $XDG_DATA_HOME/icons/hicolor/256x256/apps/halaman.png        resources/halaman.png
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

DESKTOP_FILE = "halaman.desktop"
ICON_NAME = "halaman"
# Characters that make an Exec argument need quoting (Desktop Entry spec, "The Exec key").
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def quote_exec_argument(argument: str) -> str:
    """One Exec argument, quoted when needed, then escaped as a desktop-entry string value."""
    if argument and not (set(argument) & _RESERVED):
        quoted = argument
    else:
        inner = argument.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
        quoted = f'"{inner}"'
    return quoted.replace("\\", "\\\\").replace("%", "%%")


def desktop_entry_text(template: str, launcher: Path) -> str:
    """The template with `Exec` (and `TryExec`) pointing at the installed launcher; the template's
    field codes after the program (`%f`: the file or folder "Open with Halaman" was given) stay."""
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "TryExec":
            continue
        if key == "Exec":
            field_codes = line.split("=", 1)[1].split()[1:]
            lines.append(f"TryExec={str(launcher).replace(chr(92), chr(92) * 2)}")
            lines.append(" ".join([f"Exec={quote_exec_argument(str(launcher))}", *field_codes]))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def install_entry(data_home: Path, template: str, launcher: Path, svg: Path, png: Path | None) -> list[Path]:
    """Write the desktop entry and the icons. Returns the files written (for the manifest)."""
    entry = data_home / "applications" / DESKTOP_FILE
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(".tmp")
    tmp.write_text(desktop_entry_text(template, launcher), encoding="utf-8")
    tmp.chmod(0o755)  # some file managers only trust executable launchers on the desktop
    os.replace(tmp, entry)
    written = [entry]
    hicolor = data_home / "icons" / "hicolor"
    for source, size in ((svg, "scalable"), (png, "256x256")):
        if source is None or not source.exists():
            continue
        target = hicolor / size / "apps" / f"{ICON_NAME}{source.suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    refresh(data_home)
    return written


def refresh(data_home: Path) -> None:
    """Tell desktops to rescan: menus watch applications/ by themselves; the icon theme notices a new
    mtime of its folder, or needs its cache rebuilt if one exists there (never create one: a stale
    user-level cache hides icons other programs install later)."""
    hicolor = data_home / "icons" / "hicolor"
    if hicolor.is_dir():
        now = time.time()
        os.utime(hicolor, (now, now))
        if (hicolor / "icon-theme.cache").exists() and shutil.which("gtk-update-icon-cache"):
            subprocess.run(["gtk-update-icon-cache", "-q", "-t", "-f", str(hicolor)], check=False, capture_output=True)
    applications = data_home / "applications"
    # The entry's MimeType puts Halaman in "Open with" menus; the per-user mimeinfo.cache that this
    # (re)writes is where older desktops look those up (newer ones read the entries themselves).
    if applications.is_dir() and shutil.which("update-desktop-database"):
        subprocess.run(["update-desktop-database", "-q", str(applications)], check=False, capture_output=True)
