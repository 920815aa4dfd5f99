"""The chat view: questions, answers rendered as Markdown (code blocks included) while they stream,
citations as links, and a footer per answer saying where it came from and what it cost.

Under each answer, two lines name pages or files, from two different kinds of evidence:

    Cited: page 2 · src/app.py              what the answer's *text* cites ("[page 2]"), matched
                                             against the document (`sources_line`)
    Attended: page 12 (41 %) · page 3 (22 %)  where the model's *attention* went: the pages / files
                                             whose recalled tokens received the most attention
                                             while it answered (`attended_line`, from
                                             `engine.answer.Answer.sources`)

The model is told to cite "[page 12]" or "[src/app.py]"; `link_citations` turns those into
`cite:` links (never inside code). Both lines link each label the same way, so clicking a cited or
an attended label emits `citation_clicked(label, message_id)`: the link carries the answer's id
(`cite:page%2012#42`), so that the source pane shows that answer's attended passages.

An answer is untrusted text: it is Markdown without HTML, its images become text that names them
(`images_as_text`), its headings stay the characters the model wrote (`headings_as_text`), its links and URLs are plain text (`ChatView._unlink`: only citations are
links, and a click opens nothing else), and the view loads no resource at all
(`ChatView.loadResource`). An image an
answer named used to be read from disk: `![chart](/dev/zero)` read until the app died, a named pipe
froze it, and a saved conversation did both again on every reopen (B21).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from PySide6.QtCore import QEvent, QTimer, QUrl, Signal
from PySide6.QtGui import (QColor, QImage, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextFormat)
from PySide6.QtWidgets import QTextBrowser, QToolTip

from app.untrusted import escape, literal_rich_text
from engine.answer import Source, StopReason
from engine.answer_marks import answer_marks
from engine.citations import CITATION, CODE, citations, looks_like_citation, normalise_label
from engine.documents.ocr import recognised_note
from engine.evidence_quotes import quoted_passages
from engine.grounding import checked_unit as grounding_unit
from engine.grounding import instructions_note
from engine.history import UNREAD_CITATION
from engine.library import MessageRecord
from engine.workspace import RecallOff

_IMAGE = re.compile(r"!\[([^\[\]\n]*)\]\([^)\n]*\)")
MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
RENDER_EVERY_MS = 50


def cite_href(label: str, message_id: int | None = None) -> str:
    """The link of a cited or attended label: `cite:<label, quoted>`, then `#<answer id>` when known."""
    return f"cite:{quote(label)}" + (f"#{message_id}" if message_id is not None else "")


def link_citations(text: str, message_id: int | None = None) -> str:
    """Markdown with each citation turned into a `cite:` link (code spans and blocks untouched);
    `message_id`: the answer the text belongs to (`cite_href`)."""
    def link(match: re.Match) -> str:
        label = match.group(1).strip()
        return f"[[{label}]]({cite_href(label, message_id)})" if looks_like_citation(label) else match.group(0)

    return "".join(part if part.startswith("`") else CITATION.sub(link, part) for part in CODE.split(text))


def images_as_text(text: str) -> str:
    """Markdown with each image written as text that names it (`[image not shown: chart]`), code
    spans and blocks untouched. An image written another way (a reference, brackets in its text)
    loses its "!" and is a link, which the view never follows to a file."""
    def placeholder(match: re.Match) -> str:
        alt = match.group(1).strip()
        return "\\[image not shown" + (f": {alt}" if alt else "") + "\\]"

    return "".join(part if part.startswith("`") else _IMAGE.sub(placeholder, part).replace("![", "!\\[")
                   for part in CODE.split(text))


_HEADING = re.compile(r"(?m)^( {0,3})(#{1,6})(?=[ \t]|$)")
_UNDERLINE = re.compile(r"(?m)(?<=\S)(\n {0,3})([=-])(?=[=-]*[ \t]*$)")


def headings_as_text(text: str) -> str:
    """Markdown with each heading written as its characters ("# Title" stays "# Title", in the
    answer's own size), code spans and blocks untouched: an answer is the model's text, and a line
    it starts with "#" (a document's Markdown title, a comment) is not the window's heading. An
    underline ("===" or "---" under a line) is kept as characters too."""
    def escaped(part: str) -> str:
        part = _HEADING.sub(lambda m: f"{m.group(1)}\\{m.group(2)}", part)
        return _UNDERLINE.sub(lambda m: f"{m.group(1)}\\{m.group(2)}", part)

    return "".join(part if part.startswith("`") else escaped(part) for part in CODE.split(text))


CITED_TIP = "Pages or files the answer's text cites, checked against the document"
ATTENDED_TIP = ("Pages or files whose recalled tokens received the most attention while the model answered "
                "(its share of that attention). From the model's attention, not from the answer's text.")


def sources_line(text: str, labels: set[str] | None, message_id: int | None = None,
                 read: set[str] | None = None, shown: dict[str, str] | None = None) -> str:
    """HTML: 'Cited: page 1 · src/app.py' (links, `cite_href`), labels the document does not have
    marked, and those the answer did not read (not in `read`; None: unknown) marked as such: the
    model wrote them without having read them. '' when nothing is cited. `shown`: a page's label
    -> its printed name, as in `attended_line` (the link keeps what the answer wrote)."""
    cited = citations(text)
    if not cited:
        return ""
    shown = shown or {}
    parts = []
    for label in cited:
        name = shown.get(normalise_label(label), label)
        if labels is not None and label not in labels and normalise_label(label) not in labels:
            parts.append(f"<span style='color:#B03030'>{escape(label)} (not in the document)</span>")
        elif read is not None and label not in read and normalise_label(label) not in read:
            parts.append(f"<a href='{cite_href(label, message_id)}'>{escape(name)}</a>"
                         f"<span style='color:#B03030'> ({UNREAD_CITATION})</span>")
        else:
            parts.append(f"<a href='{cite_href(label, message_id)}'>{escape(name)}</a>")
    return f"<span title=\"{CITED_TIP}\">Cited:</span> " + " · ".join(parts)


def attended_line(sources: list[Source], message_id: int | None = None, shown: dict[str, str] | None = None) -> str:
    """HTML: 'Attended: page 12 (41 %) · src/app.py (22 %)', each label a `cite:` link like a
    citation's; '' when there are none (no recall, or nothing attended above the engine's floor).
    `shown`: label -> the name a reader knows ("page 68" -> "page 48 (PDF page 68)",
    `Document.shown_labels`); the link keeps the label."""
    if not sources:
        return ""
    shown = shown or {}
    # A library answer's sources are in several documents: each is named "[title, page 3]"
    # (`Source.cited_name`, by which `app.source_flow` resolves the link).
    names = [(s.cited_name, f"[{s.cited_name}]") if s.document else (s.label, shown.get(s.label, s.label))
             for s in sources]
    parts = [f"<a href='{cite_href(label, message_id)}' title=\"{ATTENDED_TIP}\">{escape(name)}</a> ({s.share * 100:.0f} %)"
             for s, (label, name) in zip(sources, names)]
    return f"<span title=\"{ATTENDED_TIP}\">Attended:</span> " + " · ".join(parts)


def recall_text(message: MessageRecord, shown: dict[str, str] | None = None) -> str:
    """The footer's recall part: 'recall 1,024 tokens in 12 ms', 'recall off', or '' (not recorded:
    cloud answers and answers from before recall). Tokens are per layer and KV head, the unit of
    the recall_tokens setting."""
    recall = message.recall
    if recall is None:
        return ""
    if "off" in recall:
        return "recall off" if recall["off"] == RecallOff.OFF else f"recall off ({recall['off']})"
    tokens = recall.get("tokens_per_head")
    # The selection at the question is what recall adds to the time to first token; the refreshes
    # during the answer are part of its tokens/s.
    cost = f"{float(recall.get('question_s') or recall.get('seconds') or 0.0) * 1000:,.0f} ms"
    spans = read_spans(recall.get("spans") or (), recall.get("reasons") or (), shown)
    what = f"read {spans} · recall " if spans else "recall "
    return f"{what}{tokens:,} tokens in {cost}" if tokens is not None else f"{what}{cost}"


def read_spans(spans, reasons, shown: dict[str, str] | None = None) -> str:
    """'page 105, page 106 (chapter 8); page 15 (matching words)': the spans an answer read with
    why each was chosen, neighbours with the same reason under one; the spans alone for answers
    stored before reasons were. `shown`: labels to their printed names ("page 68" -> "page 48 (PDF
    page 68)"), for a span's label before any part of it ("page 68 (characters …)")."""
    if shown:
        spans = [_shown_span(span, shown) for span in spans]
    if len(reasons) != len(spans):
        return ", ".join(spans)
    groups: list[tuple[str, list[str]]] = []
    for span, reason in zip(spans, reasons, strict=True):
        if groups and groups[-1][0] == reason:
            groups[-1][1].append(span)
        else:
            groups.append((reason, [span]))
    return "; ".join(f"{', '.join(names)} ({reason})" for reason, names in groups)


