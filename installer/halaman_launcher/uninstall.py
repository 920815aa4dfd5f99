"""Uninstall: remove everything install.py and prepare.py made, and ask before deleting what the
user made with Halaman (settings, library and chat history, prefix caches and the converted model).

`--yes` deletes the user's data without asking, `--keep-data` keeps it without asking; with neither,
a terminal is asked and anything else keeps the data (and says where it is).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from halaman_launcher import desktop
from halaman_launcher.layout import Layout, format_size, is_windows, read_json, user_data_dirs, xdg_data_home


def _tree(path: Path, skip: Path | None = None) -> tuple[int, int]:
    """(files, bytes) under `path`, not counting the folder `skip`."""
    count = total = 0
    for root, dirs, files in os.walk(path):
        if skip is not None:
            dirs[:] = [d for d in dirs if Path(root, d).resolve() != skip.resolve()]
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                count += 1
            except OSError:
                pass
    return count, total


def user_data(layout: Layout) -> dict[str, tuple[Path, int]]:
    """The user's Halaman folders that exist: label -> (folder, bytes outside the installation).
    On Linux the default prefix lies inside the data folder; it is not counted as the user's."""
    return {label: (path, _tree(path, skip=layout.prefix)[1]) for label, path in user_data_dirs().items() if path.is_dir()}


def uninstall(layout: Layout, *, yes: bool = False, keep_data: bool = False, ask=input, interactive: bool | None = None,
              out=print) -> int:
    """Remove the installation at `layout`. Returns an exit status."""
    manifest = read_json(layout.manifest)
    if not manifest:
        out(f"No Halaman installation at {layout.prefix} (install.json is missing); nothing removed.")
        return 1
    data = user_data(layout)
    delete_data = False
    if data and not keep_data:
        listing = "\n".join(f"  {label}: {path} ({format_size(size)})" for label, (path, size) in data.items())
        if yes:
            delete_data = True
        elif interactive if interactive is not None else (sys.stdin is not None and sys.stdin.isatty()):
            out(f"Halaman's own files will be removed. Your data is here:\n{listing}")
            try:
                reply = ask("Delete your Halaman settings, library, chat history and caches too? [y/N] ")
            except EOFError:
                reply = ""
            delete_data = reply.strip().lower() in ("y", "yes")
        else:
            out(f"Kept your data (run with --yes to delete it too):\n{listing}")

    removed: list[str] = []
    for name in manifest.get("files", []):
        path = Path(name)
        if path.exists() or path.is_symlink():
            path.unlink()
            removed.append(str(path))
    link = manifest.get("bin_link")
    if link and Path(link).is_symlink() and Path(os.readlink(link)) == layout.launcher_command:
        Path(link).unlink()
        removed.append(link)
    if is_windows() and manifest.get("registry"):
        from halaman_launcher import windows

        windows.unregister_uninstall()
        removed.append(manifest["registry"])
    elif not is_windows():
        desktop.refresh(xdg_data_home())
    env_bytes = _tree(layout.prefix)[1]
    shutil.rmtree(layout.prefix, ignore_errors=True)
    removed.append(f"{layout.prefix} ({format_size(env_bytes)})")
    if delete_data:
        for path, _size in data.values():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    else:
        for path, _size in data.values():  # a data folder that only held the installation
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if data and keep_data:
            out("Kept your data: " + ", ".join(str(path) for path, _size in data.values() if path.exists()))
    out("Removed:\n" + "\n".join(f"  {item}" for item in removed))
    out("pip's download cache is shared with other programs and was left alone "
        "(`python3 -m pip cache purge` empties it).")
    return 0
