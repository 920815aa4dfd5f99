"""The groups of the settings dialog (`app.settings_dialog`), one widget each: the model, the KV
cache, recall, the prefix cache on disk and the cloud fallback. Each shows a part of
`EngineSettings` (`load(settings)`), gives back the fields it edits (`values()`: a dict of
`EngineSettings` fields, for `dataclasses.replace`; not validated, which the dialog does once for
all of them) and emits `changed` on any edit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLineEdit,
    QPushButton, QSpinBox, QToolButton, QWidget,
)

from app.untrusted import plain_label, rich_label
from engine import secrets
from engine.errors import SettingsError
from engine.settings import EngineSettings
from engine.units import format_bytes

MODEL_KINDS = [
    ("default", "Embedded default (SmolLM2-135M-Instruct)"),
    ("gguf", "GGUF file"),
    ("folder", "Hugging Face model folder"),
    ("hub", "Hugging Face hub id (downloads once)"),
]
DEVICES = [("auto", "Auto (CUDA when available)"), ("cuda", "CUDA GPU"), ("cpu", "CPU")]
MIB = 1024 * 1024


def model_kind(spec: str) -> str:
    """Which of MODEL_KINDS a model setting names."""
    if spec == "default":
        return "default"
    if spec.lower().endswith(".gguf"):
        return "gguf"
    if Path(spec).expanduser().is_dir() or spec.startswith(("/", "~", ".")):
        return "folder"
    return "hub"


class _WheelOnlyWhenFocused(QObject):
    """Lets a combo or spin box take the mouse wheel only once the user has clicked into it: in a
    scrolling dialog the wheel otherwise changed whichever box passed under the pointer (Archive
    bits 4 → 2 by accident). The ignored wheel goes on to the scroll area."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            event.ignore()
            return True
        return False


_WHEEL_FILTER = _WheelOnlyWhenFocused()


def no_wheel_unless_focused(widget: QWidget) -> QWidget:
    """`widget` (a combo or spin box) changed by the wheel only while it has the keyboard focus,
    which the wheel alone never gives it."""
    widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
    widget.installEventFilter(_WHEEL_FILTER)
    return widget


def _spin(low: int, high: int, step: int = 1, suffix: str = "") -> QSpinBox:
    box = no_wheel_unless_focused(QSpinBox())
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setGroupSeparatorShown(True)
    if suffix:
        box.setSuffix(suffix)
    return box


def _combo(items) -> QComboBox:
    combo = no_wheel_unless_focused(QComboBox())
    for data, text in items:
        combo.addItem(text, data)
    return combo


class Section(QGroupBox):
    """One group of settings: `load(settings)`, `values()`, `changed`. Subclasses keep the settings
    last loaded (`loaded`), so that `values()` carries the fields they do not show."""

    changed = Signal()

    def __init__(self, title: str) -> None:
        super().__init__(title)
        self.loaded = EngineSettings()
        self.form = QFormLayout(self)

    def load(self, settings: EngineSettings) -> None:
        """Show `settings` in the widgets."""
        self.loaded = settings

    def values(self) -> dict:
        """The `EngineSettings` fields this group edits, as the widgets say (not validated)."""
        raise NotImplementedError

    def _emit_on(self, *widgets) -> None:
        """`changed` whenever one of `widgets` is edited."""
        for widget in widgets:
            for name in ("valueChanged", "currentIndexChanged", "textChanged", "toggled"):
                signal = getattr(widget, name, None)
                if signal is not None:
                    signal.connect(self.changed)
                    break


class ModelSection(Section):
    """The model (embedded, a GGUF file, a folder or a hub id), its device, the longest answer."""

    def __init__(self) -> None:
        super().__init__("Model")
        self.kind = _combo(MODEL_KINDS)
        self.path = QLineEdit()
        self.browse = QPushButton("Browse…")
        self.device = _combo(DEVICES)
        self.max_new_tokens = _spin(1, 8192, 16, " tokens")
        self.form.addRow("Model", self.kind)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(self.browse)
        self.form.addRow("File, folder or id", row)
        self.form.addRow("Device", self.device)
        self.form.addRow("Longest answer", self.max_new_tokens)
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.browse.clicked.connect(self._browse)
        self._emit_on(self.path, self.device, self.max_new_tokens)

    def load(self, settings: EngineSettings) -> None:
        super().load(settings)
        kind = model_kind(settings.model)
        self.kind.setCurrentIndex(self.kind.findData(kind))
        self.path.setText("" if kind == "default" else settings.model)
        self.device.setCurrentIndex(self.device.findData(settings.device))
        self.max_new_tokens.setValue(settings.max_new_tokens)
        self._kind_changed()

    def values(self) -> dict:
        """Raises SettingsError for a model kind without a file, folder or id."""
        kind = self.kind.currentData()
        model = "default" if kind == "default" else self.path.text().strip()
        if kind != "default" and not model:
            raise SettingsError("model: enter a .gguf file, a model folder or a hub id (or pick the embedded default)")
        return {"model": model, "device": self.device.currentData(), "max_new_tokens": self.max_new_tokens.value()}

    def use(self, repo: str) -> None:
        """A model of the list was downloaded or picked: it becomes the model field (Save applies it)."""
        self.kind.setCurrentIndex(self.kind.findData("hub"))
        self.path.setText(repo)

    def _kind_changed(self, *_args) -> None:
        kind = self.kind.currentData()
        self.path.setEnabled(kind != "default")
        self.browse.setEnabled(kind in ("gguf", "folder"))
        self.path.setPlaceholderText({"default": "", "gguf": "/path/to/model.gguf", "folder": "/path/to/hf-model-folder",
                                      "hub": "HuggingFaceTB/SmolLM2-360M-Instruct"}[kind])
        self.changed.emit()

    def _browse(self) -> None:
        if self.kind.currentData() == "gguf":
            path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        else:
            path = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder")
        if path:
            self.path.setText(path)


TERMS = {
    "budget": ("How many of the document's tokens the model keeps in memory (per layer and KV head, the "
               "KV cache); the rest stays on disk, and a question brings back the pages it needs."),
    "sink": ("Attention sinks: the document's first tokens, always kept. Models lean on them whatever they "
             "read (StreamingLLM), and answers degrade without them."),
    "window": "Recent window: the last tokens read, always kept, so the text just before the question stays exact.",
    "residual": ("16-bit residual: the newest tokens stay unpacked (16-bit) until this many have arrived, then "
                 "they are packed to the KV bits together."),
    "kv_bits": ("KV bits: how many bits each kept key and value takes. 4 bits take a quarter of the memory of "
                "16, for a small loss of accuracy."),
    "archive": ("Archive: while the document is read, a small copy of every token is saved on disk, so that a "
                "question can bring back the pages the memory above did not keep."),
    "archive_bits": ("Archive bits: how many bits each archived key and value takes on disk. 2 bits take half "
                     "the disk of 4, and the pages brought back from them are a little less exact."),
    "recall": ("Recall per question: how many archived tokens (per layer and KV head) a question may bring back "
               "into memory for its answer. More reads more of the pages it needs, and takes more memory; off "
               "brings nothing back."),
    "block": ("Block: recall scores and brings back the archive in pieces of this many tokens. Smaller pieces "
              "pick more precisely and take longer to score; it must divide the reading chunk."),
}


class CacheSection(Section):
    """The KV cache policy per layer and KV head; `budget_info` says what it takes in memory. The
    budget is in view; the terms of the policy (sinks, window, residual, KV bits) are under
    `advanced`, collapsed until `advanced_toggle` opens it, each explained in its tooltip (`TERMS`)."""

    def __init__(self) -> None:
        super().__init__("Memory for the document (KV cache)")
        self.budget = _spin(16, 1 << 20, 256, " tokens")
        self.budget_info = rich_label()
        self.budget_info.setWordWrap(True)
        self.budget_info.setObjectName("budgetInfo")
        self.sink = _spin(0, 1 << 16, 1, " tokens")
        self.window_tokens = _spin(1, 1 << 20, 64, " tokens")
        self.residual = _spin(0, 1 << 16, 16, " tokens")
        self.kv_bits = _combo(((4, "4 bits (INT4)"), (8, "8 bits (INT8)"), (16, "16 bits (float16)")))
        self.advanced_toggle = QToolButton()
        self.advanced_toggle.setText("Advanced: how the cache is kept and recalled")
        self.advanced_toggle.setCheckable(True)
        self.advanced_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_toggle.setAutoRaise(True)
        self.advanced = QWidget()
        advanced = self._advanced_form = QFormLayout(self.advanced)
        advanced.setContentsMargins(0, 0, 0, 0)
        self.form.addRow("Tokens kept", self.budget)
        self.form.addRow("", self.budget_info)
        self.form.addRow(self.advanced_toggle)
        self.form.addRow(self.advanced)
        for key, label, widget in (("sink", "Attention sinks", self.sink), ("window", "Recent window", self.window_tokens),
                                   ("residual", "16-bit residual", self.residual), ("kv_bits", "KV bits", self.kv_bits)):
            widget.setToolTip(TERMS[key])
            advanced.addRow(label, widget)
            advanced.labelForField(widget).setToolTip(TERMS[key])
        self.budget.setToolTip(TERMS["budget"])
        self.form.labelForField(self.budget).setToolTip(TERMS["budget"])
        self.advanced.setVisible(False)
        self.advanced_toggle.toggled.connect(self._show_advanced)
        self._emit_on(self.budget, self.sink, self.window_tokens, self.residual, self.kv_bits)

    def add_advanced(self, widget: QWidget) -> None:
        """Put `widget` (the recall group) under Advanced, below the cache's terms: shown only
        when Advanced is open."""
        self._advanced_form.addRow(widget)

    def _show_advanced(self, shown: bool) -> None:
        self.advanced.setVisible(shown)
        self.advanced_toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)

    def load(self, settings: EngineSettings) -> None:
        super().load(settings)
        policy = settings.cache
        self.budget.setValue(policy.budget_tokens)
        self.sink.setValue(policy.sink_tokens)
        self.window_tokens.setValue(policy.window_tokens)
        self.residual.setValue(policy.residual_tokens)
        self.kv_bits.setCurrentIndex(self.kv_bits.findData(policy.kv_bits))

    def values(self) -> dict:
        return {"cache": dataclasses.replace(
            self.loaded.cache, budget_tokens=self.budget.value(), sink_tokens=self.sink.value(),
            window_tokens=self.window_tokens.value(), residual_tokens=self.residual.value(),
            kv_bits=int(self.kv_bits.currentData()))}


class RecallSection(Section):
    """The archive written while reading and what a question may recall from it; `info` says
    what that takes in memory and on disk. The dialog puts it under the cache's Advanced part
    (`CacheSection.add_advanced`), each field explained in its tooltip (`TERMS`)."""

    def __init__(self) -> None:
        super().__init__("Recall (from the archive, at question time)")
        self.archive = QCheckBox("Archive every token on disk while reading (needed for recall)")
        self.archive_bits = _combo(((4, "4 bits (INT4)"), (2, "2 bits (smaller, less exact)")))
        self.tokens = _spin(0, 1 << 20, 256, " tokens")
        self.tokens.setSpecialValueText("off")  # 0 = no recall
        self.block = _spin(1, 1 << 16, 16, " tokens")
        self.info = rich_label()
        self.info.setWordWrap(True)
        self.info.setObjectName("recallInfo")
        self.form.addRow(self.archive)
        self.archive.setToolTip(TERMS["archive"])
        for key, label, widget in (("archive_bits", "Archive bits", self.archive_bits), ("recall", "Recall per question", self.tokens),
                                   ("block", "Block", self.block)):
            self.form.addRow(label, widget)
            widget.setToolTip(TERMS[key])
            self.form.labelForField(widget).setToolTip(TERMS[key])
        self.form.addRow("", self.info)
        self._emit_on(self.archive, self.archive_bits, self.tokens, self.block)

    def load(self, settings: EngineSettings) -> None:
        super().load(settings)
        recall = settings.recall
        self.archive.setChecked(recall.archive)
        self.archive_bits.setCurrentIndex(self.archive_bits.findData(recall.archive_bits))
        self.tokens.setValue(recall.recall_tokens)
        self.block.setValue(recall.block_tokens)

    def values(self) -> dict:
        return {"recall": dataclasses.replace(
            self.loaded.recall, archive=self.archive.isChecked(), archive_bits=int(self.archive_bits.currentData()),
            recall_tokens=self.tokens.value(), block_tokens=self.block.value())}

    def show_archive(self, archive: bool) -> None:
        """Bits and block only mean something with an archive; recall also needs tokens to bring back."""
        for widget in (self.archive_bits, self.block, self.tokens):
            widget.setEnabled(archive)


