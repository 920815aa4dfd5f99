"""A conversation about one document as Markdown, for `halaman history export PATH` and the window's
File › Export: each question and answer, and every citation written as "[document, page N]" (or
"[document, src/app.py]"; "[notes.md]" for a document that is one text file), followed by the
sentences the answer attended there, quoted, so that the file says where to check each answer
without Halaman. A citation the document does not have is written as such, never as a page
reference.
"""

from __future__ import annotations

import re
import time

from engine.citations import CITATION, CODE, cited_labels, looks_like_citation
from engine.documents import Document
from engine.evidence_quotes import quote_text
from engine.grounding import checked_unit, instructions_note, unsupported_note
from engine.library import DocumentRecord, MessageRecord

QUOTE_CHARACTERS = 300
"""An attended passage is quoted up to this many characters (a whole line of a minified file is not)."""


def unbracketed(text: str) -> str:
    """`text` with its square brackets made round: one inside a reference would end it early."""
    return text.replace("[", "(").replace("]", ")")


def reference(title: str, label: str) -> str:
    """'[title, page 2]': how the export names a page or file of a document. A single text file's one
    segment is labelled with the file's name, which is the title too: it is named once, '[notes.md]'."""
    return f"[{title}]" if unbracketed(label) == title else f"[{title}, {label}]"


def resolve(label: str, labels: set[str] | None) -> list[str] | None:
    """The page or file labels a citation names (`engine.citations.cited_labels`), or None when one
    of them is not in `labels` (None: the document's labels are unknown, every citation stands)."""
    named = cited_labels(label)
    return named if labels is None or all(name in labels for name in named) else None


UNREAD_CITATION = "not among the pages the answer read"


def cite(text: str, title: str, labels: set[str] | None, read: set[str] | None = None,
         shown: dict[str, str] | None = None) -> str:
    """`text` (an answer, Markdown) with each citation outside code written as `reference`s (a page
    named as printed where `shown` maps its label: `Document.shown_labels`), each
    one the document does not have as '(cites “x”, which is not in the document)', and each page or
    file the answer did not read (not in `read`; None: unknown, nothing marked) followed by
    '(not among the pages the answer read)': the model wrote it without having read it."""
    def write(match: re.Match) -> str:
        label = match.group(1).strip()
        if not looks_like_citation(label):
            return match.group(0)
        named = resolve(label, labels)
        if named is None:
            return f"(cites “{label}”, which is not in the document)"
        unread = read is not None and any(name not in read for name in named)
        names = [(shown or {}).get(name, name) for name in named]
        return ", ".join(reference(title, name) for name in names) + (f" ({UNREAD_CITATION})" if unread else "")

    return "".join(part if part.startswith("`") else CITATION.sub(write, part) for part in CODE.split(text))


def quote(text: str) -> str:
    """A passage as one quoted line: white space collapsed, cut at QUOTE_CHARACTERS (`quote_text`)."""
    return quote_text(text, QUOTE_CHARACTERS)


def answered_by(message: MessageRecord) -> str:
    """'answered here by SmolLM2' / 'answered by the cloud (gpt-x)', and the answer's state when it
    did not finish, and whether the model was unsure of its words."""
    who = (f"answered by the cloud ({message.model or 'unknown model'})" if message.source == "cloud"
           else "answered here" + (f" by {message.model}" if message.model else ""))
    if message.state in ("cancelled", "interrupted", "error"):
        who += f", {message.state}"
    unit = checked_unit([*message.sources, *message.passages])
    if message.low_confidence:
        who += f"; low confidence: the model was unsure of its words, check them against {unit}"
    if message.source != "cloud" and message.unsupported:
        who += "; check this answer: " + unsupported_note(message.unsupported)
    if message.instructions:
        who += "; check this answer: " + instructions_note(message.instructions, unit)
    return who


def conversation_markdown(record: DocumentRecord, messages: list[MessageRecord], document: Document | None, *,
                          exported_s: float | None = None) -> str:
    """The conversation `messages` about `record` as Markdown (see the module docstring).

    document: the document's text as Halaman reads it now (its pages or files, for checking the
    citations and quoting the attended passages); None when it cannot be read any more: the
    citations are then written unchecked and nothing is quoted, which the file says."""
    labels = {segment.label for segment in document.segments} if document is not None else None
    shown = document.shown_labels() if document is not None else {}  # pages as printed: "page 48 (PDF page 68)"
    title = unbracketed(record.title)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() if exported_s is None else exported_s))
    lines = [f"# {title}", "", f"`{record.path}` · {record.size_text} · exported from Halaman on {when}", ""]
    if document is None:
        lines += ["_The document could not be read now: its citations are not checked and nothing is quoted._", ""]
    for message in messages:
        if message.role == "user":  # a rule before each question: one exchange per part
            lines += ["---", "", f"**Question:** {message.text}", ""]
            continue
        answer = cite(message.text or "_(no answer)_", title, labels, message.read_labels, shown)
        if sum(line.lstrip().startswith("```") for line in answer.splitlines()) % 2:
            answer += "\n```"  # an answer cut inside a code block: closed, or the rest of the file is code
        lines += [f"**Answer** ({answered_by(message)}):", "", answer, ""]
        # A library answer also holds passages of the other documents it read: only this one's are quoted.
        attended = [p for p in message.passages if document is not None and 0 <= p.segment_index < len(document.segments)
                    and document.segments[p.segment_index].label == p.label
                    and p.document_source in (None, document.source)]
        if attended:
            lines.append("Where its attention went:")
            lines.append("")
            for passage in attended:
                lines.append(f"> “{quote(passage.text(document))}” — {reference(title, shown.get(passage.label, passage.label))} "
                             f"({passage.share * 100:.0f} %)")
                lines.append(">")
            lines[-1] = ""
    return "\n".join(lines).rstrip() + "\n"
