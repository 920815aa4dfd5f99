"""Settings › Model: the curated models (engine.models.catalog) with their sizes and whether they fit
this machine, and a Download button with progress, speed, time left and Cancel.

The download itself is `engine.models.download.pull`, run on a thread of its own (not the engine
worker's: a download must neither wait behind a long prefill nor hold one up). It reports through
`_Relay`'s signals, which Qt queues to the GUI thread; nothing here touches a widget from that thread.
When a model is downloaded (or an already downloaded one is picked with Use), `model_chosen` emits
its hub repository, which is what the settings' `model` field takes.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QHBoxLayout, QHeaderView, QProgressBar, QPushButton, QTableWidget,
    QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.untrusted import plain_label
from engine.errors import Cancelled, HalamanError
from engine.models.catalog import CatalogModel, DeviceMemory, Fit, detect_memory, fit, load_catalog
from engine.models.download import DownloadProgress, downloaded_folder, partial_bytes, pull
from engine.models.expected_speed import ExpectedSpeed, expected_speed, machine_factor, recommended
from engine.settings import EngineSettings
from engine.units import format_bytes

# "Here" (the recommended mark and the speed on this machine) beside the name: the table scrolls
# sideways at 800 px, and at the right end the mark was off screen ("★ recommende"). The KV cache's
# bytes per token are in each row's tooltip, not a column of jargon.
COLUMNS = ("Model", "Here", "Fits", "Parameters", "Download", "Weights", "On disk")
WEIGHTS_COLUMN = COLUMNS.index("Weights")
FITS_COLUMN = COLUMNS.index("Fits")
HERE_COLUMN = COLUMNS.index("Here")
RECOMMENDED = "★ recommended here"
WEIGHTS_HEADER_TIP = ("The memory the weights take once loaded on this machine, not the download: on a CPU, int4 "
                      "keeps the embeddings in float32 and, where the CPU has AVX-512 BF16, for a model of at most "
                      "1 GiB at bfloat16 a bfloat16 copy of the layers that reading a document uses, so a small "
                      "model can take more than it downloads.")


def weights_tip(verdict: Fit) -> str:
    """The Weights cell's tooltip: what its bytes are made of (int4 on a CPU), else how they are held."""
    if not verdict.weights_parts:
        return f"{format_bytes(verdict.weights_bytes)} as {verdict.weights_label} weights, loaded on this machine"
    parts = "\n".join(f"  {format_bytes(size)}: {what}" for what, size in verdict.weights_parts)
    note = f"\n{verdict.weights_note[0].upper()}{verdict.weights_note[1:]}." if verdict.weights_note else ""
    return f"{format_bytes(verdict.weights_bytes)} once loaded ({verdict.weights_label}):\n{parts}{note}"


def here_text(speed: ExpectedSpeed | None, is_recommended: bool) -> str:
    """The Here cell: how fast answers come on this machine ("~6 tokens/s answering"; "may be slow
    here" below `RECOMMENDED_ANSWER_TOKENS_PER_S`), and the recommended mark."""
    mark = f"{RECOMMENDED}\n" if is_recommended else ""  # its own line: beside the speed it was cut ("★ recommende…")
    if speed is None:
        return f"{mark}not estimated on a GPU"
    slow = " (may be slow here)" if speed.answer_tokens_per_s < 3.0 else ""
    return f"{mark}~{speed.answer_tokens_per_s:,.0f} tokens/s answering{slow}"


def here_tip(speed: ExpectedSpeed | None, is_recommended: bool) -> str:
    """The Here cell's tooltip: both rates, where they come from, and why the mark."""
    why = ("\nRecommended: the largest model that fits this machine and still answers at a few words a second."
           if is_recommended else "")
    if speed is None:
        return "Speeds are estimated for the CPU only: nothing was measured on a GPU yet." + why
    return f"Estimated on this computer: {speed.describe()}." + why


class _Relay(QObject):
    """Signals the download thread emits; connected to the widget in the GUI thread."""

    progress = Signal(object)   # DownloadProgress
    finished = Signal(str)      # repo
    failed = Signal(str)        # one-line message


