"""The main window's layout: its panels in a splitter (sidebar: library and memory; main column:
header, progress, banner, conversation; the source pane, hidden until a source is clicked) and its
menus. Built once, as attributes of the window, which wires them (`MainWindow._connect`)."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app import dialogs
from app.answer_stream import AnswerStream
from app.conversation import Conversation
from app.document_header import DocumentHeader
from app.export_flow import export_conversation
from app.library_panel import LibraryPanel
from app.memory_panel import MemoryPanel
from app.notices import Banner, ProgressPanel
from app.source_pane import SourcePane
from app.style import STYLE
from app.untrusted import plain_label

GAUGE_IDLE_MS = 2000      # gauge refresh while idle (MainWindow makes it faster while work runs)


def build_panels(window) -> None:
    """The panels of `window` (a `MainWindow`) as its attributes, in a splitter: the sidebar, the
    main column and the source pane."""
    window.library_panel = LibraryPanel()
    window.memory_panel = MemoryPanel()
    window.header = DocumentHeader()
    window.progress = ProgressPanel()
    window.banner = Banner()
    window.conversation = Conversation()
    window.chat = window.conversation.chat
    window.gauge = window.memory_panel.gauge
    window.answers = AnswerStream(window.library, window.chat, window.progress, parent=window,
                                  max_new_tokens=lambda: window.settings.max_new_tokens)

    window.sidebar = sidebar = QWidget()
    sidebar.setObjectName("sidebar")
    sidebar.setMinimumWidth(280)
    side = QVBoxLayout(sidebar)
    side.setContentsMargins(10, 10, 10, 10)
    side.addWidget(window.library_panel, 1)
    side.addSpacing(6)
    side.addWidget(window.memory_panel)
    main = QWidget()
    main.setObjectName("mainColumn")
    column = QVBoxLayout(main)
    column.setContentsMargins(0, 0, 0, 0)
    column.setSpacing(0)
    for widget, stretch in ((window.header, 0), (window.progress, 0), (window.banner, 0), (window.conversation, 1)):
        column.addWidget(widget, stretch)
    window.splitter = QSplitter()
    window.splitter.addWidget(sidebar)
    window.splitter.addWidget(main)
    window.source_pane = SourcePane()
    window.source_pane.hide()  # until a source or citation is clicked; its close button hides it
    window.splitter.addWidget(window.source_pane)
    window.splitter.setStretchFactor(0, 0)
    window.splitter.setStretchFactor(1, 1)
    window.splitter.setSizes([330, 790])
    window.splitter.setChildrenCollapsible(False)
    window.setCentralWidget(window.splitter)
    window.model_status = plain_label("Loading the model…")
    window.statusBar().addWidget(window.model_status, 1)
    window.setStyleSheet(STYLE)
    window.resize(1100, 720)
    window.gauge_timer = QTimer(window)
    window.gauge_timer.setInterval(GAUGE_IDLE_MS)
    window.gauge_timer.timeout.connect(window.refresh_gauge)
    window.gauge_timer.start()


def build_menu(window) -> None:
    """The File and Help menus of `window`, wired to its actions."""
    menu = window.menuBar().addMenu("&File")
    window.action_open = QAction("&Open…", window, shortcut=QKeySequence.StandardKey.Open, triggered=window.choose_file)
    window.action_open_folder = QAction("Open &Folder…", window, shortcut=QKeySequence("Ctrl+Shift+O"), triggered=lambda: window.choose_folder())
    window.action_export = QAction("&Export Conversation…", window, shortcut=QKeySequence("Ctrl+E"),
                                   triggered=lambda: export_conversation(window))
    window.action_export.setToolTip("The conversation shown, as Markdown: citations as [document, page N], "
                                    "with the sentences each answer attended quoted")
    window.action_settings = QAction("&Settings…", window, shortcut=QKeySequence("Ctrl+,"), triggered=window.show_settings)
    window.action_settings.setMenuRole(QAction.MenuRole.PreferencesRole)
    window.action_cancel = QAction("&Cancel", window, shortcut=QKeySequence(Qt.Key.Key_Escape), triggered=window.cancel_work)
    quit_action = QAction("&Quit", window, shortcut=QKeySequence.StandardKey.Quit, triggered=window.close)
    for action in (window.action_open, window.action_open_folder, window.action_export, None, window.action_settings, window.action_cancel, None, quit_action):
        menu.addSeparator() if action is None else menu.addAction(action)
    help_menu = window.menuBar().addMenu("&Help")
    help_menu.addAction(QAction("Open the &log folder", window, triggered=window.open_log_folder))
    help_menu.addAction(QAction("&About Halaman", window, triggered=lambda: dialogs.show_about(window)))