def _shown_span(span: str, shown: dict[str, str]) -> str:
    label, gap, rest = span.partition(" (")
    return f"{shown[label]}{gap}{rest}" if label in shown else span


CAUTION_COLOR = "#B03030"
NOTE_COLOR = "#8A5A00"
LOW_CONFIDENCE = "low confidence: the model was unsure of its words"
CANCELLED_EARLY = "cancelled before the first word"


def checked_unit(message: MessageRecord) -> str:
    """What a reader checks `message` (an answer) against (`engine.grounding.checked_unit` of its
    stored sources and passages): "the page", "the slide", "the file", "the passage"…"""
    return grounding_unit([*message.sources, *message.passages])


def _no_words(message: MessageRecord) -> bool:
    """A cancelled answer stopped before its first word (no text, no token)."""
    cancelled = message.state == "cancelled" or message.stop_reason == StopReason.CANCELLED
    return cancelled and (not (message.text or "").strip() or message.tokens == 0)


def evidence_lines(message: MessageRecord, question: str = "", shown: dict[str, str] | None = None) -> list[str]:
    """Rich-text lines quoting what `message` (an answer) attended to most, each with its page or
    file as a citation link (`engine.evidence_quotes`; named as `shown` gives, as in `attended_line`),
    then the marks, each naming the sentence it doubts (`engine.answer_marks`): on the direct answer
    a caution (⚠), on a side remark a note. [] for an answer with no stored passages and no mark."""
    quoted = quoted_passages(message.passages)
    shown = shown or {}
    lines = [f"<span style='color:#444'>“{escape(p.text)}” — <a href='{cite_href(p.label, message.id)}'>"
             f"{escape(shown.get(p.label, p.label))}</a> ({p.share:.0%})</span>" for p in quoted]
    unsupported = message.unsupported if message.source != "cloud" else []
    for mark in answer_marks(message.text, question, quoted, unsupported):
        lines.append(f"<span style='color:{CAUTION_COLOR}'>⚠ {escape(mark.note)}</span>" if mark.direct
                     else f"<span style='color:{NOTE_COLOR}'>note: {escape(mark.note)}</span>")
    return lines


