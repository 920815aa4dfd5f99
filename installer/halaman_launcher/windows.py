"""Windows: the Start-menu shortcut and the "Installed apps" entry. NOT TESTED on Windows (the
project's machines run Linux); written to the documented interfaces, see installer/README.md.

- The shortcut (`%APPDATA%\\Microsoft\\Windows\\Start Menu\\Programs\\Halaman.lnk`) runs the base
  Python's `pythonw.exe` (no console window) on `<prefix>\\lib\\launch.py run`; it is written by
  PowerShell through the WScript.Shell COM object, the long-standing way to make a .lnk.
- The entry under `HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Uninstall\\Halaman` lets
  Settings > Apps remove Halaman; it runs `<prefix>\\bin\\halaman-uninstall.cmd`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

UNINSTALL_KEY = r"Software\Microsoft\Windows\CurrentVersion\Uninstall\Halaman"


def start_menu_dir() -> Path:
    appdata = os.environ.get("APPDATA") or str(Path.home() / "AppData" / "Roaming")
    return Path(appdata) / "Microsoft" / "Windows" / "Start Menu" / "Programs"


def pythonw_for(python: Path) -> Path:
    """pythonw.exe next to python.exe (python.org and the Python install manager ship both)."""
    candidate = python.with_name("pythonw.exe")
    return candidate if candidate.exists() else python


def _ps_quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_shortcut(link: Path, target: Path, arguments: str, icon: Path, working_dir: Path, description: str) -> None:
    script = (
        "$s = (New-Object -ComObject WScript.Shell).CreateShortcut(" + _ps_quote(str(link)) + ");"
        f"$s.TargetPath = {_ps_quote(str(target))};"
        f"$s.Arguments = {_ps_quote(arguments)};"
        f"$s.IconLocation = {_ps_quote(str(icon) + ',0')};"
        f"$s.WorkingDirectory = {_ps_quote(str(working_dir))};"
        f"$s.Description = {_ps_quote(description)};"
        "$s.Save()"
    )
    link.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["powershell", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-Command", script],
                   check=True, capture_output=True, text=True, creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0))


def install_shortcuts(prefix: Path, python: Path, icon: Path, version: str) -> list[Path]:
    """The Start-menu shortcut to Halaman. Returns the files written."""
    link = start_menu_dir() / "Halaman.lnk"
    launch = prefix / "lib" / "launch.py"
    create_shortcut(link, pythonw_for(python), f'-s "{launch}" run', icon, Path.home(),
                    "Ask questions about whole documents with a small local language model")
    return [link]


def register_uninstall(prefix: Path, icon: Path, version: str, uninstall_command: Path) -> str:
    """The Settings > Apps entry (per user, no administrator rights). Returns the registry key."""
    import winreg

    with winreg.CreateKey(winreg.HKEY_CURRENT_USER, UNINSTALL_KEY) as key:
        values = {
            "DisplayName": "Halaman",
            "DisplayVersion": version,
            "Publisher": "Halaman",
            "DisplayIcon": str(icon),
            "InstallLocation": str(prefix),
            "UninstallString": f'"{uninstall_command}"',
        }
        for name, value in values.items():
            winreg.SetValueEx(key, name, 0, winreg.REG_SZ, value)
        winreg.SetValueEx(key, "NoModify", 0, winreg.REG_DWORD, 1)
        winreg.SetValueEx(key, "NoRepair", 0, winreg.REG_DWORD, 1)
    return "HKCU\\" + UNINSTALL_KEY


def unregister_uninstall() -> None:
    import winreg

    try:
        winreg.DeleteKey(winreg.HKEY_CURRENT_USER, UNINSTALL_KEY)
    except OSError:
        pass