class ModelList(QWidget):
    """The model table, Download / Use, Cancel, and a progress line.

    `models` defaults to the bundled catalog; `memory` to this machine's GPU or RAM for the
    settings' device. `set_settings` recomputes "fits" for a changed cache budget or device.
    """

    model_chosen = Signal(str)

    def __init__(self, settings: EngineSettings, *, models: list[CatalogModel] | None = None,
                 memory: DeviceMemory | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.models = models if models is not None else load_catalog()
        self.memory = memory
        self.settings = settings
        self.cancel_event: threading.Event | None = None
        self.downloading: str | None = None
        self.relay = _Relay()
        self.relay.progress.connect(self._progress)
        self.relay.finished.connect(self._finished)
        self.relay.failed.connect(self._failed)

        self.table = QTableWidget(len(self.models), len(COLUMNS))
        self.table.setObjectName("modelTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeaderItem(WEIGHTS_COLUMN).setToolTip(WEIGHTS_HEADER_TIP)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)  # two-line cells
        self.table.setMinimumHeight(130)
        # Every column as wide as its text, none stretched to what is left: at 800x600 the last one
        # ("Here") was squeezed and elided ("★ recommende…"); the table scrolls sideways instead.
        self.table.horizontalHeader().setStretchLastSection(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.table.setWordWrap(False)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setVisible(False)
        self.status = plain_label()
        self.status.setObjectName("modelStatus")
        self.status.setWordWrap(True)

        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.bar, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table)
        layout.addLayout(buttons)
        layout.addWidget(self.status)

        self.download_button.clicked.connect(self._download_or_use)
        self.cancel_button.clicked.connect(self.cancel)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self.set_settings(settings)

    # ------------------------------------------------------------ table
    def set_settings(self, settings: EngineSettings) -> None:
        """Fill the table for `settings` (its cache policy, recall and device decide "fits")."""
        if self.memory is None or settings.device != self.settings.device:
            self.memory = detect_memory(settings.device)
        self.settings = settings
        verdicts = [fit(model, settings, self.memory) for model in self.models]
        factor = machine_factor(self.models, self.memory.device)
        self.speeds = [expected_speed(model, self.memory.device, factor) for model in self.models]
        self.recommended = recommended(self.models, self.speeds, [verdict.fits for verdict in verdicts])
        for row, (model, verdict, speed) in enumerate(zip(self.models, verdicts, self.speeds)):
            cells = (model.name, here_text(speed, row == self.recommended), "yes" if verdict.fits else "no",
                     f"{model.parameters / 1e9:.2f} B", f"≈ {format_bytes(model.download_bytes)}",
                     f"{format_bytes(verdict.weights_bytes)} {verdict.weights_label}", self._state(model))
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{model.repo}: {verdict.reason}; the document's memory (KV cache) takes "
                                f"{model.kv_bytes_per_token / 1024:,.0f} KiB per token kept"
                                + (" (gated: accept its licence on the hub and log in with `hf auth login`)"
                                   if model.gated else ""))
                if column == WEIGHTS_COLUMN:
                    item.setToolTip(weights_tip(verdict))
                if column == HERE_COLUMN:
                    item.setToolTip(here_tip(speed, row == self.recommended))
                if column == FITS_COLUMN and not verdict.fits:
                    item.setForeground(Qt.GlobalColor.darkRed)
                self.table.setItem(row, column, item)
        self._update_buttons()

    def select(self, key: str) -> None:
        """Select the row of the model whose id or repository is `key`."""
        for row, model in enumerate(self.models):
            if key in (model.id, model.repo):
                self.table.selectRow(row)

    def selected(self) -> CatalogModel | None:
        rows = self.table.selectionModel().selectedRows()
        return self.models[rows[0].row()] if rows else None

    @staticmethod
    def _state(model: CatalogModel) -> str:
        if downloaded_folder(model.repo):
            return "downloaded"
        partial = partial_bytes(model.repo)
        return f"partial {format_bytes(partial)}" if partial else "embedded (the default model)" if model.embedded else ""

    def _update_buttons(self) -> None:
        model = self.selected()
        busy = self.downloading is not None
        self.download_button.setEnabled(model is not None and not busy)
        ready = model is not None and downloaded_folder(model.repo) is not None
        resume = model is not None and not ready and partial_bytes(model.repo) > 0
        self.download_button.setText("Use" if ready else "Resume download" if resume else "Download")
        self.cancel_button.setEnabled(busy)

    def _selection_changed(self) -> None:
        self._update_buttons()
        model = self.selected()
        if model is not None and self.downloading is None:  # a running download keeps its progress line
            speed = self.speeds[self.models.index(model)]
            here = f"; {speed.describe()}" if speed is not None else ""
            self.status.setText(f"{model.repo}: {fit(model, self.settings, self.memory).reason}{here}.")

    # --------------------------------------------------------- download
    def _download_or_use(self) -> None:
        model = self.selected()
        if model is None:
            return
        if downloaded_folder(model.repo):
            self.model_chosen.emit(model.repo)
            return
        self.download(model.repo)

    def download(self, repo: str) -> None:
        """Start downloading `repo` on a thread of its own; progress shows below the table."""
        self.downloading = repo
        self.cancel_event = threading.Event()
        self.bar.setValue(0)
        self.bar.setVisible(True)
        self.status.setText(f"{repo}: asking the hub for its files…")
        self._update_buttons()
        threading.Thread(target=self._run, args=(repo, self.cancel_event), name=f"download {repo}", daemon=True).start()

    def _run(self, repo: str, cancel: threading.Event) -> None:
        """On the download thread: only signals leave it."""
        try:
            pull(repo, progress=self.relay.progress.emit, cancel=cancel)
        except Cancelled:
            self.relay.failed.emit(f"{repo}: download cancelled; what arrived is kept, Resume continues it.")
        except HalamanError as exc:
            self.relay.failed.emit(str(exc))
        except Exception as exc:  # noqa: BLE001 - a thread must not die silently
            self.relay.failed.emit(f"{repo}: download failed ({type(exc).__name__}: {exc})")
        else:
            self.relay.finished.emit(repo)

    def cancel(self) -> None:
        """Stop the running download (its partial file stays for a resume)."""
        if self.cancel_event is not None:
            self.cancel_event.set()

    def _progress(self, progress: DownloadProgress) -> None:
        self.bar.setValue(int(1000 * progress.fraction))
        self.status.setText(f"{progress.repo}: {progress.summary()}")

    def _finished(self, repo: str) -> None:
        self._done()
        self.status.setText(f"{repo} is downloaded and verified; it is now the chosen model (Save to switch).")
        self.model_chosen.emit(repo)

    def _failed(self, message: str) -> None:
        self._done()
        self.status.setText(message)

    def _done(self) -> None:
        self.downloading = None
        self.cancel_event = None
        self.bar.setVisible(False)
        self.set_settings(self.settings)


__all__ = ["ModelList"]
