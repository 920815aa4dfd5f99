"""The settings dialog: model, device, KV cache policy (with the memory it implies, live), recall
(the archive on disk and what a question may bring back from it, with its memory and disk size,
live), prefix cache, and the cloud fallback. Saves with `engine.settings.save_settings` (TOML in the config dir);
the cloud API key goes to the OS keyring (`engine.secrets`), never into the settings file.

Validation is the engine's own (`EngineSettings.validate`, `CachePolicy.validate`): its message is
shown in the dialog and OK does nothing until the values are valid.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QApplication, QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox,
    QFrame, QHBoxLayout, QLabel, QLineEdit, QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget,
)

from app.model_list import ModelList
from engine.units import format_bytes
from engine import secrets
from engine.errors import HalamanError, SettingsError
from engine.estimate import KNOWN_SHAPES, estimate
from engine.models.catalog import CatalogModel, DeviceMemory
from engine.models.profile import ModelProfile
from engine.settings import EngineSettings, save_settings

MODEL_KINDS = [
    ("default", "Embedded default (SmolLM2-135M-Instruct)"),
    ("gguf", "GGUF file"),
    ("folder", "Hugging Face model folder"),
    ("hub", "Hugging Face hub id (downloads once)"),
]
DEVICES = [("auto", "Auto (CUDA when available)"), ("cuda", "CUDA GPU"), ("cpu", "CPU")]
MIB = 1024 * 1024
# Without an open document, the archive's disk size is shown for this many tokens.
ARCHIVE_PER_TOKENS = 100_000


def model_kind(spec: str) -> str:
    if spec == "default":
        return "default"
    if spec.lower().endswith(".gguf"):
        return "gguf"
    if Path(spec).expanduser().is_dir() or spec.startswith(("/", "~", ".")):
        return "folder"
    return "hub"


def _spin(low: int, high: int, step: int = 1, suffix: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setGroupSeparatorShown(True)
    if suffix:
        box.setSuffix(suffix)
    return box


class SettingsDialog(QDialog):
    """Edit and save settings. After `exec()` returns Accepted, `saved` holds what was saved."""

    clear_cache_requested = Signal()

    def __init__(self, settings: EngineSettings, *, profile: ModelProfile | None = None,
                 cache_usage: tuple[int, int] | None = None, parent: QWidget | None = None,
                 settings_file: Path | None = None, document_tokens: int | None = None,
                 models: list[CatalogModel] | None = None, memory: DeviceMemory | None = None) -> None:
        """`document_tokens`: the open document's length, to size its archive (else per 100,000 tokens).
        `models` / `memory`: the model list and the device it is fitted to (default: the bundled
        list, this machine)."""
        super().__init__(parent)
        self.setWindowTitle("Halaman settings")
        self.setModal(True)
        self.original = settings
        self.saved: EngineSettings | None = None
        self.profile = profile or KNOWN_SHAPES["smollm2-135m"]
        self.profile_name = "the loaded model" if profile else "SmolLM2-135M (model not loaded yet)"
        self.settings_file = settings_file
        self.document_tokens = document_tokens

        # -- model
        self.model_kind = QComboBox()
        for key, text in MODEL_KINDS:
            self.model_kind.addItem(text, key)
        self.model_path = QLineEdit()
        self.model_browse = QPushButton("Browse…")
        self.device = QComboBox()
        for key, text in DEVICES:
            self.device.addItem(text, key)
        self.max_new_tokens = _spin(1, 8192, 16, " tokens")
        model_box = QGroupBox("Model")
        form = QFormLayout(model_box)
        form.addRow("Model", self.model_kind)
        row = QHBoxLayout()
        row.addWidget(self.model_path, 1)
        row.addWidget(self.model_browse)
        form.addRow("File, folder or id", row)
        form.addRow("Device", self.device)
        form.addRow("Longest answer", self.max_new_tokens)
        self.model_list = ModelList(settings, models=models, memory=memory)
        self.model_list.select(settings.model)
        self.model_list.model_chosen.connect(self._use_listed_model)
        self.finished.connect(self.model_list.cancel)  # closing the dialog stops a download (it can resume)
        models_box = QGroupBox("Models to download (sizes, and whether each fits this machine with the budget below)")
        QVBoxLayout(models_box).addWidget(self.model_list)

        # -- KV cache
        self.budget = _spin(16, 1 << 20, 256, " tokens")
        self.budget_info = QLabel()
        self.budget_info.setWordWrap(True)
        self.budget_info.setObjectName("budgetInfo")
        self.sink = _spin(0, 1 << 16, 1, " tokens")
        self.window = _spin(1, 1 << 20, 64, " tokens")
        self.residual = _spin(0, 1 << 16, 16, " tokens")
        self.kv_bits = QComboBox()
        for bits, text in ((4, "4 bits (INT4)"), (8, "8 bits (INT8)"), (16, "16 bits (float16)")):
            self.kv_bits.addItem(text, bits)
        cache_box = QGroupBox("KV cache (per layer and KV head)")
        form = QFormLayout(cache_box)
        form.addRow("Budget", self.budget)
        form.addRow("", self.budget_info)
        form.addRow("Attention sinks", self.sink)
        form.addRow("Recent window", self.window)
        form.addRow("16-bit residual", self.residual)
        form.addRow("KV bits", self.kv_bits)

        # -- recall
        self.archive = QCheckBox("Archive every token on disk while reading (needed for recall)")
        self.archive_bits = QComboBox()
        for bits, text in ((4, "4 bits (INT4)"), (2, "2 bits (smaller, less exact)")):
            self.archive_bits.addItem(text, bits)
        self.recall_tokens = _spin(0, 1 << 20, 256, " tokens")
        self.recall_tokens.setSpecialValueText("off")  # 0 = no recall
        self.recall_tokens.setToolTip("Tokens per layer and KV head a question may bring back from the archive; 0 = off")
        self.recall_block = _spin(1, 1 << 16, 16, " tokens")
        self.recall_block.setToolTip("The unit that is scored and recalled; must divide the prefill chunk")
        self.recall_info = QLabel()
        self.recall_info.setWordWrap(True)
        self.recall_info.setObjectName("recallInfo")
        recall_box = QGroupBox("Recall (from the archive, at question time)")
        form = QFormLayout(recall_box)
        form.addRow(self.archive)
        form.addRow("Archive bits", self.archive_bits)
        form.addRow("Recall per question", self.recall_tokens)
        form.addRow("Block", self.recall_block)
        form.addRow("", self.recall_info)

        # -- prefix cache
        self.prefix_enabled = QCheckBox("Save each document's cache and reuse it next time")
        self.prefix_disk = _spin(0, 1 << 20, 256, " MiB")
        self.prefix_usage = QLabel("—")
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Delete every saved prefix cache (documents will be prefilled again)")
        self.clear_button.clicked.connect(self.clear_cache_requested)
        prefix_box = QGroupBox("Prefix cache on disk")
        form = QFormLayout(prefix_box)
        form.addRow(self.prefix_enabled)
        form.addRow("Disk budget", self.prefix_disk)
        row = QHBoxLayout()
        row.addWidget(self.prefix_usage, 1)
        row.addWidget(self.clear_button)
        form.addRow("In use", row)

        # -- cloud
        self.cloud_box = QGroupBox("Cloud fallback (off: nothing leaves this computer)")
        self.cloud_box.setCheckable(True)
        self.cloud_url = QLineEdit()
        self.cloud_url.setPlaceholderText("https://api.example.com/v1")
        self.cloud_model = QLineEdit()
        self.cloud_key = QLineEdit()
        self.cloud_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.cloud_key_state = QLabel()
        self.cloud_threshold = QDoubleSpinBox()
        self.cloud_threshold.setRange(-20.0, 0.0)
        self.cloud_threshold.setSingleStep(0.1)
        self.cloud_threshold.setDecimals(2)
        self.cloud_auto = QCheckBox("Escalate by itself when the local answer's confidence is low")
        self.cloud_confirm = QCheckBox("Show what would be sent and ask before sending")
        form = QFormLayout(self.cloud_box)
        form.addRow("Endpoint URL", self.cloud_url)
        form.addRow("Model name", self.cloud_model)
        form.addRow("API key", self.cloud_key)
        form.addRow("", self.cloud_key_state)
        form.addRow("Escalation threshold", self.cloud_threshold)
        form.addRow("", QLabel("mean log-probability per token of the local answer"))
        form.addRow(self.cloud_auto)
        form.addRow(self.cloud_confirm)

        # -- errors and buttons
        self.error = QLabel()
        self.error.setObjectName("settingsError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #C62828; font-weight: 600;")
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        left = QVBoxLayout()
        left.addWidget(model_box)
        left.addWidget(cache_box)
        left.addStretch(1)
        right = QVBoxLayout()
        right.addWidget(prefix_box)
        right.addWidget(recall_box)  # beside the KV cache: the left column has no height to spare
        right.addWidget(self.cloud_box)
        right.addStretch(1)
        columns = QHBoxLayout()
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)
        # Everything but Save / Cancel scrolls: the dialog wants ~950 px of height, more than a 768 px
        # laptop screen has, where a plain layout squashed the lower boxes until their fields overlapped.
        content = QWidget()
        inner = QVBoxLayout(content)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.addWidget(models_box, 1)  # full width: the table has seven columns; it takes any extra height
        inner.addLayout(columns)
        inner.addWidget(self.error)
        self.scroll = QScrollArea()
        self.scroll.setWidget(content)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        # Never smaller than it asks for: squeezed below its size hint, the form rows overlap.
        content.setMinimumSize(content.sizeHint())
        layout = QVBoxLayout(self)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(self.buttons)
        self._fit_to_screen(content)

        self.load(settings)
        if cache_usage is not None:
            self.set_cache_usage(*cache_usage)
        self.model_kind.currentIndexChanged.connect(self._model_kind_changed)
        self.model_browse.clicked.connect(self._browse)
        for box in (self.budget, self.sink, self.window, self.residual, self.max_new_tokens, self.prefix_disk,
                    self.recall_tokens, self.recall_block):
            box.valueChanged.connect(self._changed)
        self.archive.toggled.connect(self._changed)
        for combo in (self.kv_bits, self.device, self.archive_bits):
            combo.currentIndexChanged.connect(self._changed)
        for edit in (self.cloud_url, self.cloud_model, self.model_path):
            edit.textChanged.connect(self._changed)
        self.cloud_box.toggled.connect(self._changed)
        self.cloud_threshold.valueChanged.connect(self._changed)
        self._model_kind_changed()
        self._changed()

    # ------------------------------------------------------------ values
    def _fit_to_screen(self, content: QWidget) -> None:
        """Open at the size the content asks for, within the screen's free area (scrolling the rest)."""
        want = content.sizeHint()
        width, height = want.width() + 40, want.height() + self.buttons.sizeHint().height() + 40
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            free = screen.availableGeometry()
            width, height = min(width, free.width() - 40), min(height, free.height() - 60)
        self.resize(max(width, 600), max(height, 400))

    def load(self, settings: EngineSettings) -> None:
        """Show `settings` in the widgets."""
        kind = model_kind(settings.model)
        self.model_kind.setCurrentIndex(self.model_kind.findData(kind))
        self.model_path.setText("" if kind == "default" else settings.model)
        self.device.setCurrentIndex(self.device.findData(settings.device))
        self.max_new_tokens.setValue(settings.max_new_tokens)
        policy = settings.cache
        self.budget.setValue(policy.budget_tokens)
        self.sink.setValue(policy.sink_tokens)
        self.window.setValue(policy.window_tokens)
        self.residual.setValue(policy.residual_tokens)
        self.kv_bits.setCurrentIndex(self.kv_bits.findData(policy.kv_bits))
        recall = settings.recall
        self.archive.setChecked(recall.archive)
        self.archive_bits.setCurrentIndex(self.archive_bits.findData(recall.archive_bits))
        self.recall_tokens.setValue(recall.recall_tokens)
        self.recall_block.setValue(recall.block_tokens)
        self.prefix_enabled.setChecked(settings.prefix_cache)
        self.prefix_disk.setValue(settings.prefix_cache_disk_bytes // MIB)
        cloud = settings.cloud
        self.cloud_box.setChecked(cloud.enabled)
        self.cloud_url.setText(cloud.base_url)
        self.cloud_model.setText(cloud.model)
        self.cloud_threshold.setValue(cloud.escalation_threshold)
        self.cloud_auto.setChecked(cloud.auto_escalate)
        self.cloud_confirm.setChecked(cloud.ask_before_sending)
        has_key = bool(cloud.base_url and secrets.load_api_key(cloud.base_url))
        self.cloud_key.setPlaceholderText("stored in the OS keyring — type to replace" if has_key else "stored in the OS keyring, never in a file")
        self.cloud_key_state.setText("A key is stored for this endpoint." if has_key else "No key stored for this endpoint.")

    def values(self) -> EngineSettings:
        """The settings the widgets describe, validated. Raises SettingsError with the engine's message."""
        kind = self.model_kind.currentData()
        model = "default" if kind == "default" else self.model_path.text().strip()
        if kind != "default" and not model:
            raise SettingsError("model: enter a .gguf file, a model folder or a hub id (or pick the embedded default)")
        policy = dataclasses.replace(
            self.original.cache, budget_tokens=self.budget.value(), sink_tokens=self.sink.value(),
            window_tokens=self.window.value(), residual_tokens=self.residual.value(), kv_bits=int(self.kv_bits.currentData()),
        )
        recall = dataclasses.replace(
            self.original.recall, archive=self.archive.isChecked(), archive_bits=int(self.archive_bits.currentData()),
            recall_tokens=self.recall_tokens.value(), block_tokens=self.recall_block.value(),
        )
        cloud = dataclasses.replace(
            self.original.cloud, enabled=self.cloud_box.isChecked(), base_url=self.cloud_url.text().strip(),
            model=self.cloud_model.text().strip(), escalation_threshold=round(self.cloud_threshold.value(), 2),
            auto_escalate=self.cloud_auto.isChecked(), ask_before_sending=self.cloud_confirm.isChecked(),
        )
        settings = dataclasses.replace(
            self.original, model=model, device=self.device.currentData(), max_new_tokens=self.max_new_tokens.value(),
            prefix_cache=self.prefix_enabled.isChecked(), prefix_cache_disk_bytes=self.prefix_disk.value() * MIB,
            cache=policy, recall=recall, cloud=cloud,
        )
        settings.validate()
        return settings

    def set_cache_usage(self, entries: int, size_bytes: int) -> None:
        self.prefix_usage.setText(f"{entries} saved cache{'s' if entries != 1 else ''}, {format_bytes(size_bytes)}")

    # ---------------------------------------------------------- dialog
    def accept(self) -> None:
        """Validate, store the API key in the keyring (if one was typed), save the file, close.
        Anything invalid is shown in the dialog, which stays open."""
        try:
            settings = self.values()
            key = self.cloud_key.text()
            if key:
                if not settings.cloud.base_url:
                    raise SettingsError("enter the endpoint URL the API key belongs to")
                secrets.save_api_key(settings.cloud.base_url, key)
            save_settings(settings, self.settings_file)
        except HalamanError as exc:
            self.error.setText(str(exc))
            return
        except OSError as exc:
            self.error.setText(f"cannot write the settings file ({exc.strerror or exc}); check the config folder's permissions")
            return
        self.cloud_key.clear()
        self.saved = settings
        super().accept()

    def _changed(self, *_args) -> None:
        try:
            settings = self.values()
        except HalamanError as exc:
            self.error.setText(str(exc))
            self.budget_info.setText("")
            self.recall_info.setText("")
            return
        self.error.setText("")
        self._show_budget(settings)
        self.model_list.set_settings(settings)

    def _show_budget(self, settings: EngineSettings) -> None:
        policy, recall = settings.cache, settings.recall
        try:
            at_budget = estimate(self.profile, policy, policy.budget_tokens, recall)
            peak = estimate(self.profile, policy, policy.budget_tokens + policy.chunk_tokens).peak_bytes
            archive_tokens = self.document_tokens or ARCHIVE_PER_TOKENS
            archive = estimate(self.profile, policy, archive_tokens, recall).archive_bytes
        except HalamanError as exc:
            self.budget_info.setText(str(exc))
            self.recall_info.setText("")
            return
        recalled = (f" + {format_bytes(at_budget.recall_bytes)} recalled while a question is answered"
                    if at_budget.recall_bytes else "")
        self.budget_info.setText(
            f"≈ <b>{format_bytes(at_budget.compressed_bytes)}</b> of KV cache at the budget "
            f"({format_bytes(peak)} at the prefill peak){recalled} with {self.profile_name}; "
            f"a full FP16 cache of {policy.budget_tokens:,} tokens: {format_bytes(at_budget.full_bytes)}."
        )
        self.recall_info.setText(recall_info_text(at_budget.recall_bytes, archive, recall.archive, recall.recall_tokens,
                                                  self.document_tokens))
        # Bits and block only mean something with an archive; recall also needs tokens to bring back.
        for widget in (self.archive_bits, self.recall_block, self.recall_tokens):
            widget.setEnabled(recall.archive)

    def _model_kind_changed(self, *_args) -> None:
        kind = self.model_kind.currentData()
        self.model_path.setEnabled(kind != "default")
        self.model_browse.setEnabled(kind in ("gguf", "folder"))
        self.model_path.setPlaceholderText(
            {"default": "", "gguf": "/path/to/model.gguf", "folder": "/path/to/hf-model-folder",
             "hub": "HuggingFaceTB/SmolLM2-360M-Instruct"}[kind]
        )
        self._changed()

    def _use_listed_model(self, repo: str) -> None:
        """A model of the list was downloaded or picked: it becomes the model field (Save applies it)."""
        self.model_kind.setCurrentIndex(self.model_kind.findData("hub"))
        self.model_path.setText(repo)

    def _browse(self) -> None:
        if self.model_kind.currentData() == "gguf":
            path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        else:
            path = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder")
        if path:
            self.model_path.setText(path)


def recall_info_text(recall_bytes: int, archive_bytes: int, archive: bool, recall_tokens: int,
                     document_tokens: int | None) -> str:
    """The recall group's live line: the memory a question's recalled tokens take and the archive's
    size on disk (for the open document, else per 100,000 tokens)."""
    if not archive:
        return "Recall is off: no archive is written, answers use the compressed cache only."
    where = f"for this document ({document_tokens:,} tokens)" if document_tokens else f"per {ARCHIVE_PER_TOKENS:,} tokens"
    disk = f"archive on disk: <b>{format_bytes(archive_bytes)}</b> {where}"
    if not recall_tokens:
        return f"Recall per question is off (the archive is still written). {disk[0].upper()}{disk[1:]}."
    return f"≈ <b>{format_bytes(recall_bytes)}</b> of memory for the recalled tokens while a question is answered; {disk}."


__all__ = ["SettingsDialog", "model_kind", "recall_info_text"]
