"""The two strips above the chat: the banner (an error, a warning or a note, with an optional action)
and the progress panel (what the running job is doing, with a bar, the ETA and Cancel)."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.units import fmt_duration
from app.untrusted import plain_label
from engine.progress import CONVERTING_MODEL_UNIT, Phase, Progress

TICK_MS = 500
"""How often the ETA counts down between two progress events (a prefill chunk can take a minute)."""


class TimeLeft:
    """The one time estimate of a read in progress, counted down between two progress events. The
    progress line, the header and the library row all show `seconds` (the value of the last
    `tick`), so they say the same at the same moment: the header kept an event's figure ("about
    12 min 19 s") while the progress line counted down to another.

    `update(eta_s)`: a progress event's ETA (seconds, None when not measured yet). `tick()`: count
    down to now (the panel's timer, every `TICK_MS`). `freeze()`: the read paused (a question runs):
    the figure stays where it was until the next event."""

    def __init__(self) -> None:
        self._eta_s: float | None = None
        self._at = 0.0
        self._running = False
        self.seconds: float | None = None  # what every view shows, whole seconds

    def update(self, eta_s: float | None) -> None:
        self._eta_s, self._at, self._running = eta_s, time.monotonic(), eta_s is not None
        self.tick()

    def tick(self) -> None:
        if self._running and self._eta_s is not None:
            self.seconds = float(max(0, round(self._eta_s - (time.monotonic() - self._at))))
        elif self._eta_s is None:
            self.seconds = None

    def freeze(self) -> None:
        if self._running:
            self.tick()
            self._eta_s, self._running = self.seconds, False

    def clear(self) -> None:
        self._eta_s, self._running, self.seconds = None, False, None


class Banner(QFrame):
    """A one-line message above the chat: errors (red), warnings (amber), info (blue), with an
    optional action button that runs `callback` (and hides the banner)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = plain_label()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action = QPushButton()
        self.action.hide()
        close = QPushButton("Dismiss")
        close.setFlat(True)
        close.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        layout.addWidget(close)
        self.kind = ""
        self.document_id: int | None = None
        self._callback = None
        self.action.clicked.connect(self._act)
        self.hide()

    def show_message(self, kind: str, text: str, action: str | None = None, callback=None, *,
                     document_id: int | None = None) -> None:
        """kind: "error", "warning" or "info" (the colour). `document_id`: the library document the
        message is about (its open's warnings, its answer's or read's error), hidden when the chat
        shows another one (`follow`); None: about the app (the model, the settings), kept."""
        self.kind, self.document_id = kind, document_id
        self.setProperty("kind", kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        self._callback = callback
        self.action.setVisible(bool(action))
        if action:
            self.action.setText(action)
        self.show()

    def follow(self, document_id: int | None) -> None:
        """The chat shows library document `document_id` now: a message about another goes."""
        if self.document_id is not None and document_id != self.document_id:
            self.hide()

    @property
    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""

    def _act(self) -> None:
        self.hide()
        if self._callback:
            self._callback()


class ProgressPanel(QFrame):
    """Progress of the running job: a bar, what it is doing (tokens done / total, tokens/s, ETA) and
    Cancel (emits `cancel_clicked`). `show_event` renders the engine's `Progress` events; between two
    of them a timer counts the ETA down and the model load's elapsed time up."""

    cancel_clicked = Signal()
    ticked = Signal()
    """The time left (`time_left`) was counted down: the header and the library row redraw it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("progressPanel")
        self.label = plain_label()
        self.label.setObjectName("progressLabel")
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(10)
        self.cancel = QPushButton("Cancel")
        self.cancel.setToolTip("Stop reading or answering (Esc)")
        self.cancel.clicked.connect(self.cancel_clicked)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.cancel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        layout.addLayout(top)
        layout.addWidget(self.bar)
        self.model_name = "the model"
        self._last_prefill: Progress | None  # the read whose time left the timer counts down = None
        self._loading_since: float | None = None
        self._converting = False             # the model being loaded is converted first
        self.time_left = TimeLeft()          # the running read's time left, shared with the header
        self.timer = QTimer(self)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self._tick)
        self.hide()

    # ------------------------------------------------------------- plain states
    def set_busy(self, text: str) -> None:
        """An indeterminate bar with `text`."""
        self.label.setText(text)
        self.bar.setRange(0, 0)
        self.show()

    def set_progress(self, text: str, done: int, total: int) -> None:
        self.label.setText(text)
        self.bar.setRange(0, max(total, 1))
        self.bar.setValue(min(done, total))
        self.show()

    def job_started(self, title: str | None) -> None:
        """A job began: show its title, or hide for a quiet background job (title None)."""
        self._stop_prefill()
        if title:
            self.set_busy(title)
            self.timer.start()
        else:
            self.finish()

    def finish(self) -> None:
        """Nothing runs any more."""
        self._stop_prefill()
        self.timer.stop()
        self.hide()

    def cancelling(self) -> None:
        self._stop_prefill()  # the ETA tick would overwrite it
        self.label.setText("Cancelling…")

    # ---------------------------------------------------------- engine events
    def show_event(self, event: Progress) -> None:
        """Render a progress event of opening a document or loading the model."""
        self._stop_prefill()
        if event.phase is Phase.LOADING_MODEL:
            self._loading_since = time.monotonic()
            self._converting = event.unit == CONVERTING_MODEL_UNIT
            self._tick()
        elif event.phase is Phase.READING:
            if event.total > 1:
                self.set_progress(f"Reading {event.unit} {event.done:,} / {event.total:,}", event.done, event.total)
            else:
                self.set_busy("Reading the document…")
        elif event.phase is Phase.TOKENIZING:
            self.set_busy("Splitting the text into tokens…")
        elif event.phase is Phase.LOADING_CACHE:
            if event.done >= event.total:
                self.set_progress("Restoring its saved reading: no need to read it again", 1, 1)
            else:
                self.set_busy("Looking for a saved reading of this document…")
        elif event.phase is Phase.PREFILL:
            self.time_left.update(event.eta_s if event.done < event.total else None)
            self._show_prefill(event)
            if event.done < event.total:
                self._last_prefill = event

    def show_rereading(self, event: Progress) -> str:
        """An answer re-reads its chosen pages before its first word (`Phase.REREADING`): "Reading
        the chosen pages… 40 %", as a bar. Returns the text shown."""
        self._stop_prefill()
        percent = 100 * event.done // max(event.total, 1)
        text = f"Reading the chosen pages… {percent} %"
        if event.eta_s is not None and event.done < event.total:
            text += f" · about {fmt_duration(event.eta_s)} left"
        self.set_progress(text, event.done, event.total)
        return text

    def show_answering(self, text: str) -> None:
        self._stop_prefill()
        self.set_busy(text)

    def _stop_prefill(self) -> None:
        """Another phase or job is shown: the read's time left stays where it was (`TimeLeft.freeze`)."""
        self._last_prefill = self._loading_since = None
        self.time_left.freeze()

    def _show_prefill(self, event: Progress) -> None:
        seconds = self.time_left.seconds
        left = f"{fmt_duration(seconds)} left" if seconds is not None else "estimating the time left…"
        self.set_progress(f"Reading the document: {event.done:,} of {event.total:,} tokens · "
                          f"{event.tokens_per_s:,.1f} tokens/s · {left}", event.done, event.total)

    def _tick(self) -> None:
        if self._last_prefill is not None:
            self.time_left.tick()
            self._show_prefill(self._last_prefill)
            self.ticked.emit()
        if self._loading_since is not None:
            elapsed = time.monotonic() - self._loading_since
            first = " (its first start converts it, once)" if self._converting else ""
            self.set_busy(f"Loading the model ({self.model_name}) — {fmt_duration(elapsed)}{first}")
