"""How the first-run preparation shows itself. PySide6 is not installed yet at that point, so:

1. a Tk window (Python's tkinter; missing on minimal Linux systems: Debian's python3-tk),
2. else a zenity progress dialog (present on most GNOME desktops),
3. else desktop notifications (notify-send) at the start and the end,
4. and on a terminal, or with no display at all, plain lines on the console.

Every reporter runs `work(reporter)` and shows what it reports: `step` (which of the steps),
`detail` (one line within it, with an optional fraction of the step done; a window shows every
one, the console only the `notable` ones and big downloads every 10 %) and `finish` (the result;
in a window the user reads it and presses "Start Halaman" or "Close"). The work runs in a worker
thread when a Tk window owns the main thread; a reporter's `cancelled` event is set when the user
closes the window or cancels the dialog. `HALAMAN_LAUNCHER_UI=tk|zenity|notify|console` forces one.
Everything is also written to the log file by prepare.py.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

TITLE = "Setting up Halaman"


class Reporter:
    """Base: console-free, silent. Subclasses show the events somewhere."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.cancelled = threading.Event()
        self.steps: list[str] = []

    def run(self, work):
        """Run `work(self)` and return its result."""
        return work(self)

    def start(self, steps: list[str], intro: str) -> None:
        self.steps = steps

    def step(self, index: int, text: str) -> None:
        pass

    def detail(self, text: str, fraction: float | None = None, notable: bool = False) -> None:
        pass

    def finish(self, ok: bool, message: str, lines: list[str]) -> bool:
        """Show the result. Returns whether to start Halaman now."""
        return ok


class ConsoleReporter(Reporter):
    """Numbered steps on stdout; download progress every 10 %."""

    def __init__(self, log_path: Path, stream=None) -> None:
        super().__init__(log_path)
        self.stream = stream or sys.stdout
        self._last_tenth = -1

    def _print(self, text: str) -> None:
        if self.stream is not None:
            print(text, file=self.stream, flush=True)

    def start(self, steps: list[str], intro: str) -> None:
        super().start(steps, intro)
        self._print(f"{TITLE}. {intro}\nLog: {self.log_path}")

    def step(self, index: int, text: str) -> None:
        self._last_tenth = -1
        self._print(f"[{index + 1}/{len(self.steps)}] {text}")

    def detail(self, text: str, fraction: float | None = None, notable: bool = False) -> None:
        if fraction is None:
            if notable:
                self._print(f"      {text}")
            return
        tenth = int(fraction * 10)
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self._print(f"      {text}")

    def finish(self, ok: bool, message: str, lines: list[str]) -> bool:
        self._print(("" if ok else "\nFAILED: ") + message)
        for line in lines:
            self._print(f"  {line}")
        return ok


class NotifyReporter(ConsoleReporter):
    """No window toolkit: a desktop notification at the start and at the end (notify-send)."""

    def start(self, steps: list[str], intro: str) -> None:
        super().start(steps, intro)
        _notify(TITLE, f"{intro}\nProgress: {self.log_path}")

    def finish(self, ok: bool, message: str, lines: list[str]) -> bool:
        super().finish(ok, message, lines)
        _notify("Halaman is ready" if ok else "Halaman could not be set up",
                message if ok else f"{message}\nLog: {self.log_path}", urgency="normal" if ok else "critical")
        return ok


def _notify(title: str, body: str, urgency: str = "normal") -> None:
    notify = shutil.which("notify-send")
    if notify:
        subprocess.run([notify, "--app-name=Halaman", f"--urgency={urgency}", "--icon=halaman", title, body],
                       check=False, timeout=10, capture_output=True)