def recognised_line(message: MessageRecord, recognised_pages: list[int]) -> str:
    """HTML: the caution under an answer whose cited pages were recognised from the page image
    (`engine.documents.ocr.recognised_note`: "page 3 is recognised text (OCR): check the wording
    against the page image"), '' when none was. `recognised_pages`: the open document's
    `Document.recognised_pages`; a library answer's sources in other documents are not counted."""
    note = recognised_note(recognised_pages, [s.page for s in message.sources if not s.document])
    return f"<span style='color:{CAUTION_COLOR}'>⚠ {escape(note)}</span>" if note else ""


def footer_text(message: MessageRecord, shown: dict[str, str] | None = None) -> str:
    """'answered here by SmolLM2 · first words after 0.30 s · 3.2 tokens/s · saved reading reused ·
    12 tokens · read page 3 (matching words) · recall 1,024 tokens in 12 ms', in plain words (cloud:
    model, endpoint, why); a cancelled answer that had no word yet says so (`CANCELLED_EARLY`), not
    "first words after 0.00 s"; a low-confidence local answer says so (`LOW_CONFIDENCE`, to be
    checked against the page, passage or file: `checked_unit`). The names it states that its
    document does not contain are marked on their sentences (`evidence_lines`)."""
    parts: list[str] = []
    if message.source == "cloud":
        parts.append(f"answered by the cloud: model {message.model or '?'} at {message.endpoint or '?'}")
        if message.reason:
            parts.append(f"why: {message.reason}")
    else:
        parts.append("answered here" + (f" by {message.model}" if message.model else ""))
    if message.ttft_s is not None and not _no_words(message):  # else 0.00 s: no word came
        parts.append(f"first words after {message.ttft_s:.2f} s")
    if message.tokens_per_s is not None:
        parts.append(f"{message.tokens_per_s:.1f} tokens/s")
    if message.source != "cloud" and message.prefix_hit is not None:
        parts.append("saved reading of the document reused" if message.prefix_hit else "document read for this answer")
    if message.tokens is not None:
        parts.append(f"{message.tokens} tokens")
    if message.source != "cloud" and recall_text(message, shown):
        parts.append(recall_text(message, shown))
    if message.source != "cloud" and message.low_confidence:
        parts.append(f"{LOW_CONFIDENCE}, check them against {checked_unit(message)}")
    if message.instructions:  # local or cloud: the document spoke to the model
        parts.append("check this answer: " + instructions_note(message.instructions, checked_unit(message)))
    if _no_words(message):
        parts.append(CANCELLED_EARLY)
    elif message.state == "cancelled" or message.stop_reason == StopReason.CANCELLED:
        parts.append("cancelled")
    elif message.state == "interrupted":
        parts.append("interrupted (the app was closed)")
    elif message.stop_reason == StopReason.MAX_TOKENS:
        parts.append("cut at the answer length limit")
    elif message.stop_reason == StopReason.CUT:
        parts.append("incomplete: the stream broke off")
    elif message.state == "error":
        parts.append("failed")
    return " · ".join(parts)


