"""Window state kept across runs, in Qt's QSettings as napari keeps its window geometry (the engine's
settings are TOML, `engine.settings`): the window's geometry and splitter, whether the source pane
is open and how wide, the folder the file dialogs start in, and whether the first-run notice was
said. window.ini in the config folder.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, QTimer

from engine import paths


class WindowStore:
    """The window's state on disk (`save` on close, `restore` on start)."""

    def __init__(self) -> None:
        self.settings = QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)

    @property
    def last_folder(self) -> str:
        """Where the file dialogs start: the folder of the last document opened (home if gone)."""
        folder = self.settings.value("last_folder")
        return folder if folder and Path(folder).is_dir() else str(Path.home())

    @last_folder.setter
    def last_folder(self, folder: str) -> None:
        self.settings.setValue("last_folder", folder)

    @property
    def pane_width(self) -> int | None:
        """The source pane's width when it was last open (None: never opened)."""
        width = self.settings.value("source_pane/width")
        return int(width) if width is not None else None

    @pane_width.setter
    def pane_width(self, width: int) -> None:
        self.settings.setValue("source_pane/width", width)

    @property
    def demo_notice_shown(self) -> bool:
        """The window has said that the built-in model is a small demo (`app.first_run`)."""
        return self.settings.value("first_run/demo_notice") in (True, "true")  # IniFormat reads booleans back as text

    @demo_notice_shown.setter
    def demo_notice_shown(self, shown: bool) -> None:
        self.settings.setValue("first_run/demo_notice", shown)
        self.settings.sync()

    def save(self, window) -> None:
        """Keep `window`'s geometry, its splitter and its source pane (open or not, its width)."""
        self.settings.setValue("geometry", window.saveGeometry())
        self.settings.setValue("splitter", window.splitter.saveState())
        open_pane = window.source_pane.isVisible()
        self.settings.setValue("source_pane/open", open_pane)
        if open_pane:
            self.pane_width = window.source_pane.width()
        self.settings.sync()  # the next window (a restart) reads the file

    def restore(self, window) -> None:
        """Give `window` the geometry, splitter and source pane it had when it was closed."""
        if self.settings.value("geometry") is not None:
            window.restoreGeometry(self.settings.value("geometry"))
        if self.settings.value("splitter") is not None:
            window.splitter.restoreState(self.settings.value("splitter"))
            # The state holds which panels showed: a pane and a list restored as they were in a wider
            # window held an 800 px one at 889 px. The pane is opened below, laid out for this size.
            window.source_pane.hide()
            window.sidebar.show()
        if self.settings.value("source_pane/open") in (True, "true"):  # IniFormat reads booleans back as text
            # Once the window is shown: a splitter scales sizes set before, and the width would drift.
            QTimer.singleShot(0, window.open_source_pane)
