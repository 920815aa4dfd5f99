"""The Halaman launcher: installs a small payload, prepares the Python environment on first start,
then starts Halaman. Standard library only: it runs on the system's Python before anything else is
installed (see installer/README.md for the design).

    layout.py      where an installation lives (prefix, environment, marker, user data folders)
    torch_choice.py  NVIDIA GPU or not -> which torch build and from which index
    prepare.py     the first-run preparation: disk check, venv, pip, torch, wheel, model, self-test
    progress.py    how the user sees it: a Tk window, zenity, notify-send, or the console; always a log
    install.py     copy the payload, write the launcher scripts, the desktop entry / Start-menu shortcut
    desktop.py     XDG desktop entry and icon (Linux)
    windows.py     Start-menu shortcut and "Installed apps" entry (Windows)
    uninstall.py   remove what install.py and prepare.py made; ask before deleting the user's data
    __main__.py    the command line: install | run | prepare | status | uninstall
"""