class ChatView(QTextBrowser):
    """Read-only conversation. Streaming: `begin_answer()`, `append_text(piece)`..., `finish_answer(msg)`."""

    citation_clicked = Signal(str, object)   # label, the answer's message id (None while it streams)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        self.document().setDocumentMargin(14)
        self.labels: set[str] | None = None      # citation labels of the open document
        self.recognised_pages: list[int] = []    # its pages read by OCR (`Document.recognised_pages`)
        self.shown: dict[str, str] = {}          # label -> its printed name, where they differ (`Document.shown_labels`)
        self.live_text = ""
        self._live_from: int | None = None
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_EVERY_MS)
        self._render_timer.timeout.connect(self._render_live)
        self.renders = 0
        self._last_question = ""  # the question the next answer's evidence caution compares with

    # -------------------------------------------------------------- history
    def show_messages(self, messages: list[MessageRecord]) -> None:
        self._render_timer.stop()
        self._live_from = None
        self.clear()
        for message in messages:
            if message.role == "user":
                self.add_question(message.text, scroll=False)
            else:
                self._header("Halaman · cloud" if message.source == "cloud" else "Halaman", "#6B3FA0")
                self._markdown(message.text or "_(no answer)_", message.id)
                self._footer(message)
        self._scroll_to_end()

    def add_question(self, text: str, *, scroll: bool = True) -> None:
        self._last_question = text
        self._header("You", "#2F5D8A")
        cursor = self._end_cursor()
        fmt = QTextCharFormat()
        cursor.insertText(text, fmt)
        self._new_block(cursor)
        if scroll:
            self._scroll_to_end()

    # ------------------------------------------------------------ streaming
    def begin_answer(self, title: str = "Halaman") -> None:
        self._header(title, "#6B3FA0")
        self.live_text = ""
        self._live_from = self._end_cursor().position()
        self._render_live()

    def append_text(self, piece: str) -> None:
        self.live_text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def finish_answer(self, message: MessageRecord) -> None:
        self._render_timer.stop()
        self.live_text = message.text
        self._render_live(final=True, message_id=message.id)
        self._live_from = None
        self._footer(message)
        self._scroll_to_end()

    def drop_answer(self) -> None:
        """Stop showing the answer being streamed (the view moves to another document); its record
        is still saved by whoever streams it."""
        self._render_timer.stop()
        self._live_from = None
        self.live_text = ""

    @property
    def streaming(self) -> bool:
        return self._live_from is not None

    def _render_live(self, final: bool = False, message_id: int | None = None) -> None:
        if self._live_from is None:
            return
        cursor = self._end_cursor()
        cursor.setPosition(self._live_from, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        text = self.live_text if self.live_text or final else "…"
        self._markdown(text if final or not self.live_text else self.live_text + " ▍", message_id)
        self.renders += 1
        self._scroll_to_end()

    # -------------------------------------------------------------- pieces
    def _header(self, who: str, color: str) -> None:
        cursor = self._end_cursor()
        if not self.document().isEmpty():
            self._new_block(cursor)
        block = QTextBlockFormat()
        block.setTopMargin(10)
        cursor.setBlockFormat(block)
        fmt = QTextCharFormat()
        fmt.setFontWeight(700)
        fmt.setForeground(QColor(color))
        cursor.insertText(who, fmt)
        self._new_block(cursor)

    def _markdown(self, text: str, message_id: int | None = None) -> None:
        cursor = self._end_cursor()
        start = cursor.position()
        cursor.insertMarkdown(link_citations(headings_as_text(images_as_text(text)), message_id), MARKDOWN)
        self._unlink(start, self._end_cursor().position())
        block = self.document().findBlock(start)
        code_format = None
        while block.isValid():
            if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
                code_format = code_format or _code_block_format()
                c = QTextCursor(block)
                c.mergeBlockFormat(code_format)
            block = block.next()
        self._new_block(self._end_cursor())

    def _unlink(self, start: int, end: int) -> None:
        """Every link between positions `start` and `end` that is not a citation becomes plain text,
        its address written after its words when they differ: a model-made URL may point anywhere,
        and a link's words may hide where it points."""
        links = []
        block = self.document().findBlock(start)
        while block.isValid() and block.position() < end:
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                fmt = fragment.charFormat()
                if fmt.isAnchor() and not fmt.anchorHref().startswith("cite:"):
                    at, href = fragment.position(), fmt.anchorHref()
                    if links and links[-1][2] == href and links[-1][0] + links[-1][1] == at:  # **bold** in a link
                        first, length, _, words = links.pop()
                        links.append((first, length + fragment.length(), href, words + fragment.text()))
                    else:
                        links.append((at, fragment.length(), href, fragment.text()))
                it += 1
            block = block.next()
        for position, length, href, words in reversed(links):  # from the end: earlier positions stay valid
            cursor = QTextCursor(self.document())
            cursor.setPosition(position)
            cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
            plain = QTextCharFormat()
            plain.setAnchor(False)
            plain.setAnchorHref("")
            plain.setAnchorNames([])
            plain.setForeground(self.palette().text())
            plain.setFontUnderline(False)
            plain.setToolTip("")  # a link's title: the model's words, not the window's
            cursor.mergeCharFormat(plain)  # keeps a bold or code part of the words
            if href and words.strip() != href and words.strip() != href.removeprefix("mailto:"):
                cursor.clearSelection()
                cursor.insertText(f" ({href})", plain)

    def _footer(self, message: MessageRecord) -> None:
        cursor = self._end_cursor()
        block = QTextBlockFormat()
        block.setTopMargin(4)
        cursor.setBlockFormat(block)
        # A document not open (its history shown) has no labels here: its answer's sources kept theirs.
        shown = {**{s.label: s.shown for s in message.sources if s.shown and not s.document}, **self.shown}
        evidence = evidence_lines(message, self._last_question, shown)
        if evidence:
            cursor.insertHtml("<br>".join(evidence))
            cursor.insertBlock()
        lines = [line for line in (sources_line(message.text, self.labels, message.id, message.read_labels, shown),
                                   attended_line(message.sources, message.id, shown)) if line]
        recognised = recognised_line(message, self.recognised_pages)
        if recognised:
            lines.append(recognised)
        lines.append(escape(footer_text(message, shown)))
        cursor.insertHtml("<span style='color:#777; font-size:small'>" + "<br>".join(lines) + "</span>")
        self._new_block(cursor)

    def _new_block(self, cursor: QTextCursor) -> None:
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def loadResource(self, kind: int, url: QUrl) -> QImage:
        """Nothing, for every image or style sheet the text names. An empty answer would make Qt
        read the file itself."""
        return QImage()

    def viewportEvent(self, event) -> bool:
        """Tooltips of the text under the mouse (the 'title' of a Cited / Attended label): a
        QTextBrowser keeps them in the character format but does not show them by itself."""
        if event.type() == QEvent.Type.ToolTip:
            tip = self.tooltip_at(event.pos())
            if tip:  # a citation link's title may be the model's: shown as its characters, never as HTML
                QToolTip.showText(event.globalPos(), literal_rich_text(tip), self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def tooltip_at(self, pos) -> str:
        """The tooltip of the character at viewport position `pos` ('' when none)."""
        cursor = self.cursorForPosition(pos)
        tip = cursor.charFormat().toolTip()
        if not tip:  # the format left of the cursor; try the character to its right too
            cursor.movePosition(QTextCursor.MoveOperation.NextCharacter)
            tip = cursor.charFormat().toolTip()
        return tip

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == "cite":
            label, _, answer = url.toString()[len("cite:"):].partition("#")  # a "#" in a label is quoted
            self.citation_clicked.emit(unquote(label), int(answer) if answer.isdigit() else None)
        # Any other link is ignored: `_markdown` leaves none, and an answer must never make the app
        # fetch or open anything.


def _code_block_format() -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setBackground(QColor("#F3F1F7"))
    fmt.setLeftMargin(6)
    fmt.setRightMargin(6)
    return fmt


__all__ = ["ChatView", "cite_href", "headings_as_text", "images_as_text", "link_citations", "sources_line", "attended_line", "recall_text",
           "read_spans", "footer_text", "recognised_line", "evidence_lines", "checked_unit",
           "LOW_CONFIDENCE", "CANCELLED_EARLY"]
