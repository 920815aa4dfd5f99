"""Install: copy the launcher and the payload into the prefix, write the commands, and make Halaman
appear where the user looks for programs (desktop entry + icon on Linux, Start menu on Windows).
Nothing big is downloaded here: the first start does that (prepare.py), with a progress window.

Installing over an existing installation upgrades it: the launcher and payload are replaced, the
environment is kept and re-prepared on the next start because the marker names the old release.
"""

from __future__ import annotations

import datetime
import os
import shlex
import shutil
import sys
from pathlib import Path

from halaman_launcher import desktop
from halaman_launcher.layout import Layout, format_size, is_windows, read_json, write_json, xdg_data_home
from halaman_launcher.torch_choice import choose_torch, detect_nvidia

MIN_PYTHON = (3, 11)


class InstallError(Exception):
    pass


def base_python() -> Path:
    """The interpreter the launcher will run on: the base one when this runs inside a venv."""
    if sys.prefix != sys.base_prefix:
        base = getattr(sys, "_base_executable", None)
        if base and Path(base).exists():
            return Path(base)
    return Path(sys.executable)


def check_python() -> None:
    if sys.version_info < MIN_PYTHON:
        raise InstallError(f"Halaman needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer; this is "
                           f"{sys.version.split()[0]} ({sys.executable}).")
    try:
        import venv  # noqa: F401
    except ImportError as exc:
        raise InstallError(f"Python's venv module is missing ({exc}); on Debian / Ubuntu: sudo apt install python3-venv") from exc


def install(source: Path, prefix: Path, *, bin_dir: Path | None, desktop_entry: bool = True,
            torch: str | None = None, out=print) -> Layout:
    """Install from the unpacked artifact at `source` into `prefix`. Returns the layout."""
    check_python()
    layout = Layout(prefix.expanduser().resolve())
    release = read_json(source / "payload" / "release.json")
    if not release.get("wheel"):
        raise InstallError(f"{source} is not an unpacked Halaman release (payload/release.json is missing)")
    if layout.prefix.exists() and any(layout.prefix.iterdir()) and not layout.manifest.exists():
        raise InstallError(f"{layout.prefix} exists and is not a Halaman installation; choose another --prefix")
    previous = read_json(layout.manifest)
    layout.prefix.mkdir(parents=True, exist_ok=True)
    for name, target in (("halaman_launcher", layout.lib / "halaman_launcher"), ("payload", layout.payload)):
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(source / "launch.py", layout.lib / "launch.py")
    python = base_python()
    _write_commands(layout, python)

    files: list[Path] = []
    bin_link = None
    registry = None
    if desktop_entry and is_windows():
        from halaman_launcher import windows

        icon = layout.payload / "halaman.ico"
        files += windows.install_shortcuts(layout.prefix, python, icon, release["version"])
        registry = windows.register_uninstall(layout.prefix, icon, release["version"], layout.uninstall_command)
    elif desktop_entry:
        template = (layout.payload / "halaman.desktop").read_text(encoding="utf-8")
        png = layout.payload / "halaman.png"
        files += desktop.install_entry(xdg_data_home(), template, layout.launcher_command,
                                       layout.payload / "halaman.svg", png if png.exists() else None)
    if bin_dir is not None:
        bin_link = _link_command(layout, bin_dir, out)

    write_json(layout.manifest, {
        "version": release["version"], "python": str(python), "prefix": str(layout.prefix),
        "installed_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "files": sorted(str(f) for f in files), "bin_link": str(bin_link) if bin_link else None,
        "registry": registry, "torch": torch if torch not in (None, "auto") else None,
    })
    choice = choose_torch(detect_nvidia(), override=torch)
    if not previous:
        over = ""
    elif previous.get("version") == release["version"]:
        over = " (installed again over the same version)"
    else:
        over = f" (replacing {previous.get('version')})"
    out(f"Installed Halaman {release['version']} in {layout.prefix}{over}")
    if files:
        out("  menu entry:  " + ", ".join(str(f) for f in files))
    out(f"  command:     {bin_link or layout.launcher_command}")
    out(f"  uninstall:   {layout.uninstall_command}")
    from halaman_launcher.prepare import is_ready

    if is_ready(layout):  # the same release over a prepared environment: nothing to download
        out("Its environment is already set up: Halaman starts at once.")
        return layout
    out(f"The first start sets up PyTorch ({choice.label}: {choice.reason}) and the default model: about "
        f"{format_size(choice.download_bytes)} to download and {format_size(choice.needed_bytes)} of free disk, "
        "a few minutes, with a progress window. Later starts are quick.")
    return layout


def _write_commands(layout: Layout, python: Path) -> None:
    """bin/halaman (run), bin/halaman-setup (prepare again), bin/halaman-uninstall."""
    layout.bin.mkdir(parents=True, exist_ok=True)
    launch = layout.lib / "launch.py"
    commands = {"halaman": "run", "halaman-setup": "prepare", "halaman-uninstall": "uninstall"}
    for name, action in commands.items():
        if is_windows():
            path = layout.bin / f"{name}.cmd"
            path.write_text(f'@echo off\r\n"{python}" -s "{launch}" {action} %*\r\n', encoding="utf-8")
        else:
            path = layout.bin / name
            path.write_text(
                "#!/bin/sh\n"
                f"# Halaman launcher ({action}); written by installer/halaman_launcher/install.py\n"
                f"exec {shlex.quote(str(python))} -s {shlex.quote(str(launch))} {action} \"$@\"\n",
                encoding="utf-8")
            path.chmod(0o755)


def _link_command(layout: Layout, bin_dir: Path, out) -> Path | None:
    """A `halaman` symlink in `bin_dir` (~/.local/bin), unless something else is there already."""
    link = bin_dir / "halaman"
    if link.is_symlink() and Path(os.readlink(link)) == layout.launcher_command:
        return link
    if link.exists() or link.is_symlink():
        out(f"  note: {link} exists and is not this installation's; left alone")
        return None
    bin_dir.mkdir(parents=True, exist_ok=True)
    link.symlink_to(layout.launcher_command)
    if str(bin_dir) not in os.environ.get("PATH", "").split(os.pathsep):
        out(f"  note: {bin_dir} is not on your PATH; run {layout.launcher_command} in a terminal, or add it to PATH")
    return link
