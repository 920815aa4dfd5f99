"""The conversation: the chat (or, with no document, a big drop target) and the ask bar below it.

Intents out (signals): `ask_requested(question, follow_up)` (to the whole library when `ask_all` is
ticked; `ask_all.toggled` says it changed), `ask_cloud_requested(question)`,
`citation_clicked(label, message_id)`, `open_file_requested()`, `open_folder_requested()`. State in:
`set_ready(...)`, `show_document(id)`, `show_empty()`, `show_chat()`; the chat itself is `chat` (`app.chat.ChatView`).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox, QFrame, QHBoxLayout, QLineEdit, QPushButton, QStackedWidget, QVBoxLayout, QWidget,
)

from app.chat import ChatView
from app.untrusted import plain_label


class DropArea(QFrame):
    """The empty state: a big target for dropping documents, and buttons for the file dialogs.
    Drops themselves are handled by the window (anywhere in it)."""

    open_file_requested = Signal()
    open_folder_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("dropArea")
        self.setAcceptDrops(False)
        title = plain_label("Drop a PDF, a code folder or a text file here")
        title.setObjectName("dropTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint = plain_label("Halaman reads the whole document once, keeps a compressed KV cache of it, "
                           "and answers questions with a small model on this computer.")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        for label in (title, hint):  # wrapped: unwrapped, they kept the window from getting narrower
            label.setWordWrap(True)
        hint.setObjectName("dropHint")
        open_file = QPushButton("Open file…")
        open_file.clicked.connect(self.open_file_requested)
        open_folder = QPushButton("Open folder…")
        open_folder.clicked.connect(self.open_folder_requested)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(open_file)
        buttons.addWidget(open_folder)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addStretch(1)
        layout.addWidget(title)
        layout.addWidget(hint)
        layout.addSpacing(12)
        layout.addLayout(buttons)
        layout.addStretch(1)

    def set_highlight(self, on: bool) -> None:
        self.setProperty("dragging", on)
        self.style().unpolish(self)
        self.style().polish(self)


class Conversation(QWidget):
    """Chat (or drop area) + ask bar: question, Follow-up, Ask, Ask the cloud."""

    ask_requested = Signal(str, object)   # question, True (Follow-up ticked), False (New question ticked) or None (the engine decides)
    ask_cloud_requested = Signal(str)
    citation_clicked = Signal(str, object)
    open_file_requested = Signal()
    open_folder_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.drop_area = DropArea()
        self.drop_area.open_file_requested.connect(self.open_file_requested)
        self.drop_area.open_folder_requested.connect(self.open_folder_requested)
        self.chat = ChatView()
        self.chat.setAcceptDrops(False)
        self.chat.viewport().setAcceptDrops(False)
        self.chat.citation_clicked.connect(self.citation_clicked)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.drop_area)
        self.stack.addWidget(self.chat)
        self.question = QLineEdit()
        self.question.setObjectName("question")
        self.question.setAcceptDrops(False)
        self.question.setClearButtonEnabled(True)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setDefault(True)
        self.cloud_button = QPushButton("Ask the cloud")
        self.cloud_button.setToolTip("Send this question (and what fits of the document) to the cloud endpoint in Settings")
        self.follow_up = QCheckBox("Follow-up")
        self.follow_up.setToolTip("Always continue from the previous answer. Unticked, Halaman decides from your words "
                                  "(“it”, “and …”, a short question) and the status bar says when it continued")
        # The other way round: the next question does not go on from the last one, whatever its words
        # ("it", "and …"); unticked again once it is asked (`reset_new_question`).
        self.new_question = QCheckBox("New question")
        self.new_question.setToolTip("The next question starts afresh: it does not continue your last question "
                                     "(for this question only)")
        self.follow_up.toggled.connect(lambda on: on and self.new_question.setChecked(False))
        self.new_question.toggled.connect(lambda on: on and self.follow_up.setChecked(False))
        self.ask_all = QCheckBox("Ask all documents")
        self.ask_all.setToolTip("Answer from the best matching documents of the library; sources name the document")
        # The question and its buttons on one row, the options under it: on one row, a chat beside
        # the source pane in an 800 px window left the question box ~40 px wide.
        bar = QHBoxLayout()
        bar.setContentsMargins(12, 8, 12, 4)
        bar.addWidget(self.question, 1)
        bar.addWidget(self.ask_button)
        bar.addWidget(self.cloud_button)
        options = QHBoxLayout()
        options.setContentsMargins(12, 0, 12, 8)
        options.addWidget(self.follow_up)
        options.addWidget(self.new_question)
        options.addWidget(self.ask_all)
        options.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.stack, 1)
        layout.addLayout(bar)
        layout.addLayout(options)
        self.question.returnPressed.connect(self._ask)
        self.ask_button.clicked.connect(self._ask)
        self.cloud_button.clicked.connect(lambda: self.ask_cloud_requested.emit(self.question.text().strip()))
        self.document_id: int | None = None   # the library document the chat shows

    def show_document(self, document_id: int | None) -> None:
        """The chat shows library document `document_id` (None: none, or a new file being read). A
        follow-up continues the conversation shown, so another document's starts unticked."""
        if document_id != self.document_id:
            self.follow_up.setChecked(False)
            self.new_question.setChecked(False)
        self.document_id = document_id

    def set_ready(self, ready: bool, hint: str, *, cloud: bool, typing: bool = False) -> None:
        """Enable the ask bar when a question can be asked now; `hint` is the placeholder; `cloud`:
        the cloud fallback is on in Settings (its button shows); `typing`: the next question may be
        typed already (a read or an answer is under way), only not sent.

        A question box disabled under the user's fingers hands the keyboard to the next widget in
        the focus chain, often a button that a typed space presses (the Open dialog opened, the
        rest of the question went into its file name): the box stays enabled while a question is
        coming, and the keyboard goes to the chat, which ignores typing, when it is disabled."""
        self.cloud_button.setVisible(cloud)
        for widget in (self.ask_button, self.cloud_button, self.follow_up):
            widget.setEnabled(ready)
        # A library question has no previous answer to follow, and the cloud is sent one document.
        self.follow_up.setEnabled(ready and not self.ask_all.isChecked())
        self.new_question.setEnabled(ready and not self.ask_all.isChecked())
        self.cloud_button.setEnabled(ready and not self.ask_all.isChecked())
        enabled = ready or typing
        if not enabled and self.question.hasFocus():
            self.chat.setFocus()
        self.question.setEnabled(enabled)
        self.question.setPlaceholderText(hint)

    def take_question(self) -> str:
        """The typed question, and clear the box for the next one."""
        text = self.question.text().strip()
        self.question.clear()
        return text

    def show_empty(self) -> None:
        self.stack.setCurrentWidget(self.drop_area)

    def show_chat(self) -> None:
        self.stack.setCurrentWidget(self.chat)

    def _ask(self) -> None:
        question = self.question.text().strip()
        if question and self.ask_button.isEnabled():  # Enter in a question typed ahead waits for Ask
            self.ask_requested.emit(question, self.follow_up_choice())

    def follow_up_choice(self) -> bool | None:
        """What the user said of the next question: True (Follow-up ticked: continue the last one),
        False (New question ticked: start afresh), None (neither: the engine decides from its words)."""
        return True if self.follow_up.isChecked() else False if self.new_question.isChecked() else None

    def reset_new_question(self) -> None:
        """A question was asked: "New question" was for that one only."""
        self.new_question.setChecked(False)