class ZenityReporter(Reporter):
    """A zenity progress dialog; the result in a zenity info / error box."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self._dialog: subprocess.Popen | None = None
        self._percent = 0

    def start(self, steps: list[str], intro: str) -> None:
        super().start(steps, intro)
        self._dialog = subprocess.Popen(
            ["zenity", "--progress", f"--title={TITLE}", f"--text={intro}", "--percentage=0", "--auto-close",
             "--width=520"], stdin=subprocess.PIPE, text=True)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        code = self._dialog.wait()
        if code != 0:  # Cancel pressed or the dialog closed
            self.cancelled.set()

    def _send(self, *lines: str) -> None:
        if self._dialog and self._dialog.poll() is None:
            try:
                self._dialog.stdin.write("".join(f"{line}\n" for line in lines))
                self._dialog.stdin.flush()
            except OSError:
                pass

    def step(self, index: int, text: str) -> None:
        self._percent = int(100 * index / max(len(self.steps), 1))
        self._send(f"# Step {index + 1} of {len(self.steps)}: {text}", str(min(self._percent, 99)))

    def detail(self, text: str, fraction: float | None = None, notable: bool = False) -> None:
        self._send(f"# {text}")

    def finish(self, ok: bool, message: str, lines: list[str]) -> bool:
        if self._dialog and self._dialog.poll() is None:
            self._send("100")
            try:
                self._dialog.stdin.close()
            except OSError:
                pass
            self._dialog.wait(timeout=10)
        body = "\n".join([message, "", *lines, "", f"Log: {self.log_path}"])
        if ok:
            answer = subprocess.run(["zenity", "--question", "--title=Halaman is ready", f"--text={body}",
                                     "--ok-label=Start Halaman", "--cancel-label=Close", "--width=560"], check=False)
            return answer.returncode == 0
        subprocess.run(["zenity", "--error", "--title=Halaman could not be set up", f"--text={body}", "--width=560"],
                       check=False)
        return False


class TkReporter(Reporter):
    """A small Tk window: step, overall bar, one detail line; at the end the result and a button."""

    WEIGHTS_DEFAULT = 1.0

    def __init__(self, log_path: Path, weights: list[float] | None = None) -> None:
        super().__init__(log_path)
        self._events: queue.Queue = queue.Queue()
        self._answer = threading.Event()
        self._start_app = False
        self.weights = weights

    def run(self, work):
        import tkinter as tk
        from tkinter import ttk

        result: list = []

        def worker() -> None:
            try:
                result.append(work(self))
            except BaseException as exc:  # noqa: BLE001 - shown in the window, re-raised below
                result.append(exc)
                self._events.put(("finish", False, f"Unexpected error: {exc}", []))
            self._events.put(("quit-when-answered",))

        root = tk.Tk()
        root.title(TITLE)
        root.geometry("560x300")
        root.minsize(460, 260)
        _set_icon(root, self.log_path)
        frame = ttk.Frame(root, padding=16)
        frame.pack(fill="both", expand=True)
        heading = ttk.Label(frame, text=TITLE, font=("TkDefaultFont", 13, "bold"))
        heading.pack(anchor="w")
        intro = ttk.Label(frame, text="", wraplength=520, justify="left")
        intro.pack(anchor="w", pady=(4, 10))
        step_label = ttk.Label(frame, text="", wraplength=520, justify="left")
        step_label.pack(anchor="w")
        bar = ttk.Progressbar(frame, mode="determinate", maximum=1000)
        bar.pack(fill="x", pady=6)
        detail = ttk.Label(frame, text="", wraplength=520, justify="left", foreground="#555555")
        detail.pack(anchor="w")
        result_box = tk.Text(frame, height=7, wrap="word", relief="flat", background=root.cget("background"))
        buttons = ttk.Frame(frame)
        buttons.pack(side="bottom", fill="x", pady=(8, 0))
        state = {"step": 0, "finished": False}

        def overall(index: int, fraction: float) -> float:
            weights = self.weights or [self.WEIGHTS_DEFAULT] * max(len(self.steps), 1)
            done = sum(weights[:index]) + weights[index] * max(0.0, min(fraction, 1.0)) if index < len(weights) else sum(weights)
            return 1000 * done / sum(weights)

        def answer(start: bool) -> None:
            self._start_app = start
            self._answer.set()

        def on_close() -> None:
            if state["finished"]:
                answer(False)
                root.destroy()
            elif not self.cancelled.is_set():
                from tkinter import messagebox

                if messagebox.askyesno(TITLE, "Stop setting up Halaman? The next start continues where it stopped.",
                                       parent=root):
                    self.cancelled.set()
                    detail.configure(text="Stopping ...")

        def open_log() -> None:
            _open_path(self.log_path)

        def poll() -> None:
            try:
                while True:
                    event = self._events.get_nowait()
                    kind = event[0]
                    if kind == "start":
                        intro.configure(text=event[1])
                    elif kind == "step":
                        state["step"] = event[1]
                        step_label.configure(text=f"Step {event[1] + 1} of {len(self.steps)}: {event[2]}")
                        bar.configure(value=overall(event[1], 0.0))
                        detail.configure(text="")
                    elif kind == "detail":
                        detail.configure(text=event[1])
                        if event[2] is not None:
                            bar.configure(value=max(bar.cget("value"), overall(state["step"], event[2])))
                    elif kind == "finish":
                        _, ok, message, lines = event
                        state["finished"] = True
                        bar.configure(value=1000 if ok else bar.cget("value"))
                        step_label.configure(text=message, foreground="#1a7f37" if ok else "#b42318")
                        detail.configure(text=f"Log: {self.log_path}")
                        result_box.insert("1.0", "\n".join(lines))
                        result_box.configure(state="disabled")
                        result_box.pack(fill="both", expand=True, pady=(6, 0))
                        root.geometry("640x420")
                        for child in buttons.winfo_children():
                            child.destroy()
                        if ok:
                            ttk.Button(buttons, text="Start Halaman", command=lambda: (answer(True), root.destroy())).pack(side="right")
                        ttk.Button(buttons, text="Close", command=lambda: (answer(False), root.destroy())).pack(side="right", padx=6)
                        ttk.Button(buttons, text="Open the log", command=open_log).pack(side="left")
                        root.lift()
                    elif kind == "quit-when-answered" and not state["finished"]:
                        answer(False)
                        root.destroy()
                        return
            except queue.Empty:
                pass
            root.after(100, poll)

        ttk.Button(buttons, text="Cancel", command=on_close).pack(side="right")
        root.protocol("WM_DELETE_WINDOW", on_close)
        threading.Thread(target=worker, daemon=True).start()
        root.after(100, poll)
        root.mainloop()
        self._answer.set()  # the window is gone: nobody will press a button
        while not result:  # window closed mid-work: wait for the worker to stop (it sees `cancelled`)
            self.cancelled.set()
            time.sleep(0.1)
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def start(self, steps: list[str], intro: str) -> None:
        super().start(steps, intro)
        self._events.put(("start", intro))

    def step(self, index: int, text: str) -> None:
        self._events.put(("step", index, text))

    def detail(self, text: str, fraction: float | None = None, notable: bool = False) -> None:
        self._events.put(("detail", text, fraction))

    def finish(self, ok: bool, message: str, lines: list[str]) -> bool:
        self._events.put(("finish", ok, message, lines))
        self._answer.wait()
        return self._start_app


def _set_icon(root, log_path: Path) -> None:
    """The Halaman icon on the Tk window when a PNG-capable Tk finds one (best effort)."""
    icon = log_path.parent.parent / "payload" / "halaman.png"
    if icon.exists():
        try:
            import tkinter as tk

            root.iconphoto(True, tk.PhotoImage(file=str(icon)))
        except Exception:  # noqa: BLE001, S110 - an icon is not worth failing for
            pass


def _open_path(path: Path) -> None:
    try:
        if sys.platform == "win32":
            os.startfile(str(path))
        else:
            subprocess.Popen(["xdg-open", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        pass


def has_display() -> bool:
    if sys.platform == "win32" or sys.platform == "darwin":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def on_terminal() -> bool:
    return sys.stdout is not None and sys.stdout.isatty()


def tk_available() -> bool:
    try:
        import tkinter  # noqa: F401
    except ImportError:
        return False
    return True


def choose_reporter(log_path: Path, weights: list[float] | None = None, prefer: str | None = None) -> Reporter:
    """The best way to show progress here (see the module docstring)."""
    ui = (prefer or os.environ.get("HALAMAN_LAUNCHER_UI") or "auto").lower()
    if ui == "auto":
        if on_terminal() or not has_display():
            ui = "console"
        elif tk_available():
            ui = "tk"
        elif shutil.which("zenity"):
            ui = "zenity"
        else:
            ui = "notify"
    if ui == "tk":
        return TkReporter(log_path, weights)
    if ui == "zenity":
        return ZenityReporter(log_path)
    if ui == "notify":
        return NotifyReporter(log_path)
    return ConsoleReporter(log_path)
