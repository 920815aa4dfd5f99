"""Showing text the window did not write: document titles, file and folder names, page labels,
warnings, error messages, a model's answers.

Qt guesses: a QLabel, a message box, an input dialog's prompt and a tooltip show a string as rich
text when it starts like HTML (`Qt::mightBeRichText`), and rich text loads the images it names from
disk. A PDF titled `<img src="/dev/zero">` made the app read /dev/zero until it died (B20). So a
label that may show such a string is plain text (`plain_label`), rich text the window writes
escapes what it quotes (`escape`), and where Qt guesses and offers no switch the text goes in as
rich text that says only what it says (`literal_rich_text`). The chat's own policy for answers is
in `app.chat` (`ChatView.loadResource`, `images_as_text`).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    """A QLabel that shows `text`, and whatever is set later, as plain text."""
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setText(text)
    return label


def rich_label(parent: QWidget | None = None) -> QLabel:
    """A QLabel for rich text the window writes itself (quoted text passed through `escape`)."""
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.RichText)
    return label


def escape(text: str) -> str:
    """`text` to quote inside rich text the window writes: markup in it shows as characters."""
    return html.escape(text, quote=True)


def literal_rich_text(text: str) -> str:
    """`text` as rich text that shows exactly its characters and line breaks, for the places where
    Qt guesses the format and has no plain-text switch (tooltips, message boxes' informative text,
    input dialogs' prompts); "" stays "" (no tooltip)."""
    return "<p>" + escape(text).replace("\n", "<br>") + "</p>" if text else ""


__all__ = ["escape", "literal_rich_text", "plain_label", "rich_label"]
