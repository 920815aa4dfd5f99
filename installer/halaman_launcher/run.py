"""Start Halaman: the fast path reads the marker and starts the app; otherwise prepare first.

A start from the desktop has no terminal to show errors in, so the app is started with its output
going to <prefix>/logs/app.log and watched for a few seconds: if it dies at once (a missing system
library for Qt is the usual reason) the user gets a message instead of nothing; a document given by
"Open with Halaman" (the desktop entry's `%f`) is passed on. From a terminal, or for a command
(`halaman ask ...`), the launcher simply becomes the app (exec), after one line saying the window is
on its way when it is.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from halaman_launcher import qt_system
from halaman_launcher.layout import Layout, is_windows
from halaman_launcher.progress import choose_reporter, has_display, on_terminal, tk_available

EARLY_EXIT_WATCH_S = 15.0
QT_LIBS_HINT = f"On Debian / Ubuntu the Qt libraries it needs come with: {qt_system.apt_command()}"


def run(layout: Layout, args: list[str]) -> int:
    from halaman_launcher import prepare

    if not prepare.is_ready(layout):
        window = opens_window(args)
        ok, start = prepare_with_ui(layout, start_offer=window)
        if not ok:
            return 1
        if args[:1] == ["--self-test"] and len(args) == 1:
            return 0  # the preparation ended with the self-test and showed its figures
        if window and not start:
            return 0
    return start_app(layout, args)


def opens_window(args: list[str]) -> bool:
    """Whether `halaman ARGS` opens the window: no arguments, or one existing file or folder given
    as a path (the desktop entry's `%f` is always absolute; CLI commands never hold a separator)."""
    if not args:
        return True
    if len(args) != 1:
        return False
    path = args[0]
    has_separator = os.sep in path or bool(os.altsep and os.altsep in path)
    return has_separator and os.path.exists(path)


def prepare_with_ui(layout: Layout, *, torch: str | None = None, force: bool = False,
                    start_offer: bool = True) -> tuple[bool, bool]:
    """Prepare under a lock with the best progress display. `torch` ("auto", "cpu", "cuda") is
    remembered for later preparations. Returns (ready, start the app now)."""
    from halaman_launcher import prepare
    from halaman_launcher.layout import read_json, write_json

    if torch is not None:
        manifest = read_json(layout.manifest)
        write_json(layout.manifest, {**manifest, "torch": None if torch == "auto" else torch})

    layout.prefix.mkdir(parents=True, exist_ok=True)
    with _Lock(layout.lock) as locked:
        if not locked:
            show_message(layout, "Halaman is being set up already",
                         "Another start of Halaman is setting it up right now; its window shows the progress.",
                         error=True)
            return False, False
        if not force and prepare.is_ready(layout):  # another start finished it while we waited
            return True, start_offer
        weights = [weight for _, _, weight in prepare.STEPS]
        reporter = choose_reporter(layout.logs / "prepare.log", weights)

        def work(reporter):
            result = prepare.prepare(layout, reporter)
            start = reporter.finish(result.ok, result.message, result.lines)
            return result.ok, bool(start and start_offer)

        return reporter.run(work)


def start_app(layout: Layout, args: list[str]) -> int:
    """Become Halaman in a terminal (saying so in one line when that opens the window, which takes
    seconds) or for a CLI command; from the desktop, start the window watched (`_start_watched`)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    window = opens_window(args)
    if on_terminal() or not window:
        if on_terminal() and window:
            print(f"Starting Halaman{f' on {os.path.basename(args[0])}' if args else ''}: "
                  "the window opens in a few seconds.", flush=True)
        if is_windows():
            return subprocess.call([str(layout.env_script("halaman")), *args], env=env)
        program = str(layout.env_script("halaman"))
        os.execve(program, [program, *args], env)
    return _start_watched(layout, env, args)


def _start_watched(layout: Layout, env: dict, args: list[str]) -> int:
    """Start the window (on `args`: a document to open) detached, its output to logs/app.log;
    report an immediate failure."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    log_path = layout.logs / "app.log"
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - handed to the child
    if is_windows():
        command = [str(layout.env_python(windowed=True)), "-m", "app.entry", *args]
        flags = {"creationflags": subprocess.DETACHED_PROCESS | subprocess.CREATE_NEW_PROCESS_GROUP}
    else:
        command = [str(layout.env_script("halaman")), *args]
        flags = {"start_new_session": True}
    log.write(f"launcher: {datetime.datetime.now().isoformat(timespec='seconds')} starting {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, **flags)
    log.write(f"launcher: pid {process.pid}\n")
    log.flush()
    log.close()
    deadline = time.monotonic() + float(os.environ.get("HALAMAN_LAUNCHER_WATCH_S", EARLY_EXIT_WATCH_S))
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            if code == 0:
                return 0
            tail = _tail(log_path)
            hint = f"\n\n{QT_LIBS_HINT}" if "xcb" in tail or "Qt platform plugin" in tail or "libEGL" in tail else ""
            show_message(layout, "Halaman could not start",
                         f"Halaman stopped right after starting (exit status {code}):\n\n{tail}{hint}\n\n"
                         f"Log: {log_path}", error=True)
            return code
        time.sleep(0.2)
    return 0


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines() if not line.startswith("launcher:"))[-1500:].strip() or \
        "\n".join(text.splitlines()[-lines:])


def show_message(layout: Layout, title: str, message: str, error: bool = False) -> None:
    """A message box where there is a display (Tk, zenity, notify-send), else stderr."""
    print(f"{title}: {message}", file=sys.stderr)
    if on_terminal() or not has_display():
        return
    if tk_available():
        try:
            import tkinter as tk
            from tkinter import messagebox

            root = tk.Tk()
            root.withdraw()
            (messagebox.showerror if error else messagebox.showinfo)(title, message, parent=root)
            root.destroy()
            return
        except Exception:  # noqa: BLE001, S110 - no usable display after all: fall through
            pass
    if shutil.which("zenity"):
        subprocess.run(["zenity", "--error" if error else "--info", f"--title={title}", f"--text={message}",
                        "--width=560"], check=False)
    elif shutil.which("notify-send"):
        subprocess.run(["notify-send", "--app-name=Halaman", "--icon=halaman", title, message], check=False)


class _Lock:
    """An exclusive, non-blocking lock on a file: one preparation at a time. The file exists only
    while a preparation holds it (it is deleted on the way out, still locked)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = None

    def __enter__(self) -> bool:
        for _ in range(10):
            self.handle = open(self.path, "a+b")  # noqa: SIM115 - closed in __exit__
            try:
                if is_windows():
                    import msvcrt

                    self.handle.seek(0)
                    msvcrt.locking(self.handle.fileno(), msvcrt.LK_NBLCK, 1)
                else:
                    import fcntl

                    fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.handle.close()
                self.handle = None
                return False
            if is_windows() or self._still_the_file():
                return True
            self.handle.close()  # locked a file its holder deleted as it finished: lock the new one
        self.handle = None
        return False

    def _still_the_file(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self.handle.fileno()).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc) -> None:
        if self.handle is None:
            return
        if not is_windows():  # delete before unlocking, so no one locks the name being deleted
            self.path.unlink(missing_ok=True)
        self.handle.close()  # closing releases the lock
        if is_windows():  # Windows cannot delete a file that is open
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass
