"""The settings dialog: model, device, KV cache policy (with the memory it implies, live), recall
(the archive on disk and what a question may bring back from it, with its memory and disk size,
live), prefix cache, and the cloud fallback, each a section widget (`app.settings_sections`).
Saves with `engine.settings.save_settings` (TOML in the config dir); the cloud API key goes to the
OS keyring (`engine.secrets`), never into the settings file.

Validation is the engine's own (`EngineSettings.validate`, `CachePolicy.validate`): its message is
shown in the dialog and OK does nothing until the values are valid.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QApplication, QDialog, QDialogButtonBox, QFrame, QGroupBox, QHBoxLayout, QScrollArea, QVBoxLayout, QWidget,
)

from app.model_list import ModelList
from app.settings_sections import CacheSection, CloudSection, ModelSection, PrefixSection, RecallSection, model_kind
from app.untrusted import escape, plain_label
from engine import secrets
from engine.errors import HalamanError, SettingsError
from engine.estimate import KNOWN_SHAPES, estimate
from engine.models.catalog import CatalogModel, DeviceMemory
from engine.models.profile import ModelProfile
from engine.models.source import resolve
from engine.settings import EngineSettings, save_settings
from engine.units import format_bytes
from engine.workspace import SettingsChange

# Without an open document, the archive's disk size is shown for this many tokens.
ARCHIVE_PER_TOKENS = 100_000


class SettingsDialog(QDialog):
    """Edit and save settings. After `exec()` returns Accepted, `saved` holds what was saved.

    Its sections: `model`, `cache`, `recall`, `prefix`, `cloud` (`app.settings_sections`), and the
    model list (`model_list`)."""

    clear_cache_requested = Signal()

    def __init__(self, settings: EngineSettings, *, profile: ModelProfile | None = None,
                 cache_usage: tuple[int, int] | None = None, parent: QWidget | None = None,
                 settings_file: Path | None = None, document_tokens: int | None = None,
                 models: list[CatalogModel] | None = None, memory: DeviceMemory | None = None,
                 open_title: str | None = None) -> None:
        """`document_tokens`: the open document's length, to size its archive (else per 100,000 tokens).
        `open_title`: the open document's name, to say before Save when the change reads it again.
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
        self.open_title = open_title
        self.model, self.cache, self.recall = ModelSection(), CacheSection(), RecallSection()
        self.prefix, self.cloud = PrefixSection(), CloudSection()
        self.sections = (self.model, self.cache, self.recall, self.prefix, self.cloud)
        self.prefix.clear_requested.connect(self.clear_cache_requested)
        self.model_list = ModelList(settings, models=models, memory=memory)
        self.model_list.select(settings.model)
        self.model_list.model_chosen.connect(self.model.use)
        self.finished.connect(self.model_list.cancel)  # closing the dialog stops a download (it can resume)
        models_box = QGroupBox("Models to download (sizes, and whether each fits this machine with the budget below)")
        QVBoxLayout(models_box).addWidget(self.model_list)
        self.error = plain_label()
        self.error.setObjectName("settingsError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #C62828; font-weight: 600;")
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._listed: EngineSettings | None = None  # what the model list was last fitted to
        self._lay_out(models_box)
        self.load(settings)
        if cache_usage is not None:
            self.set_cache_usage(*cache_usage)
        for section in self.sections:  # after loading: a half-loaded dialog is not worth checking
            section.changed.connect(self._changed)
        self._changed()

    def _lay_out(self, models_box: QGroupBox) -> None:
        """The model list on top; the model and the KV cache on the left, recall under the cache's
        Advanced part, the prefix cache and the cloud on the right; everything but the error line
        and Save / Cancel scrolls."""
        left, right = QVBoxLayout(), QVBoxLayout()
        # Recall's terms (archive, blocks) mean nothing to a new user: closed with the cache's.
        self.cache.add_advanced(self.recall)
        for column, sections in ((left, (self.model, self.cache)), (right, (self.prefix, self.cloud))):
            for section in sections:
                column.addWidget(section)
            column.addStretch(1)
        columns = QHBoxLayout()
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)
        # The dialog wants ~950 px of height, more than a 768 px laptop screen has, where a plain
        # layout squashed the lower boxes until their fields overlapped.
        content = QWidget()
        inner = QVBoxLayout(content)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.addWidget(models_box, 1)  # full width: the table has seven columns; it takes any extra height
        inner.addLayout(columns)
        self.scroll = QScrollArea()
        self.scroll.setWidget(content)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        # Never smaller than it asks for: squeezed below its size hint, the form rows overlap.
        content.setMinimumSize(content.sizeHint())
        layout = QVBoxLayout(self)
        layout.addWidget(self.scroll, 1)
        # Outside the scroll area, beside Save: an error written below the visible part made Save
        # seem to do nothing, and a long one (the keyring's) was cut.
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)
        self._fit_to_screen(content)

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
        """Show `settings` in the sections."""
        for section in self.sections:
            section.load(settings)

    def values(self, *, but=None) -> EngineSettings:
        """The settings the sections describe (`but` that section's as they were loaded), validated.
        Raises SettingsError with the engine's message."""
        fields = {}
        for section in self.sections:
            if section is not but:
                fields.update(section.values())
        settings = dataclasses.replace(self.original, **fields)
        settings.validate()
        return settings

    def set_cache_usage(self, entries: int, size_bytes: int) -> None:
        """Show what the prefix caches on disk take (the window asks the worker)."""
        self.prefix.set_usage(entries, size_bytes)

    # ---------------------------------------------------------- dialog
    def accept(self) -> None:
        """Validate, store the API key in the keyring (if one was typed), save the file, close.
        Anything invalid is shown in the dialog, which stays open."""
        try:
            settings = self.values()
            if settings.model != self.original.model:
                resolve(settings.model)  # a path that does not exist is said here, not after the model unloads
            key = self.cloud.typed_key()
            if key:
                if not settings.cloud.base_url:
                    raise SettingsError("enter the endpoint URL the API key belongs to")
                secrets.save_api_key(settings.cloud.base_url, key)
            save_settings(settings, self.settings_file)
        except HalamanError as exc:
            self._say(str(exc), error=True)
            return
        except OSError as exc:
            self._say(f"cannot write the settings file ({exc.strerror or exc}); check the config folder's permissions",
                      error=True)
            return
        self.cloud.key.clear()
        self.saved = settings
        super().accept()

    def _changed(self, *_args) -> None:
        """Check the settings as they are typed. A cloud fallback just ticked, its endpoint not
        typed yet, is a hint (`CloudSection.missing`), not an error, and the memory estimates,
        which do not depend on it, stay."""
        hint = self.cloud.missing()
        try:
            settings = self.values(but=None if hint is None else self.cloud)
        except HalamanError as exc:
            self._say(str(exc), error=True)
            self.cache.budget_info.setText("")
            self.recall.info.setText("")
            return
        self._say(" ".join(note for note in (hint, self.restart_note(settings)) if note), error=False)
        self._show_budget(settings)
        # The model list (sizes and fit for every model) does not depend on the cloud fields; refitting
        # it on each character typed into the endpoint made typing lag on a busy machine.
        local = dataclasses.replace(settings, cloud=self.original.cloud)
        if local != self._listed:
            self._listed = local
            self.model_list.set_settings(settings)

    def restart_note(self, settings: EngineSettings) -> str | None:
        """What saving `settings` does to the open document, said before Save (the read restarted
        from 0 % without a word): None when it stays as it is (`SettingsChange.between`)."""
        change = SettingsChange.between(self.original, settings)
        if self.open_title is None or not change.reopens_document:
            return None
        model = "loads the new model and " if change is SettingsChange.RELOAD_MODEL else ""
        return (f"Saving {model}opens {self.open_title} again under these settings: a reading saved under other "
                "settings is not reused, so reading it whole starts over.")

    def _say(self, text: str, *, error: bool) -> None:
        self.error.setText(text)
        self.error.setStyleSheet("color: #C62828; font-weight: 600;" if error else "color: #555;")

    def _show_budget(self, settings: EngineSettings) -> None:
        policy, recall = settings.cache, settings.recall
        try:
            at_budget = estimate(self.profile, policy, policy.budget_tokens, recall)
            peak = estimate(self.profile, policy, policy.budget_tokens + policy.chunk_tokens).peak_bytes
            archive_tokens = self.document_tokens or ARCHIVE_PER_TOKENS
            archive = estimate(self.profile, policy, archive_tokens, recall).archive_bytes
        except HalamanError as exc:
            self.cache.budget_info.setText(escape(str(exc)))
            self.recall.info.setText("")
            return
        recalled = (f" + {format_bytes(at_budget.recall_bytes)} recalled while a question is answered"
                    if at_budget.recall_bytes else "")
        self.cache.budget_info.setText(
            f"≈ <b>{format_bytes(at_budget.compressed_bytes)}</b> of memory for the document's reading "
            f"(up to {format_bytes(peak)} while it is read){recalled} with {self.profile_name}; "
            f"kept uncompressed, {policy.budget_tokens:,} tokens would take {format_bytes(at_budget.full_bytes)}."
        )
        self.recall.info.setText(recall_info_text(at_budget.recall_bytes, archive, recall.archive, recall.recall_tokens,
                                                  self.document_tokens))
        self.recall.show_archive(recall.archive)


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
