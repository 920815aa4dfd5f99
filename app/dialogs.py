"""The window's small dialogs: send to the cloud?, read a long document?, a PDF password. Each
opens window-modal (`open()`, never `exec()`: the worker and the gauge keep running) and hands the
user's choice to a callback; the box is returned so tests can press its buttons."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog, QLineEdit, QMessageBox, QWidget

from app.untrusted import literal_rich_text
from engine.cloud import CloudPlan

READ, SUBFOLDER, DONT_READ = "read", "subfolder", "don't read"


def confirm_cloud(parent: QWidget, plan: CloudPlan, answer: Callable[[bool], None]) -> QMessageBox:
    """Show what would be sent to the cloud endpoint; `answer(True)` on Send."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Send to the cloud?")
    box.setTextFormat(Qt.TextFormat.PlainText)
    cut = " (cut to fit the endpoint's context)" if plan.was_cut else ""
    box.setText(f"Send this question and part of “{plan.document_title}” to {plan.endpoint} (model {plan.model})?")
    info = (f"Question: {plan.question}\n"
            f"Document: {plan.document_tokens_sent:,} of {plan.document_tokens_total:,} tokens, "
            f"{len(plan.segments_sent)} pages/files{cut}")
    if plan.warnings:
        info += "\n\n" + "\n".join(f"• {w}" for w in plan.warnings)
    # The box's text format (plain) holds for the informative text too: escaped rich text showed
    # its markup ("<p>", "&#x27;") to the user.
    box.setInformativeText(info)
    box.setDetailedText("Segments sent:\n" + "\n".join(plan.segments_sent))
    send = box.addButton("Send", QMessageBox.ButtonRole.AcceptRole)
    box.addButton("Don't send", QMessageBox.ButtonRole.RejectRole)
    box.finished.connect(lambda _r: answer(box.clickedButton() is send))
    box.open()
    return box


def confirm_long_read(parent: QWidget, name: str, estimate: str, *, folder: bool,
                      answer: Callable[[str], None]) -> QMessageBox:
    """Before a long prefill: say how long it will take here (`estimate`, e.g. "520,143 tokens: about
    1 h on this computer …") and offer to read it all, a subfolder (for a folder), or nothing.
    `answer` gets READ, SUBFOLDER or DONT_READ."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("This will take a while")
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setText(f"Reading {name} is a long prefill: {estimate}.")
    box.setInformativeText("The KV cache is saved when it is done, so this happens once per document and model. "
                           + ("A subfolder reads faster and is often all a question needs." if folder else
                              "You can keep using the computer meanwhile, and cancel at any time."))
    read = box.addButton("Read it all", QMessageBox.ButtonRole.AcceptRole)
    sub = box.addButton("Choose a subfolder…", QMessageBox.ButtonRole.ActionRole) if folder else None
    box.addButton("Don't read", QMessageBox.ButtonRole.RejectRole)

    def finished(_result) -> None:
        clicked = box.clickedButton()
        answer(READ if clicked is read else SUBFOLDER if sub is not None and clicked is sub else DONT_READ)

    box.finished.connect(finished)
    box.open()
    return box


def ask_password(parent: QWidget, name: str, wrong: bool) -> str | None:
    """Ask for a PDF password (modal). None if the user cancels."""
    prompt = f"That password does not open {name}. Try again:" if wrong else f"{name} is protected by a password:"
    text, ok = QInputDialog.getText(parent, "Password needed", literal_rich_text(prompt), QLineEdit.EchoMode.Password)
    return text if ok else None


def about_text() -> str:
    """What Help › About says: the name, the installed version and what Halaman does."""
    try:
        version = metadata.version("halaman")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "not installed"
    return (f"<b>Halaman</b> {version}<br>Ask questions about whole documents with a small local model "
            "over a compressed (sink + window + heavy-hitter, INT4) KV cache.")


def show_about(parent: QWidget) -> None:
    QMessageBox.about(parent, "About Halaman", about_text())
