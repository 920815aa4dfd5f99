"""Changing settings from the window: the Settings dialog, clearing the prefix cache, applying new
settings without a restart, and lowering the budget after running out of memory. What a change
implies (`SettingsChange`) is decided once, by the worker's client (`EngineClient.apply_settings`),
which applies it in the worker; this flow does what follows in the window (reload the model, read
the document again), reports into the window's `DocumentState` and says what changed (`app.changes`).
"""

from __future__ import annotations

from app import operations as ops
from app.changes import Changes
from app.settings_dialog import SettingsDialog
from app.worker import JobError
from engine.errors import HalamanError
from engine.settings import EngineSettings, save_settings
from engine.workspace import SettingsChange, lowered_budget


class SettingsFlow:
    """Settings for `window` (a `MainWindow`: its panels, client and `state`)."""

    def __init__(self, window) -> None:
        self.window = window
        self.dialog: SettingsDialog | None = None

    def show_settings(self) -> None:
        """Open the Settings dialog; Save applies what it holds."""
        w = self.window
        profile = w.client.model.profile if w.client.model else None
        is_open = w.state.report is not None and w.state.open_id is not None
        tokens = w.state.report.document_tokens if is_open else None
        dialog = SettingsDialog(w.settings, profile=profile, parent=w, document_tokens=tokens,
                                open_title=w.state.report.title if is_open else None)
        dialog.clear_cache_requested.connect(lambda: self.clear_prefix_cache(dialog))
        w.client.submit(ops.prefix_cache_usage(
            on_done=lambda usage: self.dialog is dialog and dialog.set_cache_usage(*usage)))
        dialog.accepted.connect(lambda: self.apply_settings(dialog.saved))
        self.dialog = dialog
        dialog.open()

    def clear_prefix_cache(self, dialog: SettingsDialog | None = None) -> None:
        """Delete every saved prefix cache, then redraw the library (and the dialog's usage)."""
        w = self.window

        def done(removed: int) -> None:
            w.cache_status = w.cache_status.cleared() if w.cache_status else None
            w.changed.emit(Changes(library=True))
            if dialog is not None:
                dialog.set_cache_usage(0, 0)
            w.statusBar().showMessage(f"Removed {removed} saved prefix cache{'s' if removed != 1 else ''}.", 8000)

        w.client.submit(ops.clear_prefix_cache(
            on_done=done, on_error=lambda error: w.banner.show_message("error", f"Could not clear the prefix cache: {error.message}")))

    def apply_settings(self, new: EngineSettings | None, *, retry_path: str | None = None) -> None:
        """Use `new` settings now, without a restart, and do what the change implies: reload the
        model, re-open the current document (prefix caches are keyed by the policy, so only those
        of the old policy miss), or nothing. `retry_path`: open this document afterwards anyway."""
        if new is None:
            return
        w, state = self.window, self.window.state
        document = state.engine_path
        reopen: list[str] = []          # set below, once the change is known
        before = (state.opening, state.open_id)

        def failed(error: JobError) -> None:
            # The client went back to the old settings; nothing will reopen the document, so the
            # ask bar must not wait for it.
            gave_up = bool(reopen) and state.reopen_failed(reopen[0], before)
            w.changed.emit(Changes(settings=True, reading=gave_up))
            w.banner.show_message("error", f"Could not apply the settings: {error.message}")

        def done(change: SettingsChange) -> None:
            if w.closed:
                return
            if change is SettingsChange.RELOAD_MODEL:
                w.model_status.setText("Model changed: loading it…")
                w.changed.emit(Changes(model=True))  # the old one is gone; the next one's shape comes when it has loaded
                w.load_model()
            if reopen:
                w.open_path(reopen[0])
            w.refresh_cache_status()

        change = w.client.apply_settings(new, on_done=done, on_error=failed)
        # Work under the old settings stops, and no question is taken until the document is open
        # again under the new ones.
        if change.reopens_document:
            w.client.cancel(state.document_jobs())
            w.background_read.stop()
        if retry_path or (change.reopens_document and document):
            reopen.append(retry_path or document)
            before = state.reopening(reopen[0])
        w.changed.emit(Changes(settings=True, reading=bool(reopen)))

    def lower_budget_and_retry(self, path: str | None = None) -> None:
        """After running out of memory: lower the KV budget (`engine.workspace.lowered_budget`), save, retry."""
        w = self.window
        new = lowered_budget(w.settings)
        try:
            save_settings(new)
        except (HalamanError, OSError) as exc:
            w.banner.show_message("error", f"Could not save the lower budget: {exc}")
            return
        w.statusBar().showMessage(f"KV budget lowered to {new.cache.budget_tokens:,} tokens.", 8000)
        self.apply_settings(new, retry_path=path)