class PrefixSection(Section):
    """Saving each document's prefix cache on disk, its disk budget, what is in use (`set_usage`)
    and Clear (`clear_requested`)."""

    clear_requested = Signal()

    def __init__(self) -> None:
        super().__init__("Prefix cache on disk")
        self.enabled = QCheckBox("Save each document's cache and reuse it next time")
        self.disk = _spin(0, 1 << 20, 256, " MiB")
        self.usage = plain_label("—")
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Delete every saved prefix cache (documents will be prefilled again)")
        self.clear_button.clicked.connect(self.clear_requested)
        self.form.addRow(self.enabled)
        self.form.addRow("Disk budget", self.disk)
        row = QHBoxLayout()
        row.addWidget(self.usage, 1)
        row.addWidget(self.clear_button)
        self.form.addRow("In use", row)
        self._emit_on(self.disk)

    def load(self, settings: EngineSettings) -> None:
        super().load(settings)
        self.enabled.setChecked(settings.prefix_cache)
        self.disk.setValue(settings.prefix_cache_disk_bytes // MIB)

    def values(self) -> dict:
        return {"prefix_cache": self.enabled.isChecked(), "prefix_cache_disk_bytes": self.disk.value() * MIB}

    def set_usage(self, entries: int, size_bytes: int) -> None:
        """Show what the prefix caches on disk take."""
        self.usage.setText(f"{entries} saved cache{'s' if entries != 1 else ''}, {format_bytes(size_bytes)}")


class CloudSection(Section):
    """The cloud fallback (checkable: off, nothing leaves this computer): endpoint, model, API key
    (kept in the OS keyring, `typed_key`), when to escalate, whether to ask before sending."""

    OFF_TITLE = "Cloud fallback (off: nothing leaves this computer)"
    ON_TITLE = "Cloud fallback (on: questions may be sent to the endpoint below)"

    def __init__(self) -> None:
        super().__init__(self.OFF_TITLE)
        self.setCheckable(True)
        self.setChecked(False)
        # The title is the privacy statement: computed from the box's state whenever it changes or
        # settings are loaded. A checkable group box starts checked, so loading "on" changed nothing
        # and the title kept saying "off: nothing leaves this computer" while the cloud was on.
        self.toggled.connect(self._show_state)
        self.url = QLineEdit()
        self.url.setPlaceholderText("https://api.example.com/v1")
        self.model = QLineEdit()
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_state = plain_label()
        self.threshold = no_wheel_unless_focused(QDoubleSpinBox())
        self.threshold.setRange(-20.0, 0.0)
        self.threshold.setSingleStep(0.1)
        self.threshold.setDecimals(2)
        # Plain words here; the measure's name (mean log-probability per token) is in the tooltip.
        self.threshold_note = plain_label("the local answer's confidence: 0 is sure, lower is less sure")
        self.threshold_note.setWordWrap(True)
        self.threshold.setToolTip("Mean log-probability per token of the local answer: below this, it counts as unsure.")
        self.auto = QCheckBox("Ask the cloud by itself when the local answer's confidence is low")
        self.confirm = QCheckBox("Show what would be sent and ask before sending")
        for label, widget in (("Endpoint URL", self.url), ("Model name", self.model), ("API key", self.key),
                              ("", self.key_state), ("Ask the cloud below", self.threshold),
                              ("", self.threshold_note)):
            self.form.addRow(label, widget)
        self.form.addRow(self.auto)
        self.form.addRow(self.confirm)
        self._emit_on(self, self.url, self.model, self.threshold)

    def load(self, settings: EngineSettings) -> None:
        super().load(settings)
        cloud = settings.cloud
        self.setChecked(cloud.enabled)
        self._show_state()
        self.url.setText(cloud.base_url)
        self.model.setText(cloud.model)
        self.threshold.setValue(cloud.escalation_threshold)
        self.auto.setChecked(cloud.auto_escalate)
        self.confirm.setChecked(cloud.ask_before_sending)
        has_key = bool(cloud.base_url and secrets.load_api_key(cloud.base_url))
        self.key.setPlaceholderText("stored in the OS keyring — type to replace" if has_key else "stored in the OS keyring, never in a file")
        self.key_state.setText("A key is stored for this endpoint." if has_key else "No key stored for this endpoint.")

    def _show_state(self, *_args) -> None:
        self.setTitle(self.ON_TITLE if self.isChecked() else self.OFF_TITLE)

    def values(self) -> dict:
        return {"cloud": dataclasses.replace(
            self.loaded.cloud, enabled=self.isChecked(), base_url=self.url.text().strip(), model=self.model.text().strip(),
            escalation_threshold=round(self.threshold.value(), 2), auto_escalate=self.auto.isChecked(),
            ask_before_sending=self.confirm.isChecked())}

    def missing(self) -> str | None:
        """What is still to be typed for the cloud to be usable (a hint, not an error: the user
        has just ticked it), None when nothing is or the cloud is off."""
        if not self.isChecked():
            return None
        wanted = [name for name, field in (("the endpoint URL", self.url), ("the model name", self.model))
                  if not field.text().strip()]
        return f"To use the cloud fallback, enter {' and '.join(wanted)}." if wanted else None

    def typed_key(self) -> str:
        """The API key typed in (to store in the keyring on Save), "" when none was."""
        return self.key.text()
